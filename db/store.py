"""The Store: every read and write of the studio's persistent state.

- One SQLite database (``<data_dir>/studio.db``, WAL mode) reached through one Engine; each public method
  runs in its own transaction, so a failure part-way leaves nothing behind.
- Clips are content-addressed files (``<data_dir>/clips/ab/<sha256>.mp4`` with ``<sha256>.json`` beside it),
  written atomically *before* the row that points at them is committed: a committed row always has its file.
- Methods take and return plain data (dicts, bytes, frozen records); no ORM object or session escapes.
- Knows nothing of the engine or the UI.

Clips, video jobs and pairs live here; verdicts, the approval rule and configurations in db/verdicts.py
(ReviewStore, a base class of Store); blind reviews and campaigns in db/blind.py and db/campaigns.py.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Select, func, or_, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from db import convert, highwater
from db import validate as check
from db.database import (
    BEGIN_MODE_OPTION,
    connect,
    data_dir_writable,
    is_io_error,
    is_read_only_error,
    make_engine,
    upgrade,
)
from db.errors import (
    ClipIntegrityError,
    ClipMissing,
    Conflict,
    DataDirIOError,
    DataDirReadOnly,
    NotFound,
    StorageFull,
    StoreError,
)
from db.files import atomic_write_bytes, check_sha, clip_relpath, sidecar_relpath, trajectory_relpath
from db.keys import canonical_json, configuration_key, new_id, normalise_duration, sha256_hex, utc_now, with_tier_name
from db.lookup import row_by_id
from db.models import ClipRow, Configuration, Pair, VideoJob
from db.records import (
    PAIR_STATUSES,
    RESTART_ERROR,
    TERMINAL_STATUSES,
    VIDEO_STATUSES,
    ApprovalRule,
    ClipRecord,
    PairRecord,
    VideoRecord,
)
from db.startup import DataDirLock, check_database
from db.verdicts import ReviewStore

T = TypeVar("T")

DB_FILENAME = "studio.db"
LOCK_RETRIES = 8  # on top of busy_timeout; only reached under pathological contention
MAX_LIST_LIMIT = 1000
DURATION_TOLERANCE_S = 1e-6  # durations are derived from frame counts; float noise must not defeat reuse
UNFINISHED = ("queued", "in_progress")
MIN_FREE_BYTES = 64 * 1024 * 1024  # new jobs need room for their clips (a real 15 s clip is tens of MB)


class _Unset:
    """Marks an update argument that was not passed (None is a real value: it clears a field)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


def _is_lock_error(exc: OperationalError) -> bool:
    """SQLite reports contention as 'database is locked' (or 'busy')."""
    message = str(exc.orig).lower()
    return "database is locked" in message or "database is busy" in message


def _is_full_error(exc: OperationalError) -> bool:
    """SQLite reports a full disk (or a reached max_page_count) as 'database or disk is full'."""
    return "disk is full" in str(exc.orig).lower()


# ------------------------------------------------------------------------------------------------ store


class Store(ReviewStore):
    """Persistent state of the studio under one data directory. Thread-safe: share one per process."""

    def __init__(self, data_dir: Path, approval_rule: ApprovalRule | None = None, *, recover: bool = True) -> None:
        """Open (creating if needed) the store in ``data_dir`` and migrate its database to the latest schema.

        With ``recover`` (the default, for the serving process) jobs and pairs a crash left queued or in
        progress are marked failed, except jobs a remote server had accepted: those go back to "queued" and
        are listed in ``resumable_videos`` (with the unfinished pairs that wait only for them) for the service
        to resume or to fail. Pass ``recover=False`` for a second, read-mostly process (a CLI) that must not
        fail the server's live jobs.
        """
        self.data_dir = Path(data_dir)
        (self.data_dir / "clips").mkdir(parents=True, exist_ok=True)
        self.db_path = self.data_dir / DB_FILENAME
        # The serving process owns the data dir (recovery would fail another server's live jobs).
        self._lock = DataDirLock(self.data_dir) if recover else None
        try:
            check_database(self.db_path, self.data_dir / "clips")
            self.default_approval_rule = approval_rule or ApprovalRule()  # applies until an admin sets one
            self._engine = make_engine(self.db_path)
            upgrade(self._engine)
            # Held open (idle) while the store is: the WAL index lives in this process's memory (db.database.VFS)
            # and goes when the database's last connection closes; if the pool replaced all of its connections
            # while the data dir is read-only, a new one could not rebuild it and even reads would fail.
            self._anchor = connect(self.db_path)
            self._sessions = sessionmaker(self._engine, expire_on_commit=False)
            # Rows committed before that this database no longer holds (a lost WAL): refuse (db/highwater.py).
            self._rows = self._read(highwater.measure)
            highwater.check(self.db_path, self._rows, highwater.recorded(self.db_path))
            highwater.record(self.db_path, self._rows)
            self.recovered_video_ids: list[str] = []
            self.resumable_videos: list[VideoRecord] = []
            if recover:
                self.recovered_video_ids, self.resumable_videos = self._recover_unfinished()
        except BaseException:
            if getattr(self, "_engine", None) is not None:
                self._engine.dispose()  # no connection of a refused database stays open in this process
            if getattr(self, "_anchor", None) is not None:
                self._anchor.close()
            if self._lock is not None:
                self._lock.release()
            raise

    def close(self) -> None:
        """Release pooled connections and the data dir's lock (the store must not be used afterwards)."""
        self._engine.dispose()
        self._anchor.close()
        if self._lock is not None:
            self._lock.release()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------ transactions

    def _run(self, work: Callable[[Session], T], *, write: bool) -> T:
        """Run ``work`` in one transaction: commit if it returns, roll back if it raises.

        Writes start with BEGIN IMMEDIATE (see db.database). busy_timeout already makes a writer wait for
        the lock; the retry loop is a backstop for the rare SQLITE_BUSY that SQLite returns without waiting.
        """
        options = {BEGIN_MODE_OPTION: "IMMEDIATE"} if write else {}
        reopened = False
        for attempt in range(LOCK_RETRIES):
            try:
                with self._sessions() as session:
                    session.connection(execution_options=options)
                    result = work(session)
                    rows = highwater.measure(session) if write else None
                    session.commit()
                if rows is not None and rows != self._rows:
                    self._rows = rows
                    highwater.record(self.db_path, rows)
                return result
            except OperationalError as exc:
                if _is_full_error(exc):  # SQLITE_FULL: the transaction was rolled back
                    raise StorageFull(StorageFull.MESSAGE) from exc
                if is_read_only_error(exc, self.data_dir) or is_io_error(exc):  # nothing was written
                    # A connection opened while the files were read-only stays read-only, one that met an I/O
                    # error may be left in a bad state: drop the idle ones (the anchor keeps the WAL index) and,
                    # when the data dir is writable again, try once more.
                    self._engine.dispose()
                    if reopened or not data_dir_writable(self.data_dir):
                        unwritable = DataDirReadOnly if is_read_only_error(exc, self.data_dir) else DataDirIOError
                        raise unwritable(unwritable.MESSAGE) from exc
                    reopened = True
                    continue
                if not _is_lock_error(exc) or attempt == LOCK_RETRIES - 1:
                    raise
                time.sleep(min(2.0, 0.05 * 2**attempt) * (0.5 + random.random()))
        raise AssertionError("unreachable")  # the loop returns or raises

    def _write(self, work: Callable[[Session], T]) -> T:
        """A write transaction."""
        return self._run(work, write=True)

    def _read(self, work: Callable[[Session], T]) -> T:
        """A read-only transaction (a consistent snapshot; never blocks writers in WAL mode)."""
        return self._run(work, write=False)

    def _require_space(self) -> None:
        """StorageFull before new work is accepted on a nearly full disk: its clips could not be stored, and a
        submission that ran out of space between its rows would leave a pair without its jobs."""
        if shutil.disk_usage(self.data_dir).free < MIN_FREE_BYTES:
            raise StorageFull(StorageFull.MESSAGE)

    def _recover_unfinished(self) -> tuple[list[str], list[VideoRecord]]:
        """After a crash: fail the unfinished jobs, except those a remote server had accepted (back to
        "queued", returned for resuming); fail the unfinished pairs that wait for a failed job.
        Returns (every unfinished video id, the resumable video records)."""

        def work(session: Session) -> tuple[list[str], list[VideoRecord]]:
            rows = list(session.scalars(select(VideoJob).where(VideoJob.status.in_(UNFINISHED))))
            now = utc_now()
            resumable = [row for row in rows if row.remote_json]
            for row in rows:
                if row.remote_json:
                    row.status = "queued"
                else:
                    row.status, row.error, row.completed_at = "failed", RESTART_ERROR, now
            waiting_ok = {row.id for row in resumable}
            for pair in session.scalars(select(Pair).where(Pair.status.in_(UNFINISHED))):
                videos = {pair.baseline_video_id, pair.candidate_video_id}
                pending = {v for v in videos if v and self._video_row(session, v).status != "completed"}
                if not pending <= waiting_ok or None in videos:
                    pair.status, pair.error, pair.updated_at = "failed", RESTART_ERROR, now
            session.flush()
            return [row.id for row in rows], [convert.video_record(row) for row in resumable]

        return self._write(work)

    def set_video_remote(self, video_id: str, server: str, remote_video_id: str) -> VideoRecord:
        """Remember the remote server's job for a video (called when the server accepts it)."""
        handle = {"server": check.text(server, "server"), "video_id": check.text(remote_video_id, "video_id"),
                  "accepted_at": utc_now().isoformat() + "Z"}

        def work(session: Session) -> VideoRecord:
            row = self._video_row(session, video_id)
            row.remote_json = json.dumps(handle)
            session.flush()
            return convert.video_record(row)

        return self._write(work)

    # ------------------------------------------------------------------------------------------- clips

    def put_clip(self, mp4_bytes: bytes, sidecar: dict[str, Any]) -> ClipRecord:
        """Store an MP4 and its sidecar under the MP4's sha256; return its record.

        Idempotent: storing the same bytes again returns the existing record and keeps the first sidecar
        (same bytes are the same clip; a re-run's different timings do not make it a new one). If the
        file of a stored clip has gone missing, it is rewritten.
        Sidecar keys: see :func:`convert.clip_columns`.
        """
        if not isinstance(mp4_bytes, (bytes, bytearray, memoryview)) or len(mp4_bytes) == 0:
            raise StoreError("mp4_bytes", "must be non-empty bytes")
        data = bytes(mp4_bytes)
        columns = convert.clip_columns(sidecar)
        sha = sha256_hex(data)
        existing = self._read(lambda s: s.get(ClipRow, sha))
        if existing is not None and (self.data_dir / existing.path).is_file():
            return convert.clip_record(existing, self.data_dir)
        # Files first, row second: a committed row must never point at a missing file. A crash in between
        # leaves an orphan file that the next put of the same bytes simply overwrites; a row whose file
        # was lost gets its file back here.
        atomic_write_bytes(self.data_dir / clip_relpath(sha), data)
        sidecar_text = json.dumps(sidecar, indent=2, sort_keys=True, ensure_ascii=False)
        atomic_write_bytes(self.data_dir / sidecar_relpath(sha), sidecar_text.encode("utf-8"))
        return self._write(lambda s: self._insert_clip(s, sha, len(data), columns, sidecar))

    def _insert_clip(
        self, session: Session, sha: str, size: int, columns: dict[str, Any], sidecar: dict[str, Any]
    ) -> ClipRecord:
        """Insert the clip row unless a concurrent put got there first (checked under the write lock)."""
        row = session.get(ClipRow, sha)
        if row is None:
            row = ClipRow(
                sha256=sha,
                path=clip_relpath(sha).as_posix(),
                size_bytes=size,
                sidecar_json=canonical_json(sidecar, "sidecar"),
                created_at=utc_now(),
                **columns,
            )
            session.add(row)
            session.flush()
        return convert.clip_record(row, self.data_dir)

    def get_clip(self, sha: str) -> ClipRecord:
        """The clip with this sha256; NotFound if it was never stored."""
        check_sha(sha)
        row = self._read(lambda s: s.get(ClipRow, sha))
        if row is None:
            raise NotFound("sha256", f"no clip {sha}")
        return convert.clip_record(row, self.data_dir)

    def clip_path(self, sha: str) -> Path:
        """Absolute path of a stored clip's MP4; NotFound if it was never stored."""
        return self.get_clip(sha).path

    def verified_clip_path(self, sha: str) -> Path:
        """The stored clip's MP4 after checking that it is on disk and still hashes to ``sha``.

        ClipMissing when the file is gone, ClipIntegrityError when its bytes changed; messages name the clip by
        its place in the data dir, never by an absolute server path.
        """
        path = self.clip_path(sha)
        where = clip_relpath(sha).as_posix()
        try:
            with path.open("rb") as handle:
                digest = hashlib.file_digest(handle, "sha256").hexdigest()
        except FileNotFoundError:
            raise ClipMissing(f"the file of clip {sha[:12]} ({where}) is missing from the data dir; restore it "
                              "from a backup (its bytes must hash to its sha256)") from None
        except (IsADirectoryError, PermissionError) as error:  # was a 500 (issue 42 item 5)
            raise ClipMissing(f"the file of clip {sha[:12]} ({where}) cannot be read ({type(error).__name__}: "
                              "a directory or an unreadable file stands in its place); restore it from a backup") \
                from None
        if digest != sha:
            raise ClipIntegrityError(f"the file of clip {sha[:12]} ({where}) no longer matches its sha256 (it "
                                     "changed on disk); it is not served or compared until restored")
        return path

    def put_trajectory(self, sha: str, data: bytes) -> int:
        """Store the recorded denoising trajectory of the run that made clip ``sha`` (an npz, engine/trajectory.py)
        beside the clip's MP4, atomically; returns its size in bytes. Same request, same seed, same clip: a
        trajectory already stored for the clip is replaced by the newer run's."""
        check_sha(sha)
        if not isinstance(data, (bytes, bytearray)) or not data:
            raise StoreError("trajectory", "must be non-empty bytes")
        atomic_write_bytes(self.data_dir / trajectory_relpath(sha), bytes(data))
        return len(data)

    def trajectory_size(self, sha: str | None) -> int | None:
        """The stored trajectory's size in bytes, None when clip ``sha`` has none."""
        if not sha:
            return None
        try:
            return (self.data_dir / trajectory_relpath(check_sha(sha))).stat().st_size
        except OSError:
            return None

    def read_trajectory(self, sha: str) -> bytes:
        """The stored trajectory of clip ``sha``; NotFound naming the file's place in the data dir when missing."""
        where = trajectory_relpath(check_sha(sha))
        try:
            return (self.data_dir / where).read_bytes()
        except FileNotFoundError:
            raise NotFound("trajectory", f"no recorded trajectory for clip {sha[:12]} ({where.as_posix()} is not in "
                                         "the data dir)") from None

    def find_clip(
        self,
        model_id: str,
        prompt: str,
        seed: int,
        width: int | None,
        height: int | None,
        duration_seconds: float,
        tier_config_hash: str,
        aspect_ratio: str | None = None,
        short_edge: int | None = None,
    ) -> ClipRecord | None:
        """The newest stored clip made with exactly these inputs, or None (used to reuse a baseline).

        ``duration_seconds`` may be the clip's actual duration or the requested (target) one: both
        determine the frame count, so either identifies the same generation. Without a canvas (width and
        height None: a remote server's clip, whose canvas only its MP4 tells), the requested ``aspect_ratio``
        and ``short_edge`` recorded in the clip's sidecar identify it instead.
        Clips whose file has gone missing from disk are skipped rather than returned.
        """
        duration = normalise_duration(duration_seconds)
        low, high = duration - DURATION_TOLERANCE_S, duration + DURATION_TOLERANCE_S
        canvas = [ClipRow.width == width, ClipRow.height == height] if width is not None else []
        query = (
            select(ClipRow)
            .where(
                ClipRow.model_id == model_id,
                ClipRow.prompt == prompt,
                ClipRow.seed == seed,
                *canvas,
                ClipRow.tier_config_hash == tier_config_hash,
                or_(
                    ClipRow.duration_seconds.between(low, high),
                    ClipRow.requested_duration.between(low, high),
                ),
            )
            .order_by(ClipRow.created_at.desc())
        )
        rows = self._read(lambda s: list(s.scalars(query)))
        records = (convert.clip_record(r, self.data_dir) for r in rows)
        if width is None:
            if aspect_ratio is None or short_edge is None:
                raise StoreError("width", "without width and height, aspect_ratio and short_edge are required")
            records = (rec for rec in records if (rec.sidecar.get("aspect_ratio"), rec.sidecar.get("short_edge"))
                       == (aspect_ratio, short_edge))
        return next((rec for rec in records if rec.path.is_file()), None)

    # -------------------------------------------------------------------------------------- video jobs

    def create_video(self, request: dict[str, Any], tier: str, model: str = "") -> VideoRecord:
        """Record a new /v1/videos job (status "queued", progress 0) for an already-validated request."""
        request_json = canonical_json(check.json_dict(request, "request"), "request")
        tier = check.text(tier, "tier")
        model = check.text(model, "model", allow_empty=True)
        self._require_space()

        def work(session: Session) -> VideoRecord:
            row = VideoJob(
                id=new_id("video"),
                status="queued",
                progress=0,
                tier=tier,
                model=model,
                request_json=request_json,
                created_at=utc_now(),
            )
            session.add(row)
            session.flush()
            return convert.video_record(row)

        return self._write(work)

    def update_video(
        self,
        video_id: str,
        *,
        status: str = UNSET,
        progress: int = UNSET,
        clip_sha: str | None = UNSET,
        error: str | None = UNSET,
        inference_time_s: float | None = UNSET,
        peak_memory_mb: float | None = UNSET,
        completed_at: datetime | None = UNSET,
        model: str = UNSET,
    ) -> VideoRecord:
        """Change the given fields of a job (omitted ones stay; None clears an optional field).

        Rules: completed/failed are final (the status cannot move away from them); "completed" needs a
        stored clip and sets progress to 100; reaching a final status stamps completed_at if not given.
        """
        changes = self._video_changes(status, progress, clip_sha, error, inference_time_s, peak_memory_mb,
                                      completed_at, model)

        def work(session: Session) -> VideoRecord:
            row = self._video_row(session, video_id)
            self._check_video_transition(session, row, changes)
            for name, value in changes.items():
                setattr(row, name, value)
            if row.status in TERMINAL_STATUSES and row.completed_at is None:
                row.completed_at = utc_now()
            session.flush()
            return convert.video_record(row)

        return self._write(work)

    @staticmethod
    def _video_changes(
        status: Any, progress: Any, clip_sha: Any, error: Any, inference_time_s: Any, peak_memory_mb: Any,
        completed_at: Any, model: Any,
    ) -> dict[str, Any]:
        """Validate the passed update arguments; return column → new value."""
        validators: dict[str, Callable[[Any], Any]] = {
            "status": lambda v: check.one_of(v, "status", VIDEO_STATUSES),
            "progress": lambda v: check.integer(v, "progress", minimum=0, maximum=100),
            "clip_sha": lambda v: None if v is None else check_sha(v, "clip_sha"),
            "error": lambda v: None if v is None else check.text(v, "error", max_chars=10_000, allow_empty=True),
            "inference_time_s": lambda v: check.number(v, "inference_time_s", allow_none=True),
            "peak_memory_mb": lambda v: check.number(v, "peak_memory_mb", allow_none=True),
            "completed_at": lambda v: check.utc_naive(v, "completed_at"),
            "model": lambda v: check.text(v, "model", allow_empty=True),
        }
        given = dict(status=status, progress=progress, clip_sha=clip_sha, error=error,
                     inference_time_s=inference_time_s, peak_memory_mb=peak_memory_mb,
                     completed_at=completed_at, model=model)
        changes = {name: validators[name](value) for name, value in given.items() if value is not UNSET}
        if changes.get("status") == "completed" and "progress" not in changes:
            changes["progress"] = 100
        return changes

    @staticmethod
    def _check_video_transition(session: Session, row: VideoJob, changes: dict[str, Any]) -> None:
        """Refuse updates that would break the job life cycle or point at a clip that is not stored."""
        new_status = changes.get("status", row.status)
        if row.status in TERMINAL_STATUSES and new_status != row.status:
            raise Conflict("status", f"job {row.id} is already {row.status}; final statuses cannot change")
        sha = changes.get("clip_sha", row.clip_sha)
        if "clip_sha" in changes and sha is not None and session.get(ClipRow, sha) is None:
            raise NotFound("clip_sha", f"no clip {sha}; store it with put_clip first")
        if new_status == "completed" and sha is None:
            raise StoreError("clip_sha", "a completed job needs its clip (pass clip_sha)")

    @staticmethod
    def _video_row(session: Session, video_id: str, field: str = "video_id") -> VideoJob:
        """Fetch a job row or raise NotFound(field)."""
        return row_by_id(session, VideoJob, video_id, field, "video")

    def get_video(self, video_id: str) -> VideoRecord:
        """The job with this id; NotFound otherwise."""
        return self._read(lambda s: convert.video_record(self._video_row(s, video_id)))

    def list_videos(self, after: str | None = None, limit: int = 20, order: str = "desc") -> list[VideoRecord]:
        """Jobs in creation order ("asc" oldest first, "desc" newest first), starting after job ``after``.

        To tell whether more exist, ask for ``limit + 1``.
        """
        check.one_of(order, "order", ("asc", "desc"))
        check.integer(limit, "limit", minimum=1, maximum=MAX_LIST_LIMIT)

        def work(session: Session) -> list[VideoRecord]:
            query: Select[tuple[VideoJob]] = select(VideoJob)
            if after is not None:
                cursor = self._video_row(session, after, field="after").seq
                query = query.where(VideoJob.seq > cursor if order == "asc" else VideoJob.seq < cursor)
            query = query.order_by(VideoJob.seq.asc() if order == "asc" else VideoJob.seq.desc()).limit(limit)
            return [convert.video_record(r) for r in session.scalars(query)]

        return self._read(work)

    def delete_video(self, video_id: str) -> VideoRecord:
        """Delete a job and return what it was. Its clip file stays (clips are shared, content-addressed).

        Refused (Conflict) for a job that belongs to a pair: verdicts and exports refer to it.
        """

        def work(session: Session) -> VideoRecord:
            row = self._video_row(session, video_id)
            owner = session.scalar(
                select(Pair.id).where((Pair.baseline_video_id == video_id) | (Pair.candidate_video_id == video_id))
            )
            if owner is not None:
                raise Conflict("video_id", f"video {video_id} belongs to pair {owner} and cannot be deleted")
            record = convert.video_record(row)
            session.delete(row)
            return record

        return self._write(work)

    # ------------------------------------------------------------------------------------------- pairs

    def create_pair(
        self,
        prompt: str,
        seed: int,
        tier_name: str,
        tier_config: dict[str, Any],
        target: dict[str, Any],
        model_id: str,
    ) -> PairRecord:
        """Create a queued pair and create/update its configuration (one transaction for both).

        The stored tier config is ``tier_config`` with ``"name": tier_name`` folded in; the configuration
        key is ``configuration_key(model_id, tier_config, target["duration_seconds"], tier_name=tier_name)``.
        """
        prompt = check.text(prompt, "prompt", max_chars=100_000)
        seed = check.integer(seed, "seed")
        tier_name = check.text(tier_name, "tier_name")
        model_id = check.text(model_id, "model_id")
        snapshot = with_tier_name(check.json_dict(tier_config, "tier_config"), tier_name)
        check.json_dict(target, "target")
        duration = normalise_duration(target.get("duration_seconds"), "target.duration_seconds")
        key = configuration_key(model_id, snapshot, duration)
        self._require_space()

        def work(session: Session) -> PairRecord:
            self._upsert_configuration(session, key, model_id, tier_name, snapshot, duration)
            row = self._insert_pair(session, key, prompt, seed, tier_name, snapshot, target, model_id)
            return convert.pair_records(session, [row])[0]

        return self._write(work)

    @staticmethod
    def _upsert_configuration(
        session: Session, key: str, model_id: str, tier_name: str, snapshot: dict[str, Any], duration: float
    ) -> None:
        """Create the configuration on its first pair; afterwards count pairs and bump updated_at."""
        now = utc_now()
        row = session.get(Configuration, key)
        if row is None:
            session.add(Configuration(
                key=key, model_id=model_id, tier_name=tier_name, tier_config_json=canonical_json(snapshot),
                duration_seconds=duration, pair_count=1, created_at=now, updated_at=now,
            ))
        else:
            row.pair_count += 1
            row.updated_at = now
        session.flush()

    @staticmethod
    def _insert_pair(
        session: Session, key: str, prompt: str, seed: int, tier_name: str, snapshot: dict[str, Any],
        target: dict[str, Any], model_id: str,
    ) -> Pair:
        """Insert the pair row (queued, no videos yet)."""
        now = utc_now()
        row = Pair(
            id=new_id("pair"), prompt=prompt, seed=seed, tier_name=tier_name,
            tier_config_json=canonical_json(snapshot), target_json=canonical_json(target), model_id=model_id,
            configuration_key=key, status="queued", created_at=now, updated_at=now,
        )
        session.add(row)
        session.flush()
        return row

    @staticmethod
    def _pair_row(session: Session, pair_id: str, field: str = "pair_id") -> Pair:
        """Fetch a pair row or raise NotFound(field)."""
        return row_by_id(session, Pair, pair_id, field, "pair")

    def existing_pair_ids(self, pair_ids: list[str]) -> set[str]:
        """Which of ``pair_ids`` name stored pairs (one query, in chunks below SQLite's variable limit)."""
        ids = list(dict.fromkeys(pair_ids))
        chunks = [ids[i:i + 500] for i in range(0, len(ids), 500)]
        return self._read(lambda s: {pid for chunk in chunks for pid in s.scalars(select(Pair.id).where(
            Pair.id.in_(chunk)))})

    def set_pair_videos(self, pair_id: str, baseline_video_id: str, candidate_video_id: str) -> PairRecord:
        """Attach the baseline and candidate jobs to a pair (a baseline job may serve several pairs)."""
        if baseline_video_id == candidate_video_id:
            raise StoreError("candidate_video_id", "must differ from baseline_video_id")

        def work(session: Session) -> PairRecord:
            row = self._pair_row(session, pair_id)
            if row.status in TERMINAL_STATUSES:
                # Verdicts and exports refer to the clips a finished pair was judged on.
                raise Conflict("pair_id", f"pair {pair_id} is {row.status}; its videos can no longer change")
            self._video_row(session, baseline_video_id, field="baseline_video_id")
            self._video_row(session, candidate_video_id, field="candidate_video_id")
            row.baseline_video_id = baseline_video_id
            row.candidate_video_id = candidate_video_id
            row.updated_at = utc_now()
            session.flush()
            return convert.pair_records(session, [row])[0]

        return self._write(work)

    def update_pair(
        self, pair_id: str, *, status: str = UNSET, metrics: dict[str, Any] | None = UNSET, error: str | None = UNSET
    ) -> PairRecord:
        """Change a pair's status, metrics (a JSON dict) or error; omitted fields stay.

        "completed" is allowed only once both videos are completed (so every completed pair has two clips);
        completed/failed are final, though metrics and error may still be updated.
        """
        changes: dict[str, Any] = {}
        if status is not UNSET:
            changes["status"] = check.one_of(status, "status", PAIR_STATUSES)
        if metrics is not UNSET:
            changes["metrics_json"] = None if metrics is None else canonical_json(check.json_dict(metrics, "metrics"))
        if error is not UNSET:
            changes["error"] = None if error is None else check.text(error, "error", max_chars=10_000, allow_empty=True)

        def work(session: Session) -> PairRecord:
            row = self._pair_row(session, pair_id)
            self._check_pair_transition(session, row, changes.get("status", row.status))
            for name, value in changes.items():
                setattr(row, name, value)
            row.updated_at = utc_now()
            session.flush()
            return convert.pair_records(session, [row])[0]

        return self._write(work)

    @staticmethod
    def _check_pair_transition(session: Session, row: Pair, new_status: str) -> None:
        """Final statuses stay final; completion needs two completed videos."""
        if row.status in TERMINAL_STATUSES and new_status != row.status:
            raise Conflict("status", f"pair {row.id} is already {row.status}; final statuses cannot change")
        if new_status == "completed" and row.status != "completed":
            ids = [row.baseline_video_id, row.candidate_video_id]
            done = session.scalar(
                select(func.count())
                .select_from(VideoJob)
                .where(VideoJob.id.in_([i for i in ids if i]), VideoJob.status == "completed")
            )
            if None in ids or done != 2:
                raise Conflict("status", f"pair {row.id} cannot complete before both of its videos have completed")

    def get_pair(self, pair_id: str) -> PairRecord:
        """The pair with this id; NotFound otherwise."""
        return self._read(lambda s: convert.pair_records(s, [self._pair_row(s, pair_id)])[0])

    def list_pairs(
        self, status: str | None = None, configuration_key: str | None = None, order: str = "desc",
        after: str | None = None, limit: int | None = None,
    ) -> list[PairRecord]:
        """Pairs, newest first by default, optionally filtered by status and configuration; a page of at most
        ``limit`` (None: all) starting after pair ``after``. To tell whether more exist, ask for ``limit + 1``."""
        check.one_of(order, "order", ("asc", "desc"))
        if limit is not None:
            check.integer(limit, "limit", minimum=1, maximum=MAX_LIST_LIMIT)
        query: Select[tuple[Pair]] = select(Pair)
        if status is not None:
            query = query.where(Pair.status == check.one_of(status, "status", PAIR_STATUSES))
        if configuration_key is not None:
            query = query.where(Pair.configuration_key == configuration_key)
        query = query.order_by(Pair.seq.asc() if order == "asc" else Pair.seq.desc()).limit(limit)

        def work(session: Session) -> list[PairRecord]:
            paged = query
            if after is not None:
                cursor = self._pair_row(session, after, field="after").seq
                paged = query.where(Pair.seq > cursor if order == "asc" else Pair.seq < cursor)
            return convert.pair_records(session, list(session.scalars(paged)))

        return self._read(work)

"""Export approved pairs as one zip: the MP4s, the conditioning inputs of fl2va/ref2va pairs, manifest.json,
SHA256SUMS and README.txt.

The zip is written to a temp file in ``out_dir``, fsynced, then renamed into place, so a reader never sees
a half-written export and a failure leaves no file behind. Clip bytes are re-hashed while they are copied:
an export never ships a clip whose bytes differ from the sha256 the manifest promises. Keyframes and reference
images travel as ``inputs/<sha256>.<ext>`` (once however many pairs use them), verified the same way.
"""

from __future__ import annotations

import hashlib
import json
import re
import textwrap
import zipfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from db.errors import ClipIntegrityError, ClipMissing, NotFound, StoreError
from db.files import atomic_writer, clip_relpath, read_only_reported
from db.inputs import EXTENSIONS, InputFiles
from db.keys import sha256_hex
from db.records import ClipRecord, PairRecord, VerdictRecord
from db.rule import ApprovalRule
from db.store import Store
from quality.summary import QualitySummary, SummaryError
from studio.public_text import hide_paths

FORMAT = "h3-review-studio-export"
FORMAT_VERSION = 1
CHUNK_BYTES = 1 << 20
SLUG_CHARS = 40
KEEP_EXPORTS = 10  # zips kept in out_dir (newest first); older ones are deleted after each export


@dataclass(frozen=True)
class _ClipEntry:
    """One clip as it goes into the zip."""

    role: str  # "baseline" or "candidate"
    arcname: str
    clip: ClipRecord
    video: dict[str, Any]


@dataclass(frozen=True)
class _PairEntry:
    """One pair with everything the manifest says about it."""

    pair: PairRecord
    verdicts: list[VerdictRecord]
    clips: tuple[_ClipEntry, _ClipEntry]


def export_pairs(store: Store, pair_ids: list[str] | None, out_dir: Path) -> Path:
    """Write a zip of the given approved pairs (all approved pairs if ``pair_ids`` is empty/None) into
    ``out_dir`` and return its path.

    Raises StoreError("pair_ids") if a pair is not approved (NotFound if unknown) or nothing is approved,
    and ClipIntegrityError if a clip file is missing or no longer matches its sha256.
    """
    pairs = _select_pairs(store, pair_ids)
    exported_at = datetime.now(UTC).replace(microsecond=0)
    entries = [_pair_entry(store, index, pair) for index, pair in enumerate(pairs, start=1)]
    manifest = _manifest(store, entries, exported_at)
    out_dir = Path(out_dir)
    with read_only_reported():
        out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / _zip_name(entries, exported_at)
    inputs = _input_files(store, entries)  # before the zip is opened: a missing input exports nothing
    with atomic_writer(path) as handle, zipfile.ZipFile(handle, "w") as archive:
        for entry in entries:
            for clip_entry in entry.clips:
                _copy_verified(archive, clip_entry, exported_at)
        for arcname, (source, sha) in inputs.items():
            _copy_input(archive, arcname, source, sha, exported_at)
        _write_text(archive, "manifest.json", json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", exported_at)
        _write_text(archive, "SHA256SUMS", _sha256sums(entries, inputs), exported_at)
        _write_text(archive, "README.txt", _readme(manifest, store.rule_class), exported_at)
    _prune(out_dir, keep=path)
    return path


def _prune(out_dir: Path, keep: Path) -> None:
    """Delete all but the KEEP_EXPORTS newest zips (``keep``, the one just written, always stays): every export
    is a fresh copy of its clips, so unpruned they fill the disk."""
    zips = sorted(out_dir.glob("h3-export-*.zip"), key=lambda z: z.stat().st_mtime_ns, reverse=True)
    for old in [z for z in zips if z != keep][KEEP_EXPORTS - 1:]:
        old.unlink(missing_ok=True)


# -------------------------------------------------------------------------------------------- selection


def _select_pairs(store: Store, pair_ids: list[str] | None) -> list[PairRecord]:
    """The pairs to export, in the order asked; refuse unknown or unapproved ids, naming them."""
    approved = store.approved_pairs()
    if not pair_ids:
        if not approved:
            raise StoreError("pair_ids", "there are no approved pairs to export")
        return approved
    if isinstance(pair_ids, str) or not all(isinstance(i, str) for i in pair_ids):
        raise StoreError("pair_ids", "must be a list of pair ids")
    wanted = list(dict.fromkeys(pair_ids))  # duplicates would put the same clip in twice
    by_id = {p.id: p for p in approved}
    known = store.existing_pair_ids([i for i in wanted if i not in by_id])  # one transaction, not one per id
    unknown = [i for i in wanted if i not in by_id and i not in known]
    if unknown:
        raise NotFound("pair_ids", f"unknown pair(s): {', '.join(unknown)}")
    refused = [i for i in wanted if i not in by_id]
    if refused:
        raise StoreError(
            "pair_ids",
            f"not approved: {', '.join(refused)}; only completed pairs that were accepted (never rejected) "
            "in an approved configuration can be exported",
        )
    return [by_id[i] for i in wanted]


# ---------------------------------------------------------------------------------------------- entries


def _slug(text: str) -> str:
    """A short filesystem-safe form of a prompt for readable folder names."""
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug[:SLUG_CHARS].rstrip("-") or "prompt"


def _pair_entry(store: Store, index: int, pair: PairRecord) -> _PairEntry:
    """Collect a pair's clips, videos and verdicts; the folder name says what the pair is."""
    folder = f"pairs/{index:02d}_{_slug(pair.prompt)}_seed{pair.seed}_{_slug(pair.tier_name)}"
    clips = (
        _clip_entry(store, "baseline", pair.baseline_video_id, pair.baseline_clip_sha, f"{folder}/baseline.mp4"),
        _clip_entry(store, "candidate", pair.candidate_video_id, pair.candidate_clip_sha,
                    f"{folder}/candidate_{_slug(pair.tier_name)}.mp4"),
    )
    return _PairEntry(pair=pair, verdicts=store.list_verdicts(pair_id=pair.id), clips=clips)


def _clip_entry(store: Store, role: str, video_id: str | None, sha: str | None, arcname: str) -> _ClipEntry:
    """A clip of a pair; approved pairs always have both (the store enforces it), so absence is corruption."""
    if video_id is None or sha is None:
        raise ClipIntegrityError(f"{role} clip is missing from an approved pair")
    video = store.get_video(video_id)
    return _ClipEntry(role=role, arcname=arcname, clip=store.get_clip(sha), video=video.as_dict())


# --------------------------------------------------------------------------------------------- manifest


def _clip_manifest(entry: _ClipEntry) -> dict[str, Any]:
    """What the manifest records about one clip (timings come from its sidecar)."""
    clip = entry.clip
    return {
        "file": entry.arcname,
        "sha256": clip.sha256,
        "size_bytes": clip.size_bytes,
        "video_id": entry.video["id"],
        "tier": clip.tier,
        "width": clip.width,
        "height": clip.height,
        "frames": clip.frames,
        "duration_seconds": clip.duration_seconds,
        "tokens": clip.tokens,
        "timings": clip.sidecar.get("timings", {}),
        "inference_time_s": entry.video["inference_time_s"],
        "peak_memory_mb": entry.video["peak_memory_mb"],
        "sidecar": clip.sidecar,
    }


def _pair_manifest(entry: _PairEntry) -> dict[str, Any]:
    """What the manifest records about one pair."""
    pair = entry.pair
    return {
        "pair_id": pair.id,
        "prompt": pair.prompt,
        "seed": pair.seed,
        "model_id": pair.model_id,
        "tier_name": pair.tier_name,
        "tier_config": pair.tier_config,
        "target": pair.target,
        "configuration_key": pair.configuration_key,
        **_pair_inputs(entry),
        "metrics": _manifest_metrics(pair.metrics),
        "verdicts": [v.as_dict() for v in entry.verdicts],
        **{clip.role: _clip_manifest(clip) for clip in entry.clips},
    }


def _pair_inputs(entry: _PairEntry) -> dict[str, Any]:
    """The pair's task and its conditioning inputs by field (sha256, size, format, and `file`: where the image is
    in the zip), as its candidate's request recorded them; t2va pairs: task only (and no inputs)."""
    request = next(clip.video for clip in entry.clips if clip.role == "candidate").get("request") or {}
    described = request.get("inputs", {})
    with_files = {field: ([{**item, "file": _input_arcname(item)} for item in value] if isinstance(value, list)
                          else {**value, "file": _input_arcname(value)})
                  for field, value in described.items()}
    return {"task": request.get("task", "t2va"), "inputs": with_files}


def _input_arcname(described: dict[str, Any]) -> str:
    return f"inputs/{described['sha256']}.{EXTENSIONS.get(described.get('format'), 'bin')}"


def _input_files(store: Store, entries: list[_PairEntry]) -> dict[str, tuple[Path, str]]:
    """{zip name: (stored file, sha256)} of every pair's conditioning inputs, each once. A missing or altered
    input stops the export (ClipMissing / ClipIntegrityError naming it), before anything is written."""
    files, found = InputFiles(store.data_dir), {}
    for entry in entries:
        for field, value in _pair_inputs(entry)["inputs"].items():
            for item in value if isinstance(value, list) else [value]:
                if item["file"] in found:
                    continue
                try:
                    found[item["file"]] = (files.path(item["sha256"]), item["sha256"])
                except NotFound:
                    raise ClipMissing(f"the {field} input {item['sha256']} of pair {entry.pair.id} is missing from "
                                      "the data dir (inputs/); nothing was exported") from None
    return found


def _manifest_metrics(stored: dict[str, Any] | None) -> dict[str, Any] | None:
    """The pair's quality summary without its overlay PNG paths (on the studio's disk, not in the zip) or other
    server paths in its text: the numbers travel. A failed comparison travels as stored ({"error": ...}), its
    paths hidden too."""
    if not stored:
        return stored
    if "error" in stored:
        return {**stored, "error": hide_paths(str(stored["error"]))}
    try:
        return QualitySummary.from_json(stored).with_text(hide_paths).to_json(files=False)
    except SummaryError as error:
        return {"error": f"the stored metrics are not a quality summary ({error})"}


def _manifest(store: Store, entries: list[_PairEntry], exported_at: datetime) -> dict[str, Any]:
    """The whole manifest: format, time, approval rule, the configurations involved and every pair."""
    keys = {e.pair.configuration_key for e in entries}
    configurations = [
        {k: v for k, v in store.configuration_status(key).items() if k != "history"} for key in sorted(keys)
    ]
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "exported_at": exported_at.isoformat(),
        "approval_rule": store.approval_rule.as_dict(),
        "pair_count": len(entries),
        "configurations": configurations,
        "pairs": [_pair_manifest(e) for e in entries],
    }


def _sha256sums(entries: list[_PairEntry], inputs: dict[str, tuple[Path, str]]) -> str:
    """``sha256sum -c`` format: '<hex>  <path>' per clip and per input image."""
    return ("".join(f"{c.clip.sha256}  {c.arcname}\n" for e in entries for c in e.clips)
            + "".join(f"{sha}  {arcname}\n" for arcname, (_, sha) in inputs.items()))


def _readme(manifest: dict[str, Any], rule_class: type[ApprovalRule] = ApprovalRule) -> str:
    """Plain-text guide to the archive; the rule in words from the manifest's rule (db/rule.py describe)."""
    rule = textwrap.fill(f"Approval rule: a configuration is approved once its standing verdicts (each reviewer's "
                         f"latest per pair) count {rule_class.from_stored(manifest['approval_rule']).describe()}. "
                         "Exported pairs belong to approved configurations, were accepted and never rejected.",
                         width=110)
    return f"""H3 Review Studio export
=======================

Exported at {manifest["exported_at"]} (UTC); {manifest["pair_count"]} approved pair(s).

Contents
--------
pairs/NN_<prompt>_seed<seed>_<tier>/baseline.mp4         the baseline clip (same prompt and seed)
pairs/NN_<prompt>_seed<seed>_<tier>/candidate_<tier>.mp4 the accelerated clip that was reviewed
inputs/<sha256>.<png|jpg|webp>  keyframes and reference images of fl2va/ref2va pairs (manifest: pairs[].inputs)
manifest.json  per pair: prompt, seed, model id, tier configuration, target, quality metrics, every
               reviewer verdict, and per clip its sha256, size, stage timings (from the clip's sidecar)
               and the full sidecar; plus the approval rule and the configurations' tallies.
SHA256SUMS     the sha256 of every MP4 and input image, in the format of `sha256sum`.
README.txt     this file.

{rule}

Verifying the clips
-------------------
Unzip, then in the unzipped folder run:

    sha256sum -c SHA256SUMS

(macOS: `shasum -a 256 -c SHA256SUMS`.) Every line must say OK. The same hashes are in manifest.json under
pairs[].baseline.sha256 and pairs[].candidate.sha256; the studio stores clips under their sha256, so a hash
also identifies the clip in the studio that produced this export. Without sha256sum:

    python -c "import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],'rb').read()).hexdigest())" FILE.mp4
"""


def _zip_name(entries: list[_PairEntry], exported_at: datetime) -> str:
    """Readable and unique: time of export plus a digest of what is in it."""
    digest = sha256_hex(exported_at.isoformat() + "|" + "|".join(e.pair.id for e in entries))[:8]
    return f"h3-export-{exported_at:%Y%m%d-%H%M%S}-{len(entries)}pairs-{digest}.zip"


# ------------------------------------------------------------------------------------------------ writing


def _zip_info(arcname: str, exported_at: datetime, compress: int) -> zipfile.ZipInfo:
    """A zip entry stamped with the export time (stable, not the wall clock of each write)."""
    info = zipfile.ZipInfo(arcname, date_time=exported_at.timetuple()[:6])
    info.compress_type = compress
    info.external_attr = 0o644 << 16
    return info


def _write_text(archive: zipfile.ZipFile, arcname: str, text: str, exported_at: datetime) -> None:
    """A small compressed text entry."""
    archive.writestr(_zip_info(arcname, exported_at, zipfile.ZIP_DEFLATED), text.encode("utf-8"))


def _copy_verified(archive: zipfile.ZipFile, entry: _ClipEntry, exported_at: datetime) -> None:
    """Stream a clip into the zip (stored: MP4 is already compressed), hashing as it goes."""
    info = _zip_info(entry.arcname, exported_at, zipfile.ZIP_STORED)
    digest = hashlib.sha256()
    zip64 = entry.clip.size_bytes >= zipfile.ZIP64_LIMIT  # must be declared up front when streaming
    try:
        with entry.clip.path.open("rb") as source, archive.open(info, "w", force_zip64=zip64) as target:
            while chunk := source.read(CHUNK_BYTES):
                digest.update(chunk)
                target.write(chunk)
    except FileNotFoundError as exc:
        raise ClipMissing(f"the file of clip {entry.clip.sha256} ({clip_relpath(entry.clip.sha256)}) is missing "
                          "from the data dir; nothing was exported") from exc
    if digest.hexdigest() != entry.clip.sha256:
        raise ClipIntegrityError(f"the file of clip {entry.clip.sha256} ({clip_relpath(entry.clip.sha256)}) no "
                                 "longer matches its sha256; refusing to export it")


def _copy_input(archive: zipfile.ZipFile, arcname: str, source: Path, sha: str, exported_at: datetime) -> None:
    """An input image into the zip (stored: already compressed), its bytes hashed again as they are read."""
    data = source.read_bytes()
    if hashlib.sha256(data).hexdigest() != sha:
        raise ClipIntegrityError(f"input {sha} ({arcname}) no longer matches its sha256; refusing to export it")
    archive.writestr(_zip_info(arcname, exported_at, zipfile.ZIP_STORED), data)

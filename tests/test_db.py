"""Tests for db/: migration, CRUD, transactions, restart persistence, concurrency, approval."""

from __future__ import annotations

import json
import sqlite3
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from db import ApprovalRule, Conflict, NotFound, PairRecord, Store, StoreError, configuration_key, tier_config_hash
from db.database import alembic_config
from db.files import atomic_writer
from db.models import Base
from db.records import REASONS, RESTART_ERROR
from engine.sidecar import ClipSidecar
from tests.quality_fixtures import summary_json

MODEL = "h3-nano"
BASELINE_TIER = {"name": "baseline"}
FAST_TIER = {"cache_threshold": 0.1, "sparse_attention": True}


# ------------------------------------------------------------------------------------------------ helpers


def fake_mp4(tag: str) -> bytes:
    """Distinct bytes per tag (the store does not parse MP4s, it only hashes them)."""
    return b"\x00\x00\x00\x18ftypmp42" + tag.encode("utf-8") * 8


def sidecar(prompt: str = "a red fox", seed: int = 7, tier: str = "baseline",
            tier_config: dict[str, Any] | None = None, duration: float = 2.0, **extra: Any) -> dict[str, Any]:
    """A clip's sidecar as the engine writes it (engine/sidecar.py), ``extra`` keys added or replaced."""
    made = ClipSidecar(
        prompt=prompt, seed=seed, tier=tier, tier_config=tier_config if tier_config is not None else BASELINE_TIER,
        model_id=MODEL, model_name="h3-test", tokens=1234, frames=49, fps=24, sample_rate=44100, width=64, height=48,
        duration_seconds=duration, requested_duration=duration, aspect_ratio="4:3", short_edge=48,
        timings={"encode_text": 0.1, "denoise": 2.5, "decode_video": 0.4}, inference_time_s=3.0)
    return {**made.to_json(), **extra}


def target(duration: float = 2.0) -> dict[str, Any]:
    """A /v1/videos target block."""
    return {"short_edge": 48, "aspect_ratio": "4:3", "duration_seconds": duration}


def completed_video(store: Store, prompt: str, seed: int, tier: str, tier_config: dict[str, Any], tag: str) -> str:
    """Store a clip and a completed job pointing at it; return the job id."""
    clip = store.put_clip(fake_mp4(tag), sidecar(prompt=prompt, seed=seed, tier=tier, tier_config=tier_config))
    video = store.create_video({"prompt": prompt, "seed": seed}, tier, model=MODEL)
    store.update_video(video.id, status="in_progress", progress=50)
    store.update_video(video.id, status="completed", clip_sha=clip.sha256, inference_time_s=1.5, peak_memory_mb=900.0)
    return video.id


def completed_pair(store: Store, prompt: str, seed: int = 7, tier: str = "fast",
                   tier_config: dict[str, Any] | None = None, duration: float = 2.0) -> PairRecord:
    """A pair whose baseline and candidate jobs are both completed, with metrics."""
    tier_config = tier_config if tier_config is not None else FAST_TIER
    pair = store.create_pair(prompt, seed, tier, tier_config, target(duration), MODEL)
    baseline = completed_video(store, prompt, seed, "baseline", BASELINE_TIER, f"{pair.id}-baseline")
    candidate = completed_video(store, prompt, seed, tier, tier_config, f"{pair.id}-candidate")
    store.set_pair_videos(pair.id, baseline, candidate)
    store.update_pair(pair.id, status="in_progress")
    return store.update_pair(pair.id, status="completed", metrics=summary_json())


@pytest.fixture()
def store(tmp_path: Path) -> Store:
    """A fresh store in a temp dir."""
    with Store(tmp_path / "data") as s:
        yield s


def row_counts(store: Store) -> dict[str, int]:
    """Rows per table, read straight from the file (independent of the Store's code paths)."""
    with sqlite3.connect(store.db_path) as conn:
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("clips", "video_jobs", "configurations", "pairs", "verdicts")}


# ---------------------------------------------------------------------------------------------- migration


def test_migrated_schema_matches_models(store: Store) -> None:
    with store._engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        current = MigrationContext.configure(conn).get_current_revision()
    assert diffs == []
    assert current == ScriptDirectory.from_config(alembic_config()).get_current_head() == "0005"


def test_migration_runs_standalone_and_downgrades(tmp_path: Path) -> None:
    # Without a Store (as `alembic` on the command line would): env.py builds its own engine from the URL.
    db_path = tmp_path / "standalone.db"
    config = alembic_config()
    config.set_main_option("sqlalchemy.url", f"sqlite:///{db_path}")
    command.upgrade(config, "head")
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone()[0] == "0005"
    command.downgrade(config, "base")
    with sqlite3.connect(db_path) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables == {"alembic_version"}


def test_every_connection_gets_wal_busy_timeout_and_foreign_keys(store: Store) -> None:
    with store._engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 1000


def test_schema_comes_from_alembic_not_create_all(store: Store) -> None:
    with sqlite3.connect(store.db_path) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        version = conn.execute("SELECT version_num FROM alembic_version").fetchone()[0]
    assert {"clips", "video_jobs", "configurations", "pairs", "verdicts", "alembic_version"} <= tables
    assert version == "0005"


# ------------------------------------------------------------------------------------------------- clips


def test_put_clip_is_content_addressed_and_idempotent(store: Store) -> None:
    data = fake_mp4("one")
    clip = store.put_clip(data, sidecar())
    assert clip.path == store.data_dir / "clips" / clip.sha256[:2] / f"{clip.sha256}.mp4"
    assert clip.path.read_bytes() == data
    assert json.loads(clip.sidecar_path.read_text()) == sidecar()
    assert (clip.model_id, clip.prompt, clip.seed, clip.tier) == (MODEL, "a red fox", 7, "baseline")
    assert (clip.width, clip.height, clip.frames, clip.tokens, clip.size_bytes) == (64, 48, 49, 1234, len(data))
    assert clip.timings == {"encode_text": 0.1, "denoise": 2.5, "decode_video": 0.4}
    assert clip.tier_config_hash == tier_config_hash(BASELINE_TIER)
    again = store.put_clip(data, sidecar(timings={"denoise": 99.0}))
    assert again == clip  # same bytes, same clip: the first sidecar stays
    assert store.get_clip(clip.sha256) == clip
    assert store.clip_path(clip.sha256) == clip.path
    assert row_counts(store)["clips"] == 1
    assert not list(clip.path.parent.glob("*.tmp"))


def test_put_clip_rejects_bad_input_and_writes_nothing(store: Store) -> None:
    bad = sidecar()
    del bad["width"]
    with pytest.raises(StoreError) as err:
        store.put_clip(fake_mp4("x"), bad)
    assert err.value.field == "sidecar.width"
    with pytest.raises(StoreError) as err:
        store.put_clip(b"", sidecar())
    assert err.value.field == "mp4_bytes"
    with pytest.raises(StoreError) as err:
        store.put_clip(fake_mp4("x"), sidecar(seed=True))
    assert err.value.field == "sidecar.seed"
    assert row_counts(store)["clips"] == 0
    assert not any(p.is_file() for p in (store.data_dir / "clips").rglob("*"))


def test_unknown_clip_raises_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        store.get_clip("0" * 64)
    with pytest.raises(StoreError) as err:
        store.clip_path("not-a-sha")
    assert err.value.field == "sha256"


def test_find_clip_reuses_a_stored_baseline(store: Store) -> None:
    clip = store.put_clip(fake_mp4("base"), sidecar(duration=5.166667, requested_duration=5))
    key = tier_config_hash(BASELINE_TIER)
    found = store.find_clip(MODEL, "a red fox", 7, 64, 48, 5.166667, key)
    assert found == clip
    assert store.find_clip(MODEL, "a red fox", 8, 64, 48, 5.166667, key) is None  # other seed
    assert store.find_clip(MODEL, "a red fox", 7, 64, 48, 5.0, key) == clip  # the requested duration
    assert store.find_clip(MODEL, "a red fox", 7, 64, 48, 4.0, key) is None  # other duration
    assert store.find_clip(MODEL, "a red fox", 7, 96, 48, 5.166667, key) is None  # other size
    assert store.find_clip(MODEL, "a red fox", 7, 64, 48, 5.166667, tier_config_hash(FAST_TIER)) is None
    assert store.find_clip("other-model", "a red fox", 7, 64, 48, 5.166667, key) is None
    clip.path.unlink()  # a clip whose file vanished must not be offered for reuse
    assert store.find_clip(MODEL, "a red fox", 7, 64, 48, 5.166667, key) is None
    # putting it again heals it
    assert store.put_clip(fake_mp4("base"), sidecar(duration=5.166667, requested_duration=5)) == clip
    assert clip.path.read_bytes() == fake_mp4("base")
    assert store.find_clip(MODEL, "a red fox", 7, 64, 48, 5.166667, key) == clip


def test_find_clip_without_a_canvas_matches_the_requested_aspect_and_short_edge(store: Store) -> None:
    """A remote server's clip: the plan has no canvas, the request's aspect ratio and short edge stand for it."""
    clip = store.put_clip(fake_mp4("remote"), sidecar(duration=5.166667, requested_duration=5, aspect_ratio="16:9",
                                                      short_edge=32))
    key = tier_config_hash(BASELINE_TIER)
    assert store.find_clip(MODEL, "a red fox", 7, None, None, 5, key, "16:9", 32) == clip
    assert store.find_clip(MODEL, "a red fox", 7, None, None, 5, key, "1:1", 32) is None
    assert store.find_clip(MODEL, "a red fox", 7, None, None, 5, key, "16:9", 64) is None
    with pytest.raises(StoreError) as err:
        store.find_clip(MODEL, "a red fox", 7, None, None, 5, key)
    assert err.value.field == "width"


# -------------------------------------------------------------------------------------------- video jobs


def test_video_job_life_cycle(store: Store) -> None:
    video = store.create_video({"prompt": "p", "seed": 1}, "fast", model=MODEL)
    assert video.id.startswith("video_") and len(video.id) == len("video_") + 32
    assert (video.status, video.progress, video.completed_at) == ("queued", 0, None)
    assert video.created_at.tzinfo == UTC
    video = store.update_video(video.id, status="in_progress", progress=40)
    assert (video.status, video.progress) == ("in_progress", 40)
    with pytest.raises(StoreError) as err:
        store.update_video(video.id, status="completed")
    assert err.value.field == "clip_sha"
    clip = store.put_clip(fake_mp4("v"), sidecar())
    done = store.update_video(video.id, status="completed", clip_sha=clip.sha256, inference_time_s=3.25,
                              peak_memory_mb=812.5)
    assert (done.status, done.progress, done.clip_sha, done.inference_time_s) == ("completed", 100, clip.sha256, 3.25)
    assert done.completed_at is not None and done.completed_at >= done.created_at
    with pytest.raises(Conflict) as err:
        store.update_video(video.id, status="in_progress")
    assert err.value.field == "status"
    assert store.get_video(video.id) == done


def test_update_video_validates_fields(store: Store) -> None:
    video = store.create_video({"prompt": "p"}, "fast")
    with pytest.raises(StoreError) as err:
        store.update_video(video.id, status="running")
    assert err.value.field == "status" and "queued, in_progress, completed, failed" in err.value.message
    with pytest.raises(StoreError) as err:
        store.update_video(video.id, progress=101)
    assert err.value.field == "progress"
    with pytest.raises(NotFound) as err:
        store.update_video("video_missing", progress=1)
    assert err.value.field == "video_id"
    failed = store.update_video(video.id, status="failed", error="out of memory")
    assert (failed.status, failed.error) == ("failed", "out of memory")
    assert failed.completed_at is not None


def test_failed_update_changes_nothing(store: Store) -> None:
    video = store.create_video({"prompt": "p"}, "fast")
    with pytest.raises(NotFound) as err:
        store.update_video(video.id, status="completed", progress=100, clip_sha="f" * 64)
    assert err.value.field == "clip_sha"
    assert store.get_video(video.id) == video


def test_list_videos_pages_by_cursor(store: Store) -> None:
    ids = [store.create_video({"n": n}, "fast").id for n in range(5)]
    assert [v.id for v in store.list_videos(limit=10, order="asc")] == ids
    assert [v.id for v in store.list_videos(limit=2, order="desc")] == ids[::-1][:2]
    assert [v.id for v in store.list_videos(after=ids[1], limit=10, order="asc")] == ids[2:]
    assert [v.id for v in store.list_videos(after=ids[3], limit=2, order="desc")] == [ids[2], ids[1]]
    with pytest.raises(StoreError) as err:
        store.list_videos(order="sideways")
    assert err.value.field == "order"
    with pytest.raises(StoreError) as err:
        store.list_videos(limit=0)
    assert err.value.field == "limit"
    with pytest.raises(NotFound) as err:
        store.list_videos(after="video_nope")
    assert err.value.field == "after"


def test_delete_video_keeps_clip_and_protects_pairs(store: Store) -> None:
    clip = store.put_clip(fake_mp4("d"), sidecar())
    video = store.create_video({"prompt": "p"}, "fast")
    store.update_video(video.id, status="completed", clip_sha=clip.sha256)
    deleted = store.delete_video(video.id)
    assert deleted.id == video.id
    with pytest.raises(NotFound):
        store.get_video(video.id)
    with pytest.raises(NotFound):
        store.delete_video(video.id)
    assert clip.path.is_file()  # clips are shared by content; deleting a job keeps them
    pair = completed_pair(store, "a fox")
    with pytest.raises(Conflict) as err:
        store.delete_video(pair.baseline_video_id)
    assert err.value.field == "video_id"
    assert store.get_video(pair.baseline_video_id).status == "completed"


# ------------------------------------------------------------------------------------ pairs, configurations


def test_create_pair_creates_and_updates_its_configuration(store: Store) -> None:
    pair = store.create_pair("a fox", 7, "fast", FAST_TIER, target(2), MODEL)
    assert pair.id.startswith("pair_") and pair.status == "queued"
    assert pair.tier_config == {**FAST_TIER, "name": "fast"}
    assert pair.configuration_key == configuration_key(MODEL, FAST_TIER, 2.0, tier_name="fast")
    assert pair.configuration_key == configuration_key(MODEL, {**FAST_TIER, "name": "fast"}, 2)
    store.create_pair("a bear", 8, "fast", dict(reversed(list(FAST_TIER.items()))), target(2.0), MODEL)
    other = store.create_pair("a fox", 7, "fast", FAST_TIER, target(4.0), MODEL)
    assert other.configuration_key != pair.configuration_key  # duration is part of a configuration
    configs = {c["key"]: c for c in store.list_configurations()}
    assert configs[pair.configuration_key]["pair_count"] == 2
    assert configs[other.configuration_key]["pair_count"] == 1
    assert configs[pair.configuration_key]["tier_name"] == "fast"
    assert configs[pair.configuration_key]["approved"] is False


def test_create_pair_validates(store: Store) -> None:
    cases = [
        (dict(prompt=""), "prompt"),
        (dict(seed=-1), "seed"),
        (dict(tier_config=["not", "a", "dict"]), "tier_config"),
        (dict(tier_config={"name": "turbo"}), "tier_name"),
        (dict(target={"short_edge": 48}), "target.duration_seconds"),
        (dict(model_id=" "), "model_id"),
    ]
    for override, field in cases:
        args = dict(prompt="p", seed=1, tier_name="fast", tier_config=FAST_TIER, target=target(), model_id=MODEL)
        with pytest.raises(StoreError) as err:
            store.create_pair(**{**args, **override})
        assert err.value.field == field
    assert row_counts(store)["pairs"] == row_counts(store)["configurations"] == 0


def test_pair_completion_needs_two_completed_videos(store: Store) -> None:
    pair = store.create_pair("a fox", 7, "fast", FAST_TIER, target(), MODEL)
    with pytest.raises(Conflict) as err:
        store.update_pair(pair.id, status="completed")
    assert err.value.field == "status"
    baseline = completed_video(store, "a fox", 7, "baseline", BASELINE_TIER, "b")
    candidate = store.create_video({"prompt": "a fox"}, "fast").id
    with pytest.raises(StoreError) as err:
        store.set_pair_videos(pair.id, baseline, baseline)
    assert err.value.field == "candidate_video_id"
    with pytest.raises(NotFound) as err:
        store.set_pair_videos(pair.id, baseline, "video_missing")
    assert err.value.field == "candidate_video_id"
    store.set_pair_videos(pair.id, baseline, candidate)
    with pytest.raises(Conflict):
        store.update_pair(pair.id, status="completed")  # candidate still queued
    clip = store.put_clip(fake_mp4("c"), sidecar(tier="fast", tier_config=FAST_TIER))
    store.update_video(candidate, status="completed", clip_sha=clip.sha256)
    done = store.update_pair(pair.id, status="completed", metrics={"psnr_db": 30.0})
    assert (done.status, done.metrics, done.candidate_clip_sha) == ("completed", {"psnr_db": 30.0}, clip.sha256)
    assert done.baseline_clip_sha == store.get_video(baseline).clip_sha
    assert store.list_pairs(status="completed") == [done]
    with pytest.raises(Conflict) as err:  # the clips a pair was judged on cannot be swapped afterwards
        store.set_pair_videos(pair.id, candidate, baseline)
    assert err.value.field == "pair_id"
    assert store.list_pairs(status="queued") == []


def test_a_failing_write_rolls_back_completely(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("disk full")

    # The configuration upsert is flushed before the pair insert fails: both must vanish together.
    monkeypatch.setattr(Store, "_insert_pair", staticmethod(explode))
    with pytest.raises(RuntimeError):
        store.create_pair("a fox", 7, "fast", FAST_TIER, target(), MODEL)
    assert store.list_configurations() == []
    assert row_counts(store)["configurations"] == 0 and row_counts(store)["pairs"] == 0


# ----------------------------------------------------------------------------------------------- verdicts


def test_verdict_snapshots_the_reviewed_configuration(store: Store) -> None:
    pair = completed_pair(store, "a fox")
    before = datetime.now(UTC)
    verdict = store.add_verdict(pair.id, " ana ", "reject", ["ghosting", "blur", "ghosting"], "edges smear")
    assert verdict.id.startswith("verdict_")
    assert (verdict.pair_id, verdict.reviewer, verdict.decision) == (pair.id, "ana", "reject")
    assert verdict.reasons == ("ghosting", "blur")
    assert verdict.tier_config == {**FAST_TIER, "name": "fast"}
    assert verdict.prompt == "a fox" and verdict.configuration_key == pair.configuration_key
    assert verdict.created_at.tzinfo == UTC and verdict.created_at >= before.replace(microsecond=0)
    assert store.list_verdicts(pair_id=pair.id) == [verdict]


def test_verdict_validation_names_the_field(store: Store) -> None:
    pair = completed_pair(store, "a fox")
    queued = store.create_pair("a bear", 1, "fast", FAST_TIER, target(), MODEL)
    cases = [
        (dict(decision="maybe"), StoreError, "decision", "accept, reject"),
        (dict(reasons=["too slow"]), StoreError, "reasons", ", ".join(REASONS)),
        (dict(reasons="blur"), StoreError, "reasons", "colour shift"),
        (dict(reviewer="  "), StoreError, "reviewer", "empty"),
        (dict(reviewer="ana\ud800"), StoreError, "reviewer", "lone surrogate"),  # was an encode error (a 500)
        (dict(notes="\udc00"), StoreError, "notes", "lone surrogate"),
        (dict(pair_id="pair_missing"), NotFound, "pair_id", "pair_missing"),
        (dict(pair_id=queued.id), Conflict, "pair_id", "completed"),
    ]
    for override, error_type, field, text in cases:
        args = dict(pair_id=pair.id, reviewer="ana", decision="accept", reasons=[], notes="")
        with pytest.raises(error_type) as err:
            store.add_verdict(**{**args, **override})
        assert isinstance(err.value, ValueError)
        assert err.value.field == field and text in err.value.message
    assert row_counts(store)["verdicts"] == 0


def test_a_prompt_with_a_lone_surrogate_is_refused_naming_it(store: Store) -> None:
    with pytest.raises(StoreError) as err:
        store.create_pair("a fox \ud800", 1, "fast", FAST_TIER, target(), MODEL)
    assert err.value.field == "prompt" and "lone surrogate" in err.value.message
    assert row_counts(store)["pairs"] == 0


def test_twenty_threads_posting_verdicts_store_each_exactly_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "data")
    pairs = [completed_pair(store, f"prompt {i}") for i in range(4)]
    second = Store(tmp_path / "data", recover=False)  # another engine on the same file, as a second process
    barrier = threading.Barrier(20)
    results: list[str] = []
    errors: list[BaseException] = []

    def post(n: int) -> None:
        target_store = store if n % 2 else second
        try:
            barrier.wait()
            verdict = target_store.add_verdict(pairs[n % 4].id, f"reviewer-{n}", "accept", ["other"], f"note {n}")
            results.append(verdict.id)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=post, args=(n,)) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    stored = store.list_verdicts()
    assert len(results) == len(set(results)) == len(stored) == 20
    assert sorted(v.reviewer for v in stored) == sorted(f"reviewer-{n}" for n in range(20))
    assert {v.id for v in stored} == set(results)
    second.close()
    store.close()


# ----------------------------------------------------------------------------------------------- approval


def test_approval_needs_three_distinct_prompts_and_no_rejects(store: Store) -> None:
    fox, fox_again, bear, owl = (completed_pair(store, p, seed=s)
                                 for p, s in (("fox", 1), ("fox", 2), ("bear", 1), ("owl", 1)))
    key = fox.configuration_key
    assert len({fox.configuration_key, fox_again.configuration_key, bear.configuration_key, owl.configuration_key}) == 1
    store.add_verdict(fox.id, "ana", "accept", [], "")
    store.add_verdict(fox_again.id, "ben", "accept", [], "")
    store.add_verdict(bear.id, "ana", "accept", [], "")
    status = store.configuration_status(key)
    assert (status["approved"], status["accepts"], status["distinct_accepted_prompts"]) == (False, 3, 2)
    assert store.approved_pairs() == []
    store.add_verdict(owl.id, "ana", "accept", [], "")
    status = store.configuration_status(key)
    assert (status["approved"], status["accepts"], status["rejects"]) == (True, 4, 0)
    assert status["accepted_prompts"] == ["bear", "fox", "owl"]
    assert [h["pair_id"] for h in status["history"]] == [fox.id, fox_again.id, bear.id, owl.id]
    assert [p.id for p in store.approved_pairs()] == [fox.id, fox_again.id, bear.id, owl.id]
    assert [c["approved"] for c in store.list_configurations()] == [True]
    store.add_verdict(owl.id, "cy", "reject", ["flicker"], "flickers at 2 s")
    status = store.configuration_status(key)
    assert (status["approved"], status["rejects"]) == (False, 1)
    assert store.approved_pairs() == []
    with pytest.raises(NotFound) as err:
        store.configuration_status("0" * 64)
    assert err.value.field == "key"


def test_approval_rule_is_configurable(tmp_path: Path) -> None:
    with Store(tmp_path / "data", ApprovalRule(min_distinct_prompts=1, max_rejects=1, min_reviewers=1)) as store:
        fox, bear = completed_pair(store, "fox"), completed_pair(store, "bear")
        store.add_verdict(fox.id, "ana", "accept", [], "")
        store.add_verdict(bear.id, "ben", "reject", ["blur"], "")
        status = store.configuration_status(fox.configuration_key)
        assert status["approved"] is True and status["rule"] == {"min_distinct_prompts": 1, "max_rejects": 1,
                                                       "min_reviewers": 1}
        # The configuration is approved, but the rejected pair itself is never exported.
        assert [p.id for p in store.approved_pairs()] == [fox.id]
    with Store(tmp_path / "data") as strict:  # same data, default rule
        assert strict.configuration_status(fox.configuration_key)["approved"] is False
    with pytest.raises(StoreError) as err:
        ApprovalRule(min_distinct_prompts=0)
    assert err.value.field == "min_distinct_prompts"
    with pytest.raises(StoreError) as err:
        ApprovalRule(max_rejects=-1)
    assert err.value.field == "max_rejects"


# ------------------------------------------------------------------------------------- restart and recovery


def test_everything_survives_a_restart(tmp_path: Path) -> None:
    first = Store(tmp_path / "data")
    pair = completed_pair(first, "fox")
    verdict = first.add_verdict(pair.id, "ana", "accept", [], "fine")
    videos = first.list_videos(limit=100)
    configs = first.list_configurations()
    first.close()
    with Store(tmp_path / "data") as second:
        assert second.recovered_video_ids == []
        assert second.get_pair(pair.id) == pair
        assert second.list_verdicts() == [verdict]
        assert second.list_videos(limit=100) == videos
        assert second.list_configurations() == configs
        clip = second.get_clip(pair.candidate_clip_sha)
        assert clip.path.read_bytes() == fake_mp4(f"{pair.id}-candidate")


def test_restart_fails_jobs_a_crash_left_unfinished(tmp_path: Path) -> None:
    first = Store(tmp_path / "data")
    queued = first.create_video({"prompt": "q"}, "fast")
    running = first.update_video(first.create_video({"prompt": "r"}, "fast").id, status="in_progress", progress=30)
    done = completed_video(first, "d", 1, "fast", FAST_TIER, "done")
    pair = first.update_pair(first.create_pair("p", 1, "fast", FAST_TIER, target(), MODEL).id, status="in_progress")
    first.close()  # the "crash": nothing finishes these jobs
    with Store(tmp_path / "data", recover=False) as peek:  # a CLI must not fail a live server's jobs
        assert peek.get_video(running.id).status == "in_progress"
    with Store(tmp_path / "data") as second:
        assert sorted(second.recovered_video_ids) == sorted([queued.id, running.id])
        for video_id in (queued.id, running.id):
            video = second.get_video(video_id)
            assert (video.status, video.error) == ("failed", RESTART_ERROR)
            assert video.completed_at is not None
        assert second.get_video(running.id).progress == 30  # the rest of the row is kept
        assert second.get_video(running.id).request == {"prompt": "r"}
        assert second.get_video(done).status == "completed"
        assert (second.get_pair(pair.id).status, second.get_pair(pair.id).error) == ("failed", RESTART_ERROR)


def test_restart_keeps_jobs_a_remote_server_had_accepted(tmp_path: Path) -> None:
    first = Store(tmp_path / "data")
    base = completed_video(first, "b", 1, "fast", FAST_TIER, "base")
    remote = first.update_video(first.create_video({"prompt": "r"}, "fast").id, status="in_progress", progress=40)
    first.set_video_remote(remote.id, "pod-a", "vid_9")
    local = first.create_video({"prompt": "l"}, "fast")
    waiting = first.create_pair("w", 1, "fast", FAST_TIER, target(), MODEL)
    first.set_pair_videos(waiting.id, base, remote.id)
    broken = first.create_pair("x", 1, "fast", FAST_TIER, target(), MODEL)
    first.set_pair_videos(broken.id, local.id, remote.id)
    first.close()
    with Store(tmp_path / "data") as second:
        (resumable,) = second.resumable_videos
        assert resumable.id == remote.id and resumable.status == "queued" and resumable.progress == 40
        assert resumable.remote["server"] == "pod-a" and resumable.remote["video_id"] == "vid_9"
        assert second.get_video(local.id).status == "failed"
        assert second.get_pair(waiting.id).status == "queued"  # waits for the resumed job only
        assert second.get_pair(broken.id).status == "failed"  # its local job is gone
    with Store(tmp_path / "data", recover=False) as peek, pytest.raises(StoreError, match="server"):
        peek.set_video_remote(remote.id, "", "vid_9")


def test_migration_0002_keeps_rows_stored_under_0001(tmp_path: Path) -> None:
    db_path = tmp_path / "data" / "studio.db"
    db_path.parent.mkdir()
    config = alembic_config()
    config.set_main_option("sqlalchemy.url", f"sqlite:///{db_path}")
    command.upgrade(config, "0001")
    with sqlite3.connect(db_path) as conn:
        conn.execute("INSERT INTO video_jobs (id, status, progress, tier, model, request_json, created_at) "
                     "VALUES ('video_old', 'failed', 0, 'fast', 'm', '{\"prompt\": \"old\"}', '2026-12-02 10:00:00')")
    with Store(tmp_path / "data") as store:
        old = store.get_video("video_old")
        assert (old.request, old.remote) == ({"prompt": "old"}, None)


# -------------------------------------------------------------------------------------------------- files


def test_atomic_writer_leaves_old_file_and_no_temp_on_failure(tmp_path: Path) -> None:
    path = tmp_path / "out.bin"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_writer(path) as handle:
        handle.write(b"half")
        raise RuntimeError("interrupted")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]
    with atomic_writer(path) as handle:
        handle.write(b"new")
    assert path.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]

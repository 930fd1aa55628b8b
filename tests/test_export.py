"""Tests for studio/export.py: zip contents, manifest, refusals, atomicity."""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest

from db import ClipIntegrityError, NotFound, PairRecord, Store, StoreError
from studio import export
from studio.export import export_pairs
from tests.quality_fixtures import summary_json
from tests.test_db import FAST_TIER, MODEL, completed_pair, fake_mp4


@pytest.fixture()
def store(tmp_path: Path) -> Store:
    """A fresh store in a temp dir."""
    with Store(tmp_path / "data") as s:
        yield s


def approve(store: Store, prompts: tuple[str, ...] = ("a red fox", "a bear", "an owl")) -> list[PairRecord]:
    """Accepted pairs on enough distinct prompts to approve their configuration."""
    pairs = [completed_pair(store, prompt, seed=n) for n, prompt in enumerate(prompts)]
    for pair in pairs:
        store.add_verdict(pair.id, "ana", "accept", [], "looks identical")
    store.add_verdict(pairs[-1].id, "cy", "accept", [], "")  # the default rule wants 2 distinct reviewers
    assert store.configuration_status(pairs[0].configuration_key)["approved"]
    return pairs


def test_export_all_approved_pairs(store: Store, tmp_path: Path) -> None:
    pairs = approve(store)
    unapproved = completed_pair(store, "a cat", tier="faster", tier_config={"cache_threshold": 0.3})
    out = tmp_path / "exports"
    path = export_pairs(store, None, out)
    assert path.parent == out and path.suffix == ".zip"
    assert list(out.iterdir()) == [path]  # no temp file left next to it
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None
        names = set(archive.namelist())
        manifest = json.loads(archive.read("manifest.json"))
        readme = archive.read("README.txt").decode()
        # the rule as it is, reviewers included (issue 42: it left out the 2-reviewer default)
        assert ("at least 3 distinct accepted prompts, at least 2 distinct accepting reviewers and at most 0 standing "
                "rejects") in " ".join(readme.split())
        sums = archive.read("SHA256SUMS").decode()
        mp4s = {name: archive.read(name) for name in names if name.endswith(".mp4")}
    assert {"manifest.json", "README.txt", "SHA256SUMS"} <= names
    assert len(mp4s) == 6
    assert "pairs/01_a-red-fox_seed0_fast/baseline.mp4" in names
    assert "pairs/01_a-red-fox_seed0_fast/candidate_fast.mp4" in names
    assert unapproved.id not in json.dumps(manifest)

    assert manifest["pair_count"] == 3 and manifest["approval_rule"] == {"min_distinct_prompts": 3, "max_rejects": 0,
                                                                   "min_reviewers": 2}
    assert manifest["exported_at"].endswith("+00:00")
    assert [c["approved"] for c in manifest["configurations"]] == [True]
    assert [p["pair_id"] for p in manifest["pairs"]] == [p.id for p in pairs]
    first = manifest["pairs"][0]
    assert (first["prompt"], first["seed"], first["model_id"]) == ("a red fox", 0, MODEL)
    assert first["tier_config"] == {**FAST_TIER, "name": "fast"}
    assert first["metrics"] == summary_json()
    assert [(v["reviewer"], v["decision"]) for v in first["verdicts"]] == [("ana", "accept")]
    for role in ("baseline", "candidate"):
        clip = first[role]
        assert clip["sha256"] == getattr(pairs[0], f"{role}_clip_sha")
        assert hashlib.sha256(mp4s[clip["file"]]).hexdigest() == clip["sha256"]
        assert mp4s[clip["file"]] == fake_mp4(f"{pairs[0].id}-{role}")
        assert clip["timings"] == {"encode_text": 0.1, "denoise": 2.5, "decode_video": 0.4}
        assert clip["inference_time_s"] == 1.5
    for line in sums.splitlines():  # SHA256SUMS verifies exactly like `sha256sum -c`
        digest, name = line.split("  ", 1)
        assert hashlib.sha256(mp4s[name]).hexdigest() == digest
    assert len(sums.splitlines()) == 6
    assert "sha256sum -c SHA256SUMS" in readme and "manifest.json" in readme


def test_export_selected_pairs_in_order_without_duplicates(store: Store, tmp_path: Path) -> None:
    pairs = approve(store)
    path = export_pairs(store, [pairs[2].id, pairs[0].id, pairs[2].id], tmp_path / "out")
    with zipfile.ZipFile(path) as archive:
        manifest = json.loads(archive.read("manifest.json"))
        mp4s = [n for n in archive.namelist() if n.endswith(".mp4")]
    assert [p["pair_id"] for p in manifest["pairs"]] == [pairs[2].id, pairs[0].id]
    assert len(mp4s) == 4
    assert manifest["pairs"][0]["baseline"]["file"].startswith("pairs/01_an-owl_seed2_fast/")


def test_export_refuses_unapproved_and_unknown_pairs(store: Store, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(StoreError) as err:
        export_pairs(store, [], out)  # nothing approved yet
    assert err.value.field == "pair_ids"
    pairs = approve(store)
    pending = completed_pair(store, "a cat", tier="faster", tier_config={"cache_threshold": 0.3})
    with pytest.raises(StoreError) as err:
        export_pairs(store, [pairs[0].id, pending.id], out)
    assert err.value.field == "pair_ids" and pending.id in err.value.message
    assert not isinstance(err.value, NotFound)
    with pytest.raises(NotFound) as err:
        export_pairs(store, [pairs[0].id, "pair_nope"], out)
    assert err.value.field == "pair_ids" and "pair_nope" in err.value.message
    rejected = pairs[1]
    store.add_verdict(rejected.id, "ben", "reject", ["ghosting"], "")
    with pytest.raises(StoreError) as err:
        export_pairs(store, [rejected.id], out)
    assert err.value.field == "pair_ids"
    assert not out.exists() or list(out.iterdir()) == []


def test_corrupt_clip_aborts_export_without_leaving_a_file(store: Store, tmp_path: Path) -> None:
    pairs = approve(store)
    clip = store.get_clip(pairs[2].candidate_clip_sha)
    clip.path.write_bytes(b"bit rot")
    out = tmp_path / "out"
    with pytest.raises(ClipIntegrityError, match=clip.sha256):
        export_pairs(store, None, out)
    assert list(out.iterdir()) == []


def test_failure_while_writing_leaves_no_partial_zip(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    approve(store)
    out = tmp_path / "out"
    earlier = export_pairs(store, None, out)

    def fail_readme(*_args: object) -> str:
        raise OSError("disk full")

    monkeypatch.setattr(export, "_readme", fail_readme)  # fails after the MP4s were already written
    with pytest.raises(OSError, match="disk full"):
        export_pairs(store, None, out)
    assert list(out.iterdir()) == [earlier]
    with zipfile.ZipFile(earlier) as archive:
        assert archive.testzip() is None


def test_old_exports_are_pruned_the_newest_kept(store: Store, tmp_path: Path) -> None:
    approve(store)
    out = tmp_path / "out"
    out.mkdir()
    earlier = [out / f"h3-export-20260101-0000{n:02d}-3pairs-0000000{n % 10}.zip" for n in range(12)]
    for age, path in enumerate(reversed(earlier), start=1):  # earlier exports, oldest first
        path.write_bytes(b"zip")
        os.utime(path, (1_700_000_000 - age, 1_700_000_000 - age))
    newest = export_pairs(store, None, out)  # they used to pile up
    kept = set(out.glob("*.zip"))
    assert len(kept) == export.KEEP_EXPORTS and newest in kept
    assert kept == {newest, *earlier[-(export.KEEP_EXPORTS - 1):]}  # the newest of the earlier ones stay


def test_manifest_leaves_out_overlay_paths_that_are_not_in_the_zip(store: Store, tmp_path: Path) -> None:
    pairs = approve(store)
    store.update_pair(pairs[0].id, metrics=summary_json(tmp_path / "data" / "overlays" / "key", frames=250))
    with zipfile.ZipFile(export_pairs(store, None, tmp_path / "out")) as archive:
        text = archive.read("manifest.json").decode()
    assert ".png" not in text and str(tmp_path) not in text
    assert json.loads(text)["pairs"][0]["metrics"] == summary_json(frames=250)


def test_a_missing_clip_is_named_without_a_server_path(store: Store, tmp_path: Path) -> None:
    pairs = approve(store)
    clip = store.get_clip(pairs[0].baseline_clip_sha)
    clip.path.unlink()
    with pytest.raises(ClipIntegrityError) as err:
        export_pairs(store, None, tmp_path / "out")
    assert clip.sha256 in str(err.value) and str(store.data_dir) not in str(err.value)


def test_many_unknown_ids_are_refused_in_one_lookup(store: Store, tmp_path: Path, monkeypatch) -> None:
    approve(store)
    lookups = []
    monkeypatch.setattr(store, "get_pair", lambda pair_id: lookups.append(pair_id))  # the per-id path
    with pytest.raises(NotFound, match="pair_0"):
        export_pairs(store, [f"pair_{n}" for n in range(1000)], tmp_path / "out")
    assert lookups == []

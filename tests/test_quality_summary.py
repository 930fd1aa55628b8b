"""The one typed quality summary (quality/summary.py, issue 22 item 4): it carries everything the quality
module reports, reads back what the store keeps, and reads pairs stored before a measure existed."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from quality.summary import FrameMetrics, QualitySummary, SummaryError
from tests.quality_fixtures import cached_comparison, comparison_summary


def test_the_type_carries_every_key_the_quality_module_reports():
    """Comparison.summary() of a real comparison: a key the type lacks would never reach a reviewer. When this
    fails, add the new measure to QualitySummary / FrameMetrics."""
    summary = comparison_summary()
    assert set(summary) - {f.name for f in fields(QualitySummary)} == set()
    row_keys = {key for row in summary["per_frame"] for key in row}
    assert row_keys - {f.name for f in fields(FrameMetrics)} == set()


def test_stored_json_reads_back_to_the_same_summary(tmp_path: Path):
    built = QualitySummary.from_cached(cached_comparison(tmp_path / "key"))
    stored = built.to_json()
    assert QualitySummary.from_json(stored) == built
    assert stored["diff_pngs"][0] == str(tmp_path / "key" / "diff_0000.png") and built.overlay("flip") == ()
    assert built.overlay("ghost")[3] == tmp_path / "key" / "ghost_0003.png"
    plain = built.to_json(files=False)
    assert not {"directory", "diff_pngs", "ghost_pngs", "flip_pngs"} & set(plain)
    # What the quality module said, field for field.
    reported = comparison_summary()
    assert {k: v for k, v in plain.items() if k in reported} == reported
    assert [g.name for g in built.gates] == list(reported["gates"])
    assert built.per_frame[2].psnr == reported["per_frame"][2]["psnr"]


def test_a_pair_stored_before_a_measure_existed_still_reads(tmp_path: Path):
    """Pairs stored before FLIP and temporal consistency landed (and with the bookkeeping keys OverlayCache's
    result carried then) read, the new measures as None."""
    older = comparison_summary()
    for key in ("flip", "flip_reason", "temporal_consistency"):
        older.pop(key)
    for row in older["per_frame"]:
        row.pop("flip"), row.pop("temporal_error")
    older.update({"directory": str(tmp_path), "summary_path": str(tmp_path / "summary.json"), "computed": True,
                  "diff_pngs": ["d.png"] * 4, "ghost_pngs": ["g.png"] * 4})
    summary = QualitySummary.from_json(older)
    assert summary.flip is None and summary.per_frame[0].flip is None and summary.overlay("diff")[0] == Path("d.png")


@pytest.mark.parametrize(("stored", "named"), [
    ({"psnr_db": 34.2}, "frames"),
    ([1, 2], "JSON object"),
    ({**comparison_summary(), "per_frame": [{"index": 0}]}, "malformed"),
])
def test_what_is_not_a_summary_is_named(stored, named):
    with pytest.raises(SummaryError, match=named):
        QualitySummary.from_json(stored)

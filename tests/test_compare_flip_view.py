"""The Compare tab's FLIP view: the FLIP error map PNGs quality renders reach the tab as an analysis view,
with a caption carrying the frame's FLIP, and FLIP and the temporal error are per-frame series (no browser).

The subject series (present, moved, FLIP on subject) reach the plots, the readout and the worst-frames table; the
module's pick (worst_frame, named by its gate) leads them all; each failed gate's sentence shows with its frames and
its worst frame is a jump target (the gate table's first cell)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

import quality as quality
from quality import ClipData, OverlayCache, synth, write_clip
from quality.summary import QualitySummary
from studio.ui.compare import OVERLAY_KINDS, PLOT_OTHER, PLOT_SUBJECT, VIEWS, _gate_table, _plot_frame
from studio.ui.compare_data import PICK, Overlays, frame_readout, frame_series, gate_jumps, worst_frames_table
from studio.ui.panels import quality_html, suggestion_html


def test_flip_view_shows_the_flip_map_of_the_frame(tmp_path):
    frames = synth.render_clip(synth.make_scene(1, width=224, height=128, frames=4, speed=3.0))
    changed = frames.copy()
    changed[:, 30:70, 40:120] = 255 - changed[:, 30:70, 40:120]  # a region that plainly differs
    paths = tmp_path / "b.mp4", tmp_path / "c.mp4"
    write_clip(paths[0], ClipData(frames, 24.0))
    write_clip(paths[1], ClipData(changed, 24.0))
    cached = OverlayCache(tmp_path / "overlays", lpips=False, workers=1).get_or_compute("pair", *paths)
    summary = QualitySummary.from_cached(cached)

    assert OVERLAY_KINDS[VIEWS[3]] == "flip"
    image, caption = Overlays(lambda: quality).image("flip", summary, 2)
    assert image is not None and image.ndim == 3
    assert f"mean FLIP {summary.per_frame[2].flip:.3g}" in caption
    # The map is brighter over the changed region than elsewhere (the PNG, as the tab shows it).
    small = np.asarray(image, np.float32).sum(axis=2)
    h, w = small.shape
    inside = small[int(h * 35 / 128):int(h * 65 / 128), int(w * 45 / 224):int(w * 115 / 224)].mean()
    outside = small[int(h * 90 / 128):, int(w * 150 / 224):].mean()
    assert inside > 2 * outside

    series = frame_series(summary)
    assert series.values["flip"] == [row.flip for row in summary.per_frame]
    assert series.values["temporal"][1:] == [row.temporal_error for row in summary.per_frame][1:]

    without = QualitySummary.from_json({**summary.to_json(), "flip_pngs": []})
    image, note = Overlays(lambda: quality).image("flip", without, 0)
    assert image is None and "FLIP error map" in note


def _row(index, present, moved, subject_flip, ssim=0.9, ghost=0.0):
    return {"index": index, "psnr": 30.0, "ssim": ssim, "ghost_score": ghost, "ghost": ghost >= 0.3,
            "flip": 0.05, "subject_present": present, "subject_displacement_px": moved, "subject_flip": subject_flip,
            "subject_lost": present is not None and present < 0.25}


def _gate(value, limit, passed, frames=None, frame=None, text=None):
    return {"value": value, "limit": limit, "passed": passed, "frames": frames, "frame": frame, "text": text}


LOST = "subject lost for frames 2–3"
GHOST = "a faint copy of the subject in frames 0–1 (2 frames flagged, opacity 0.40 at frame 1)"
FLIP = "FLIP 0.200 over the clip"


def subject_summary(**changes) -> QualitySummary:
    """Six frames: the subject goes at frames 2-3 (subject_lost, the pick: frame 3), ghosts at 0-1, and moves most
    at frame 4; the lowest SSIM is frame 5, so a pick by the old rule (SSIM) would name another frame."""
    rows = [_row(0, 1.0, 0.0, 0.01, ghost=0.35), _row(1, 1.0, 1.0, 0.02, ghost=0.4), _row(2, 0.1, None, 0.5),
            _row(3, 0.0, None, 0.6), _row(4, 0.9, 5.0, 0.1), _row(5, None, None, None, ssim=0.5)]
    data = {"frames": 6, "psnr_mean": 30.0, "ssim_mean": 0.83, "ghosting": True, "ghost_score": 0.4,
            "worst_frame": 3, "worst_by": "subject_lost", "subject_lost_frames": [[2, 3]], "subject_present": 0.35,
            "per_frame": rows, "suggested_verdict": "reject",
            "gates": {"subject_lost": _gate(2, 1, False, [2, 3], 3, LOST),
                      "subject_moved": _gate(5.0, 30.7, True, [4, 4], 4),
                      "ghosting": _gate(2, 2, False, [0, 1], 1, GHOST),
                      "flip": _gate(0.2, 0.12, False, None, None, FLIP),
                      "lpips_delta": _gate(None, 0.04, None)},
            "suggestion_reasons": [LOST, GHOST, FLIP, "Not measured: LPIPS (offline)."]}
    return QualitySummary.from_json({**data, **changes})


def test_subject_series_reach_the_plots_the_readout_and_the_worst_table():
    series = frame_series(subject_summary())
    assert series.values["subject"] == [1.0, 1.0, 0.1, 0.0, 0.9, None]
    assert series.values["subject_moved"] == [0.0, 1.0, None, None, 5.0, None]
    assert series.values["subject_flip"] == [0.01, 0.02, 0.5, 0.6, 0.1, None]
    assert series.worst("subject") == 3  # lower present is worse
    assert series.worst("subject_moved") == 4 and series.worst("subject_flip") == 3  # higher is worse

    metrics = {row["metric"] for row in series.rows()}
    assert {"subject present (share)", "subject moved (px)", "FLIP on subject"} <= metrics
    # "FLIP on subject" starts with "FLIP": it is drawn on the subject plot, not beside the whole-frame FLIP.
    assert set(_plot_frame(series, PLOT_OTHER)["metric"]) == {"SSIM", "ghost score", "FLIP"}
    assert set(_plot_frame(series, PLOT_SUBJECT)["metric"]) == {"subject present (share)", "FLIP on subject"}

    readout = frame_readout(series, 4, 6, 24.0)
    assert "subject present 0.9 share" in readout and "subject moved 5 px <b>(worst)</b>" in readout
    table = worst_frames_table(series, "subject_moved")
    assert [row[0] for row in table] == [4, 1, 0]
    assert table[0][-3:] == [0.9, 5.0, 0.1]  # the subject columns come last, in SERIES order


def test_the_pick_stays_worst_frame_and_names_its_gate():
    series = frame_series(subject_summary())
    assert series.pick == 3 and series.pick_by == "subject_lost"
    assert series.default_worst_key() == PICK and series.worst(PICK) == 3
    assert series.pick_label() == "module's pick (frame 3: subject_lost)"
    assert "the quality module's pick (subject_lost)" in frame_readout(series, 3, 6, 24.0)
    assert "module's pick" not in frame_readout(series, 5, 6, 24.0)
    # The table by the pick leads with the pick (not the lowest SSIM, frame 5), then ranks by the gate's series.
    assert [row[0] for row in worst_frames_table(series, PICK)] == [3, 2, 4, 0, 1]
    # A dragged range holding the pick jumps to it; one without it ranks by subject present there.
    assert series.worst(PICK, 1, 4) == 3 and series.worst(PICK, 4, 5) == 4
    early = frame_series(subject_summary(worst_frame=2))  # the pick need not be its series' worst frame
    assert [row[0] for row in worst_frames_table(early, PICK)] == [2, 3, 4, 0, 1]

    plain = frame_series(subject_summary(worst_frame=5, worst_by=None))
    assert plain.pick_label() == "module's pick (frame 5)" and plain.pick_key() == "ghost"
    assert worst_frames_table(plain, PICK)[0][0] == 5


def test_failed_gates_show_their_frames_and_are_jump_targets():
    summary = subject_summary()
    # Failed gates that name a frame, in the module's order; flip (whole clip) has no frame to jump to.
    assert gate_jumps(summary) == [[3, "subject_lost", "2–3", LOST], [1, "ghosting", "0–1", GHOST]]
    update = _gate_table(summary)
    assert update["visible"] is True and update["value"]["frame"].tolist() == [3, 1]
    assert _gate_table(subject_summary(gates={"subject_moved": _gate(5.0, 30.7, True, [4, 4], 4)}))[
        "visible"] is False

    text = suggestion_html(summary)
    assert f"{LOST} <small>[subject_lost · frames 2–3 · worst frame 3]</small>" in text
    assert "[ghosting · frames 0–1 · worst frame 1]" in text and f"{FLIP} <small>[flip · whole clip]</small>" in text
    assert text.count(LOST) == 1 and "Not measured: LPIPS (offline)." in text
    assert "Look first at <b>frame 3</b> (subject_lost)" in text
    panel = quality_html(SimpleNamespace(metrics_status="ok", metrics_message="", metrics=summary))
    assert "worst_by:" not in panel and "[subject_lost · frames 2–3 · worst frame 3]" in panel

    # A summary stored before gates had sentences: its reasons as stored.
    old = subject_summary(gates={"lpips_delta": _gate(0.05, 0.04, False)}, worst_by=None,
                          suggestion_reasons=["lpips_delta 0.0500 > 0.04"])
    assert "reject — lpips_delta 0.0500 &gt; 0.04<br>" in suggestion_html(old) and gate_jumps(old) == []

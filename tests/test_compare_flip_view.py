"""The Compare tab's FLIP view: the FLIP error map PNGs studio.quality renders reach the tab as an analysis view,
with a caption carrying the frame's FLIP, and FLIP and the temporal error are per-frame series (no browser)."""

from __future__ import annotations

import numpy as np

import studio.quality as quality
from studio.quality import ClipData, OverlayCache, synth, write_clip
from studio.quality.summary import QualitySummary
from studio.ui.compare import OVERLAY_KINDS, VIEWS
from studio.ui.compare_data import Overlays, frame_series


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

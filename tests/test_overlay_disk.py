"""Overlay images take far less disk than one PNG per frame and kind (issue 19 item 13: they took more than the
clips): one H.264 4:4:4 video per kind, every frame read back in order and close to what was rendered; a cache
of the PNG era is still read, and recomputing it removes its PNGs."""

from __future__ import annotations

import json

import cv2
import numpy as np

from quality import ClipData, OverlayCache, compare_clips, read_clip, synth, write_clip
from quality.overlays import _write_png, read_overlay_frame, render_diff_heatmap, render_ghost_overlay


def test_overlays_are_videos_read_back_frame_by_frame(tmp_path):
    frames = synth.render_clip(synth.make_scene(3, width=448, height=256, frames=14, speed=5.0))
    candidate = synth.jpeg(synth.noise(frames, 3, seed=2), 70)
    paths = tmp_path / "b.mp4", tmp_path / "c.mp4"
    write_clip(paths[0], ClipData(frames, 24.0))
    write_clip(paths[1], ClipData(candidate, 24.0))
    cached = OverlayCache(tmp_path / "overlays", lpips=False, workers=1).get_or_compute("pair", *paths)
    folder = tmp_path / "overlays" / "pair"
    assert {p.name for p in folder.iterdir()} == {"diff.mp4", "ghost.mp4", "flip.mp4", "manifest.json",
                                                   "summary.json"}
    comparison = compare_clips(read_clip(paths[0]), read_clip(paths[1]), lpips=False, flip=False)
    as_png = 0
    for index in (0, 5, 12, 13):  # across the keyframe every 12 frames
        for kind, render in (("diff", render_diff_heatmap), ("ghost", render_ghost_overlay)):
            rendered = render(comparison, index)
            shown = read_overlay_frame(getattr(cached, f"{kind}_pngs")[index], index)
            assert shown.shape == rendered.shape and cv2.PSNR(shown, rendered) > 30
            if index < 13:  # the neighbour frame is further from it than the encoding is
                neighbour = render(comparison, index + 1)
                assert cv2.PSNR(shown, rendered) > cv2.PSNR(shown, neighbour)
            as_png += len(cv2.imencode(".png", rendered, [cv2.IMWRITE_PNG_COMPRESSION, 1])[1])
    per_frame_png = as_png / 8 * 3  # three kinds
    videos = sum((folder / f"{kind}.mp4").stat().st_size for kind in ("diff", "ghost", "flip"))
    assert videos < per_frame_png * comparison.frames / 4
    assert read_overlay_frame(cached.diff_pngs[0], comparison.frames) is None


def test_a_png_cache_is_still_read_and_a_recomputation_removes_its_pngs(tmp_path):
    frames = synth.render_clip(synth.make_scene(4, width=224, height=128, frames=4, speed=3.0))
    paths = tmp_path / "b.mp4", tmp_path / "c.mp4"
    write_clip(paths[0], ClipData(frames, 24.0))
    write_clip(paths[1], ClipData(synth.noise(frames, 4, seed=1), 24.0))
    cache = OverlayCache(tmp_path / "overlays", lpips=False, workers=1)
    fresh = cache.get_or_compute("pair", *paths)
    folder = fresh.directory
    manifest = json.loads((folder / "manifest.json").read_text())
    pngs = {}
    for kind in ("diff", "ghost", "flip"):  # rewrite it as a version-2 cache: one PNG per frame
        pngs[kind] = [f"{kind}_{i:04d}.png" for i in range(manifest["frames"])]
        for i, name in enumerate(pngs[kind]):
            _write_png(folder / name, read_overlay_frame(folder / f"{kind}.mp4", i))
        (folder / f"{kind}.mp4").unlink()
    (folder / "manifest.json").write_text(json.dumps({**manifest, "version": 2, **pngs}))
    old = cache.get_or_compute("pair", *paths)
    assert not old.computed and old.ghost_pngs[1].name == "ghost_0001.png"
    assert np.array_equal(read_overlay_frame(old.ghost_pngs[1], 1), cv2.cvtColor(
        cv2.imread(str(folder / "ghost_0001.png")), cv2.COLOR_BGR2RGB))
    (folder / "manifest.json").unlink()  # stale: recomputed, and the PNGs go
    again = cache.get_or_compute("pair", *paths)
    assert again.computed and not list(folder.glob("*.png"))

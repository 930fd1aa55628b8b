"""Images for the compare view (abs-diff heatmap, ghost overlay, FLIP error map) and their on-disk cache per pair.

The renderers return uint8 RGB (H, W, 3) at the clip's full resolution. The cache keeps, under
root_dir/<pair_key>/: summary.json, diff.mp4, ghost.mp4 and (when FLIP ran) flip.mp4 (every frame's overlay, in
frame order), and manifest.json, written last, which names the source files (size and mtime) the cache was computed
from. Every file is written to a temporary name and renamed into place, so a reader never sees a half-written file
and a crash leaves no manifest. `read_overlay_frame(path, index)` reads one frame back.

Why videos (issue 19 item 13): one PNG per frame and kind took more disk than the clips themselves (a 24-frame
672x384 pair: 26.7 MB of PNGs against 0.29 MB of clips). H.264 at 4:4:4 (no chroma subsampling: the colour maps'
edges stay sharp), CRF 12, a keyframe every 12 frames (a frame is read by decoding at most 12): 3.1 MB for the same
pair, mean PSNR against the rendered images 33.5 dB (the difference heatmap of a noisy candidate, the worst case),
39.5 (FLIP), 46.5 (ghost overlay). Caches of manifest version 2 (PNG files) are still read; a recomputation deletes
their PNGs.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from .clipio import read_clip
from .compare import Comparison, compare_clips
from .errors import QualityError
from .gates import Gates

DIFF_FULL_SCALE = 64  # abs-diff (8-bit levels) shown at the top of the colour map; fixed so frames compare
GHOST_COLOUR = np.array([255, 0, 200], np.float32)  # magenta: rare in natural footage
GHOST_OPACITY = 0.65
_MANIFEST_VERSION = 3  # 2: flip PNGs; 3: one MP4 per overlay kind
_READABLE_VERSIONS = (2, 3)
OVERLAY_CRF = 12
OVERLAY_GOP = 12
_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _check_index(comparison: Comparison, index: int) -> None:
    if not 0 <= index < comparison.frames:
        raise QualityError(f"frame index {index} out of range 0..{comparison.frames - 1}")


def render_diff_heatmap(comparison: Comparison, frame_index: int) -> np.ndarray:
    """uint8 (H, W, 3) RGB: |candidate - baseline| through the inferno colour map, full colour at 64 levels."""
    _check_index(comparison, frame_index)
    scaled = cv2.convertScaleAbs(comparison.absdiff[frame_index], alpha=255.0 / DIFF_FULL_SCALE)
    return cv2.cvtColor(cv2.applyColorMap(scaled, cv2.COLORMAP_INFERNO), cv2.COLOR_BGR2RGB)


def render_ghost_overlay(comparison: Comparison, frame_index: int) -> np.ndarray:
    """uint8 (H, W, 3) RGB: the baseline frame with the ghost heatmap blended on in magenta, outlined."""
    _check_index(comparison, frame_index)
    frame = comparison.baseline.frames[frame_index].astype(np.float32)
    heat = comparison.ghost_heatmap(frame_index)
    weight = (GHOST_OPACITY * heat)[..., None]
    out = np.clip(frame * (1 - weight) + GHOST_COLOUR * weight + 0.5, 0, 255).astype(np.uint8)
    edge = (heat >= 0.2).astype(np.uint8)
    if edge.any():  # an outline keeps faint (low-opacity) ghost regions findable at a glance
        contours, _ = cv2.findContours(edge, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
        cv2.drawContours(out, contours, -1, tuple(int(c) for c in GHOST_COLOUR), 2)
    return out


def render_flip_overlay(comparison: Comparison, frame_index: int) -> np.ndarray:
    """uint8 (H, W, 3) RGB: the frame's FLIP error map (0..1) through the magma colour map, as FLIP shows it."""
    _check_index(comparison, frame_index)
    error = comparison.flip_map(frame_index)
    scaled = np.clip(error * 255.0 + 0.5, 0, 255).astype(np.uint8)
    return cv2.cvtColor(cv2.applyColorMap(scaled, cv2.COLORMAP_MAGMA), cv2.COLOR_BGR2RGB)


def _atomic_write(path: Path, data: bytes) -> None:
    """Write bytes to a temporary file in the same folder, then rename over `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _write_png(path: Path, rgb: np.ndarray) -> None:
    ok, buf = cv2.imencode(".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_PNG_COMPRESSION, 1])
    if not ok:
        raise OSError(f"PNG encoding failed for {path}")
    _atomic_write(path, buf.tobytes())


def _write_video(path: Path, frames) -> None:
    """uint8 RGB frames as H.264 4:4:4 (see the module docstring), through a temporary name."""
    import av

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.mp4")
    try:
        with av.open(os.fspath(tmp), "w") as container:
            stream = None
            for frame in frames:
                if stream is None:
                    stream = container.add_stream("libx264", rate=24)
                    stream.width, stream.height, stream.pix_fmt = frame.shape[1], frame.shape[0], "yuv444p"
                    stream.options = {"crf": str(OVERLAY_CRF), "preset": "veryfast", "g": str(OVERLAY_GOP),
                                      "threads": "1"}
                container.mux(stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")))
            if stream is not None:
                container.mux(stream.encode())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_overlay_frame(path: str | os.PathLike, index: int) -> np.ndarray | None:
    """Frame `index` of a cached overlay as uint8 RGB, from its video (version 3) or its own image file (version
    2); None when the file cannot be read or has no such frame."""
    path = Path(path)
    if path.suffix.lower() != ".mp4":
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        return None if image is None else cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    import av

    try:
        with av.open(os.fspath(path)) as container:
            stream = container.streams.video[0]
            start = (index // OVERLAY_GOP) * OVERLAY_GOP  # the keyframe at or before it
            ticks = int(start / (stream.average_rate * stream.time_base)) if start else 0
            container.seek(ticks, stream=stream, backward=True, any_frame=False)
            for frame in container.decode(stream):
                number = round(float(frame.pts * stream.time_base * stream.average_rate)) if frame.pts is not None \
                    else None
                if number == index:
                    return frame.to_ndarray(format="rgb24")
                if number is not None and number > index:
                    return None
    except (OSError, av.error.FFmpegError, ValueError):
        return None
    return None


def _fingerprint(path: str | os.PathLike) -> dict[str, Any]:
    st = os.stat(path)
    return {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


@dataclass
class CachedComparison:
    """A pair's cached results: the summary (Comparison.summary()) and paths to its files."""

    summary: dict[str, Any]
    directory: Path
    summary_path: Path
    diff_pngs: list[Path]
    ghost_pngs: list[Path]
    computed: bool  # False when everything came from the cache
    flip_pngs: list[Path] = field(default_factory=list)  # empty when FLIP did not run (summary's flip_reason)

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary, "directory": str(self.directory), "summary_path": str(self.summary_path),
                "diff_pngs": [str(p) for p in self.diff_pngs], "ghost_pngs": [str(p) for p in self.ghost_pngs],
                "flip_pngs": [str(p) for p in self.flip_pngs], "computed": self.computed}


class OverlayCache:
    """Summary JSON and per-frame overlay PNGs of each pair, on disk under root_dir/pair_key/."""

    def __init__(self, root_dir: str | os.PathLike, gates: Gates | None = None, align: bool = False,
                 lpips: bool = True, workers: int = 2, lpips_weights: str | None = None):
        self.root = Path(root_dir)
        self.gates, self.align, self.lpips, self.workers = gates, align, lpips, workers
        self.lpips_weights = lpips_weights

    def directory(self, pair_key: str) -> Path:
        """root_dir/pair_key; the key must be a plain file name (letters, digits, '.', '_', '-')."""
        if not _KEY.match(pair_key) or pair_key in {".", ".."}:
            raise QualityError(f"pair_key {pair_key!r} must be 1-128 letters, digits, '.', '_' or '-'")
        return self.root / pair_key

    def get_or_compute(self, pair_key: str, baseline_path: str | os.PathLike,
                       candidate_path: str | os.PathLike) -> CachedComparison:
        """The cached result when it matches these source files, else compute, write and return it."""
        folder = self.directory(pair_key)
        sources = {"baseline": _fingerprint(baseline_path), "candidate": _fingerprint(candidate_path)}
        cached = self._load(folder, sources)
        if cached is not None:
            return cached
        comparison = compare_clips(read_clip(baseline_path), read_clip(candidate_path), gates=self.gates,
                                   align=self.align, lpips=self.lpips, workers=self.workers,
                                   lpips_weights=self.lpips_weights)
        return self._store(folder, sources, comparison)

    def _load(self, folder: Path, sources: dict[str, Any]) -> CachedComparison | None:
        try:
            manifest = json.loads((folder / "manifest.json").read_text())
        except (OSError, ValueError):
            return None
        if manifest.get("version") not in _READABLE_VERSIONS or manifest.get("sources") != sources:
            return None
        if manifest["version"] == 3:  # one video per kind: every frame's entry names it
            frames = manifest["frames"]
            diff, ghost = [folder / manifest["diff"]] * frames, [folder / manifest["ghost"]] * frames
            flip = [folder / manifest["flip"]] * frames if manifest["flip"] else []
        else:
            diff = [folder / n for n in manifest["diff"]]
            ghost = [folder / n for n in manifest["ghost"]]
            flip = [folder / n for n in manifest["flip"]]
        summary_path = folder / manifest["summary"]
        if not all(p.is_file() for p in [summary_path, *diff, *ghost, *flip]):
            return None
        return CachedComparison(json.loads(summary_path.read_text()), folder, summary_path, diff, ghost, False, flip)

    def _store(self, folder: Path, sources: dict[str, Any], comparison: Comparison) -> CachedComparison:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "manifest.json").unlink(missing_ok=True)  # stale until the new one is complete
        for old in folder.glob("*_[0-9][0-9][0-9][0-9].png"):  # a version-2 cache's frames
            old.unlink(missing_ok=True)
        renderers = {"diff": render_diff_heatmap, "ghost": render_ghost_overlay}
        if comparison.flip_maps is not None:
            renderers["flip"] = render_flip_overlay
        videos = {kind: folder / f"{kind}.mp4" for kind in renderers}

        def write(kind: str) -> None:
            _write_video(videos[kind], (renderers[kind](comparison, i) for i in range(comparison.frames)))

        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            list(pool.map(write, renderers))
        frames = comparison.frames
        diff, ghost = [videos["diff"]] * frames, [videos["ghost"]] * frames
        flip = [videos["flip"]] * frames if "flip" in videos else []
        summary = comparison.summary()
        summary_path = folder / "summary.json"
        _atomic_write(summary_path, json.dumps(summary, indent=1).encode())
        manifest = {"version": _MANIFEST_VERSION, "sources": sources, "summary": summary_path.name, "frames": frames,
                    "diff": videos["diff"].name, "ghost": videos["ghost"].name,
                    "flip": videos["flip"].name if "flip" in videos else None, "notes": comparison.notes}
        _atomic_write(folder / "manifest.json", json.dumps(manifest, indent=1).encode())
        return CachedComparison(summary, folder, summary_path, diff, ghost, True, flip)

"""Synthetic paired clips for calibrating the ghost detector and benchmarking the quality module.

A `Scene` is a textured background with one or more textured subjects moving along smooth paths. Rendering is
deterministic in the seed, and a subject can be drawn at any (fractional) time, which is how a ghost is planted: a
second copy of the subject at the position it had `lag` frames earlier (or later), at a given opacity. The
non-ghost degradations the detector must ignore (blur, noise, colour shift, brightness flicker, a subject drawn
somewhere else) are plain functions of the rendered frames.

Frames are uint8 RGB, shape (T, H, W, 3). Audio is float32 stereo, shape (2, N).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import cv2
import numpy as np


@dataclass(frozen=True)
class Subject:
    """One moving subject. Position p(t) = start + velocity * t + wobble * sin(t * wobble_rate), in pixels."""

    sprite: np.ndarray  # float32 (h, w, 3) in [0, 255]
    alpha: np.ndarray  # float32 (h, w) in [0, 1], anti-aliased
    start: tuple[float, float]  # (x, y) of the sprite's top-left corner at t = 0
    velocity: tuple[float, float]  # pixels per frame
    wobble: tuple[float, float] = (0.0, 0.0)
    wobble_rate: float = 0.15

    def position(self, t: float) -> tuple[float, float]:
        """Top-left corner (x, y) at time t (frames, may be fractional or negative)."""
        s = np.sin(t * self.wobble_rate)
        return (self.start[0] + self.velocity[0] * t + self.wobble[0] * s,
                self.start[1] + self.velocity[1] * t + self.wobble[1] * s)


@dataclass(frozen=True)
class Scene:
    """A background (wider than the frame when the camera pans) and subjects. `pan` >= 0 is pixels per frame."""

    width: int
    height: int
    frames: int
    background: np.ndarray  # float32 (height, width + pan margin, 3)
    subjects: tuple[Subject, ...]
    pan: float = 0.0
    fps: float = 24.0


@dataclass(frozen=True)
class Ghost:
    """A planted ghost: subject `subject` drawn again at its position of time t - lag, at `opacity`.

    mode "sprite" composites only the subject copy; mode "blend" double-exposes the whole frame
    ((1 - opacity) * frame(t) + opacity * frame(t - lag)), which also dims the original subject.
    """

    opacity: float
    lag: float
    mode: str = "sprite"
    subject: int = 0


def _smooth_noise(rng: np.random.Generator, h: int, w: int, cell: int) -> np.ndarray:
    """Band-limited noise (h, w) in about [-1, 1]: random values on a coarse grid, upsampled bicubically."""
    coarse = rng.standard_normal((max(2, h // cell + 2), max(2, w // cell + 2))).astype(np.float32)
    return cv2.resize(coarse, (w, h), interpolation=cv2.INTER_CUBIC)


def _background(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A textured background (h, w, 3) float32: coloured large-scale noise, a grating, fine noise, a few edges."""
    base = rng.uniform(60, 180, size=3).astype(np.float32)
    img = np.empty((h, w, 3), np.float32)
    large = _smooth_noise(rng, h, w, max(8, h // 6))
    mid = _smooth_noise(rng, h, w, max(3, h // 40))
    fine = rng.standard_normal((h, w)).astype(np.float32)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    angle, freq = rng.uniform(0, np.pi), rng.uniform(0.02, 0.06)
    grating = np.sin((xx * np.cos(angle) + yy * np.sin(angle)) * freq * 2 * np.pi)
    for c in range(3):
        tint = rng.uniform(0.6, 1.4)
        img[..., c] = base[c] + tint * (25 * large + 12 * mid + 10 * grating) + 4 * fine
    for _ in range(6):  # hard edges: rectangles of flat colour, so blur and flow have something to bite on
        x0, y0 = int(rng.integers(0, w - 8)), int(rng.integers(0, h - 8))
        x1, y1 = x0 + int(rng.integers(8, w // 5)), y0 + int(rng.integers(8, h // 5))
        img[y0:y1, x0:x1] = img[y0:y1, x0:x1] * 0.5 + rng.uniform(20, 235, size=3).astype(np.float32) * 0.5
    return np.clip(img, 0, 255)


def _subject_sprite(rng: np.random.Generator, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """A textured ellipse or rounded box: sprite (h, w, 3) float32 and anti-aliased alpha (h, w) float32."""
    big = np.zeros((h * 4, w * 4), np.uint8)
    if rng.random() < 0.5:
        cv2.ellipse(big, (w * 2, h * 2), (w * 2 - 4, h * 2 - 4), 0, 0, 360, 255, -1)
    else:
        r = min(h, w)
        cv2.rectangle(big, (r // 2, 4), (w * 4 - r // 2, h * 4 - 4), 255, -1)
        cv2.rectangle(big, (4, r // 2), (w * 4 - 4, h * 4 - r // 2), 255, -1)
        for cx, cy in ((r // 2, r // 2), (w * 4 - r // 2, r // 2), (r // 2, h * 4 - r // 2),
                       (w * 4 - r // 2, h * 4 - r // 2)):
            cv2.circle(big, (cx, cy), r // 2 - 4, 255, -1)
    alpha = cv2.resize(big, (w, h), interpolation=cv2.INTER_AREA).astype(np.float32) / 255.0
    colour = rng.uniform(0, 255, size=3).astype(np.float32)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    stripes = np.sin((xx + 0.5 * yy) * rng.uniform(0.15, 0.35))
    blotch = _smooth_noise(rng, h, w, max(3, h // 6))
    sprite = np.empty((h, w, 3), np.float32)
    for c in range(3):
        sprite[..., c] = colour[c] + 40 * stripes * rng.uniform(0.5, 1.0) + 30 * blotch
    return np.clip(sprite, 0, 255), alpha


def make_scene(seed: int, width: int = 672, height: int = 384, frames: int = 24, subjects: int = 1,
               speed: float | None = None, pan: float = 0.0, fps: float = 24.0) -> Scene:
    """A random scene. Subject size is 15-30% of the frame height; speed (px/frame) defaults to 1-2% of the width.

    Subjects start so that they stay inside the frame for the whole clip (and a little before and after, so ghosts
    at negative times still land on screen).
    """
    rng = np.random.default_rng(seed)
    if pan < 0:
        raise ValueError("pan must be >= 0")
    margin = int(np.ceil(pan * (frames + 40))) + 2 if pan else 0
    background = _background(rng, height, width + margin)
    made = []
    for _ in range(subjects):
        sh = int(height * rng.uniform(0.15, 0.3))
        sw = int(sh * rng.uniform(0.8, 1.6))
        sprite, alpha = _subject_sprite(rng, sh, sw)
        v = speed if speed is not None else width * rng.uniform(0.01, 0.02)
        direction = rng.uniform(-0.5, 0.5) + (np.pi if rng.random() < 0.5 else 0.0)
        vx, vy = v * np.cos(direction), v * np.sin(direction)
        # Centre the path so the subject is on screen from t = -10 to t = frames + 10.
        mid_t = frames / 2
        cx = width / 2 - sw / 2 + rng.uniform(-0.1, 0.1) * width - vx * mid_t
        cy = height / 2 - sh / 2 + rng.uniform(-0.1, 0.1) * height - vy * mid_t
        made.append(Subject(sprite, alpha, (cx, cy), (vx, vy),
                            wobble=(rng.uniform(0, 0.3) * v * 4, rng.uniform(0, 0.3) * v * 4)))
    return Scene(width, height, frames, background, tuple(made), pan, fps)


def _composite(frame: np.ndarray, subject: Subject, pos: tuple[float, float], opacity: float) -> None:
    """Alpha-blend the subject onto frame (H, W, 3) float32 in place, at sub-pixel position pos (x, y)."""
    h, w = subject.alpha.shape
    x0, y0 = int(np.floor(pos[0])) - 1, int(np.floor(pos[1])) - 1
    fx, fy = pos[0] - x0, pos[1] - y0
    shift = np.float32([[1, 0, fx], [0, 1, fy]])
    size = (w + 3, h + 3)
    sprite = cv2.warpAffine(subject.sprite, shift, size, flags=cv2.INTER_LINEAR)
    alpha = cv2.warpAffine(subject.alpha, shift, size, flags=cv2.INTER_LINEAR) * opacity
    H, W = frame.shape[:2]
    fx0, fy0, fx1, fy1 = max(x0, 0), max(y0, 0), min(x0 + size[0], W), min(y0 + size[1], H)
    if fx0 >= fx1 or fy0 >= fy1:
        return
    sx0, sy0 = fx0 - x0, fy0 - y0
    a = alpha[sy0:sy0 + fy1 - fy0, sx0:sx0 + fx1 - fx0, None]
    s = sprite[sy0:sy0 + fy1 - fy0, sx0:sx0 + fx1 - fx0]
    region = frame[fy0:fy1, fx0:fx1]
    region *= 1 - a
    region += a * s


def render_frame(scene: Scene, t: float, offsets: dict[int, tuple[float, float]] | None = None,
                 ghosts: tuple[Ghost, ...] = ()) -> np.ndarray:
    """Frame at time t as float32 (H, W, 3). `offsets` moves subjects (relocation); sprite ghosts are drawn on top."""
    if scene.pan:
        x = scene.pan * (t + 20)  # the camera starts 20 frames into the margin, so ghosts from t < 0 have background
        x0 = int(np.floor(x))
        bg = scene.background[:, x0:x0 + scene.width + 1]
        frame = cv2.warpAffine(bg, np.float32([[1, 0, -(x - x0)], [0, 1, 0]]), (scene.width, scene.height),
                               flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)
    else:
        frame = scene.background.copy()
    for i, subject in enumerate(scene.subjects):
        px, py = subject.position(t)
        dx, dy = (offsets or {}).get(i, (0.0, 0.0))
        _composite(frame, subject, (px + dx - scene.pan * t, py + dy), 1.0)
    for g in ghosts:
        if g.mode == "sprite":
            subject = scene.subjects[g.subject]
            px, py = subject.position(t - g.lag)
            _composite(frame, subject, (px - scene.pan * (t - g.lag), py), g.opacity)
    return frame


def render_clip(scene: Scene, ghost: Ghost | None = None,
                offsets: dict[int, tuple[float, float]] | None = None) -> np.ndarray:
    """All frames (T, H, W, 3) uint8, optionally with a planted ghost or relocated subjects."""
    out = np.empty((scene.frames, scene.height, scene.width, 3), np.uint8)
    for t in range(scene.frames):
        if ghost is not None and ghost.mode == "blend":
            f = (1 - ghost.opacity) * render_frame(scene, t, offsets) \
                + ghost.opacity * render_frame(scene, t - ghost.lag, offsets)
        else:
            f = render_frame(scene, t, offsets, (ghost,) if ghost is not None else ())
        out[t] = np.clip(f + 0.5, 0, 255).astype(np.uint8)
    return out


# ---- non-ghost degradations: each maps (T, H, W, 3) uint8 to the same shape ----

def blur(frames: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian blur of every frame."""
    return np.stack([cv2.GaussianBlur(f, (0, 0), sigma) for f in frames])


def noise(frames: np.ndarray, sigma: float, seed: int = 0) -> np.ndarray:
    """Independent Gaussian noise per pixel and frame (sigma in 8-bit levels)."""
    rng = np.random.default_rng(seed)
    noisy = frames.astype(np.float32) + rng.standard_normal(frames.shape, dtype=np.float32) * sigma
    return np.clip(noisy + 0.5, 0, 255).astype(np.uint8)


def colour_shift(frames: np.ndarray, gains: tuple[float, float, float],
                 offsets: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> np.ndarray:
    """Per-channel gain and offset, as a white-balance or grading change would give."""
    out = frames.astype(np.float32) * np.float32(gains) + np.float32(offsets)
    return np.clip(out + 0.5, 0, 255).astype(np.uint8)


def flicker(frames: np.ndarray, amplitude: float, seed: int = 0) -> np.ndarray:
    """Brightness gain varying per frame, uniform in [1 - amplitude, 1 + amplitude]."""
    rng = np.random.default_rng(seed)
    gains = 1 + rng.uniform(-amplitude, amplitude, size=len(frames)).astype(np.float32)
    out = frames.astype(np.float32) * gains[:, None, None, None]
    return np.clip(out + 0.5, 0, 255).astype(np.uint8)


def jpeg(frames: np.ndarray, quality: int) -> np.ndarray:
    """Per-frame JPEG round trip: blocky compression loss."""
    out = np.empty_like(frames)
    for i, f in enumerate(frames):
        _, buf = cv2.imencode(".jpg", f, [cv2.IMWRITE_JPEG_QUALITY, quality])
        out[i] = cv2.imdecode(buf, cv2.IMREAD_UNCHANGED)
    return out


@dataclass
class SynthAudio:
    """Stereo test audio: float32 (2, N) in [-1, 1] and its sample rate."""

    samples: np.ndarray
    sample_rate: int
    onsets_s: list[float] = field(default_factory=list)


def synth_audio(seconds: float, sample_rate: int = 32000, seed: int = 0) -> SynthAudio:
    """Tone bursts with sharp onsets over a quiet noise bed, different in the two channels.

    The onsets give the envelope cross-correlation an unambiguous peak, like speech or footsteps would.
    """
    rng = np.random.default_rng(seed)
    n = round(seconds * sample_rate)
    t = np.arange(n, dtype=np.float32) / sample_rate
    out = 0.01 * rng.standard_normal((2, n)).astype(np.float32)
    onsets = sorted(rng.uniform(0.05, max(0.1, seconds - 0.3), size=max(3, int(seconds * 6))).tolist())
    for onset in onsets:
        freq = rng.uniform(200, 2000)
        env = np.where(t >= onset, np.exp(-(t - onset) * rng.uniform(6, 20)), 0).astype(np.float32)
        tone = 0.25 * env * np.sin(2 * np.pi * freq * t)
        out[0] += tone * rng.uniform(0.5, 1.0)
        out[1] += tone * rng.uniform(0.5, 1.0)
    return SynthAudio(np.clip(out, -1, 1).astype(np.float32), sample_rate, onsets)

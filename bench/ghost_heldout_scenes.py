"""Held-out scenes for the ghost detector, written apart from quality/synth.py (the calibration generator).

Nothing here imports synth.py, and the choices differ on purpose, so the held-out set measures how the detector
generalises rather than how well it was fitted:
  - scenes: backgrounds of plasma (sums of sines), checkerboards with a gradient, or scattered discs; subjects are
    random star polygons or n-gons filled with plaid or per-subject noise textures, that rotate and breathe in
    size (calibration: noise backgrounds with a grating, rigid ellipses and rounded boxes);
  - motion: linear, circular, accelerating or zigzag paths (calibration: linear plus a small sine wobble), an
    optional camera pan, 1-3 subjects;
  - renderer: supersampling 1x or up to 3x (anti-aliasing; always 1x from 960 wide up), an optional shutter
    (motion blur from 3 sub-frame renders), an optional gamma curve and baked-in sensor grain, all drawn with
    cv2.fillPoly on sprites warped per frame (calibration: one sub-pixel-shifted sprite, no shutter, no gamma);
  - canvases 224x128 to 1344x768, 24 frames;
  - camera: as drawn (a pan on one scene in three), or, for the camera-motion suites, a pan on every scene
    ("pan") or a pan and a zoom in about the frame's centre ("pan-zoom"; the real model's clips pan and zoom).
A ghost is a copy of one subject drawn again at its pose of time t - lag (lag < 0: a lead, a future pose) at an
opacity, or a double exposure of the whole frame. The harmless differences are plain functions of the frames.

Frames are uint8 RGB (T, H, W, 3). Everything is deterministic in the scene seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cv2
import numpy as np


@dataclass(frozen=True)
class Actor:
    """One moving subject: a sprite (RGBA float32 at render scale), a path and a spin."""

    rgba: np.ndarray  # float32 (h, w, 4), colour 0-255, alpha 0-1
    path: str  # "linear" | "circle" | "accelerate" | "zigzag"
    origin: tuple[float, float]  # centre at t = 0, output pixels
    velocity: tuple[float, float]  # output pixels per frame (the mean velocity)
    spin: float  # radians per frame
    breathe: float  # relative size change amplitude

    def pose(self, t: float) -> tuple[float, float, float, float]:
        """(cx, cy, angle, scale) at time t in frames (any real t)."""
        vx, vy = self.velocity
        speed = math.hypot(vx, vy)
        if self.path == "linear":
            dx, dy = vx * t, vy * t
        elif self.path == "circle":  # an arc whose tangential speed is `speed`, radius ~ 12 frames of travel
            radius = max(speed * 12, 1e-6)
            phase = t * speed / radius
            dx, dy = radius * math.sin(phase), radius * (1 - math.cos(phase))
        elif self.path == "accelerate":  # speed grows from 0.4x to 1.6x of the mean over 24 frames
            k = 0.4 + 0.05 * t
            dx, dy = vx * k * t, vy * k * t
        else:  # zigzag: along the velocity, plus a sideways triangle wave
            side = (-vy / (speed + 1e-9), vx / (speed + 1e-9))
            tri = 2 * abs((t / 8.0) % 2 - 1) - 1
            dx, dy = vx * t + side[0] * speed * 3 * tri, vy * t + side[1] * speed * 3 * tri
        return (self.origin[0] + dx, self.origin[1] + dy, self.spin * t,
                1 + self.breathe * math.sin(t * 0.21))


@dataclass(frozen=True)
class Stage:
    """A scene: background (render scale, wider than the frame by the pan margin), actors, renderer settings."""

    width: int
    height: int
    frames: int
    background: np.ndarray  # float32 (H * ss, (W + margin) * ss, 3)
    actors: tuple[Actor, ...]
    pan: float  # output pixels per frame
    supersample: int
    shutter: bool
    gamma: float
    grain: float
    seed: int
    zoom: float = 0.0  # camera zoom per frame: the picture is scaled by 1 + zoom * t about the frame's centre

    def camera(self, t: float) -> np.ndarray:
        """3x3 affine (render scale) taking the unzoomed frame at time t to the screen: the zoom about the centre."""
        z = 1.0 + self.zoom * t
        cx, cy = self.width * self.supersample / 2, self.height * self.supersample / 2
        return np.array([[z, 0, cx * (1 - z)], [0, z, cy * (1 - z)], [0, 0, 1]], np.float64)

    def on_screen(self, x: float, y: float, t: float) -> tuple[float, float]:
        """Where a point drawn at output pixel (x, y) of the unzoomed frame at time t lands on the screen."""
        ss = self.supersample
        sx, sy, _ = self.camera(t) @ (x * ss, y * ss, 1.0)
        return sx / ss, sy / ss


def _plasma(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    out = np.zeros((h, w, 3), np.float32)
    for _ in range(5):
        fx, fy = rng.uniform(-1, 1, 2) * rng.uniform(2, 14) * 2 * np.pi / max(h, w)
        wave = np.sin(xx * fx + yy * fy + rng.uniform(0, 2 * np.pi))
        out += wave[..., None] * rng.uniform(-35, 35, 3).astype(np.float32)
    return out + rng.uniform(70, 170, 3).astype(np.float32)


def _checker(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    cell = int(rng.integers(max(4, h // 24), max(6, h // 6)))
    yy, xx = np.mgrid[0:h, 0:w]
    board = ((yy // cell + xx // cell) % 2).astype(np.float32)
    a, b = rng.uniform(40, 210, 3), rng.uniform(40, 210, 3)
    ramp = np.linspace(-30, 30, w, dtype=np.float32)[None, :, None]
    return (board[..., None] * a + (1 - board[..., None]) * b + ramp).astype(np.float32)


def _discs(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    img = np.empty((h, w, 3), np.float32)
    img[:] = rng.uniform(50, 200, 3)
    for _ in range(int(w * h / 900) + 10):
        centre = (int(rng.integers(0, w)), int(rng.integers(0, h)))
        radius = int(rng.integers(2, max(3, h // 10)))
        cv2.circle(img, centre, radius, tuple(float(c) for c in rng.uniform(20, 235, 3)), -1, cv2.LINE_AA)
    return img


def _texture(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Subject fill (h, w, 3): a plaid of two gratings or coarse coloured noise, around a base colour."""
    base = rng.uniform(30, 225, 3).astype(np.float32)
    if rng.random() < 0.5:
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        period = rng.uniform(4, 12) * max(1.0, h / 40)
        plaid = np.sin(xx * 2 * np.pi / period) + np.cos(yy * 2 * np.pi / (period * 1.3))
        return np.clip(base + plaid[..., None] * rng.uniform(15, 45, 3).astype(np.float32), 0, 255)
    coarse = rng.uniform(-50, 50, (max(2, h // 6), max(2, w // 6), 3)).astype(np.float32)
    return np.clip(base + cv2.resize(coarse, (w, h), interpolation=cv2.INTER_LINEAR), 0, 255)


def _sprite(rng: np.random.Generator, size: int) -> np.ndarray:
    """RGBA float32 (size, size, 4): a random star or n-gon with a texture, alpha anti-aliased by cv2."""
    n = int(rng.integers(3, 9))
    star = rng.random() < 0.5
    angles = np.sort(rng.uniform(0, 2 * np.pi, n * (2 if star else 1)))
    radii = np.where(np.arange(len(angles)) % 2 == 1, 0.45, 1.0) if star else rng.uniform(0.7, 1.0, len(angles))
    r = size * 0.48
    pts = np.stack([size / 2 + r * radii * np.cos(angles), size / 2 + r * radii * np.sin(angles)], axis=1)
    mask = np.zeros((size, size), np.uint8)
    cv2.fillPoly(mask, [np.round(pts * 16).astype(np.int32)], 255, cv2.LINE_AA, shift=4)
    rgba = np.empty((size, size, 4), np.float32)
    rgba[..., :3] = _texture(rng, size, size)
    rgba[..., 3] = mask.astype(np.float32) / 255.0
    return rgba


CAMERAS = ("as-drawn", "pan", "pan-zoom")


def make_stage(seed: int, width: int, height: int, frames: int = 24, speed: float | None = None,
               subjects: int | None = None, camera: str = "as-drawn") -> Stage:
    """A random held-out scene. speed: subject speed in output pixels per frame (default: 0.5-3 % of the width).
    camera: "as-drawn" (the scene's own draw: no pan on two scenes in three), "pan" (every scene pans 0.3-0.8 % of
    a 224-wide frame per frame, either way) or "pan-zoom" (that pan and a zoom in of 0.4-1.2 % per frame, 10-29 %
    over 24 frames). The camera's own draws come from a separate generator, so the scene is otherwise the same."""
    if camera not in CAMERAS:
        raise ValueError(f"camera must be one of {CAMERAS}, not {camera!r}")
    rng = np.random.default_rng(10_000 + seed)
    # Supersampling 1x or up to 3x, capped so the render canvas stays within ~1344x768 x 1-3 (CPU time).
    ss = int(rng.choice([1, max(1, min(3, 1344 // width))]))
    pan = float(rng.choice([0.0, 0.0, rng.uniform(0.2, 0.8) * width / 224]))
    zoom = 0.0
    if camera != "as-drawn":
        cam = np.random.default_rng(20_000 + seed)
        pan = float(cam.uniform(0.3, 0.8) * width / 224 * cam.choice([-1.0, 1.0]))
        zoom = float(cam.uniform(0.004, 0.012)) if camera == "pan-zoom" else 0.0
    margin = int(math.ceil(abs(pan) * (frames + 30))) + 2
    bg_h, bg_w = height * ss, (width + margin) * ss
    background = (_plasma, _checker, _discs)[int(rng.integers(0, 3))](rng, bg_h, bg_w)
    count = subjects if subjects is not None else int(rng.choice([1, 1, 2, 3]))
    actors = []
    for _ in range(count):
        size = int(height * rng.uniform(0.22, 0.4))
        v = speed if speed is not None else width * math.exp(rng.uniform(math.log(0.005), math.log(0.03)))
        heading = rng.uniform(0, 2 * np.pi)
        vx, vy = v * math.cos(heading), v * math.sin(heading) * 0.6
        # Keep the path near the middle: centre it on the clip's midpoint.
        origin = (width / 2 - vx * frames / 2 + rng.uniform(-0.12, 0.12) * width,
                  height / 2 - vy * frames / 2 + rng.uniform(-0.12, 0.12) * height)
        actors.append(Actor(_sprite(rng, size * ss), str(rng.choice(["linear", "circle", "accelerate", "zigzag"])),
                            origin, (vx, vy), float(rng.uniform(-0.04, 0.04)), float(rng.uniform(0, 0.06))))
    return Stage(width, height, frames, background, tuple(actors), pan, ss, bool(rng.random() < 0.3),
                 float(rng.choice([1.0, 1.0, 0.8, 1.25])), float(rng.choice([0.0, 0.0, 1.5])), seed, zoom)


def _paste(canvas: np.ndarray, actor: Actor, t: float, stage: Stage, opacity: float) -> None:
    """Composite the actor at its pose of time t onto canvas (render scale) in place, through the camera's zoom
    at time t (the pan is in the actor's origin, see _scene_at)."""
    cx, cy, angle, scale = actor.pose(t)
    ss = stage.supersample
    h, w = actor.rgba.shape[:2]
    m = cv2.getRotationMatrix2D((w / 2, h / 2), math.degrees(angle), scale)
    m[0, 2] += cx * ss - w / 2
    m[1, 2] += cy * ss - h / 2
    m = (stage.camera(t) @ np.vstack([m, [0, 0, 1]]))[:2]
    size = (canvas.shape[1], canvas.shape[0])
    warped = cv2.warpAffine(actor.rgba, m, size, flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT)
    alpha = warped[..., 3:4] * opacity
    canvas *= 1 - alpha
    canvas += alpha * warped[..., :3]


def _scene_at(stage: Stage, t: float, copies: tuple[tuple[int, float, float], ...] = (),
              offset: tuple[float, float] = (0.0, 0.0)) -> np.ndarray:
    """One render-scale frame at time t: background under the camera, actors, then ghost copies
    (actor index, lag, opacity) at their on-screen poses of time t - lag."""
    ss = stage.supersample
    x = stage.pan * (t + 15) * ss + (abs(stage.pan) * 51 * ss if stage.pan < 0 else 0)  # leftward: start right
    m = np.float32((stage.camera(t) @ [[1, 0, -x + offset[0] * ss], [0, 1, offset[1] * ss], [0, 0, 1]])[:2])
    canvas = cv2.warpAffine(stage.background, m, (stage.width * ss, stage.height * ss), flags=cv2.INTER_LINEAR,
                            borderMode=cv2.BORDER_REFLECT)

    def moved(actor: Actor, when: float) -> Actor:  # the camera pans, so the actor appears moving the other way
        return Actor(actor.rgba, actor.path, (actor.origin[0] - stage.pan * when + offset[0],
                                              actor.origin[1] + offset[1]), actor.velocity, actor.spin, actor.breathe)

    for actor in stage.actors:
        _paste(canvas, moved(actor, t), t, stage, 1.0)
    # A copy shows the subject where frame t - lag showed it on screen (what attention to that frame's tokens
    # brings back), not where the world put it then.
    for index, lag, opacity in copies:
        _paste(canvas, moved(stage.actors[index], t - lag), t - lag, stage, opacity)
    return canvas


def _finish(stage: Stage, canvas: np.ndarray, t: int) -> np.ndarray:
    """Render scale float -> output uint8: downsample, gamma, grain (seeded per frame: identical in both clips)."""
    out = canvas
    if stage.supersample > 1:
        out = cv2.resize(canvas, (stage.width, stage.height), interpolation=cv2.INTER_AREA)
    out = 255.0 * np.power(np.clip(out, 0, 255) / 255.0, 1.0 / stage.gamma)
    if stage.grain:
        rng = np.random.default_rng(stage.seed * 1000 + t)
        out = out + rng.normal(0, stage.grain, out.shape)
    return np.clip(out + 0.5, 0, 255).astype(np.uint8)


def render(stage: Stage, copies: tuple[tuple[int, float, float], ...] = (), time_offset: float = 0.0,
           offset: tuple[float, float] = (0.0, 0.0), blend: tuple[float, float] | None = None) -> np.ndarray:
    """The clip (T, H, W, 3) uint8. copies: ghost copies (actor, lag, opacity); time_offset: the whole clip shown
    that many frames late; offset: the whole picture shifted (pixels); blend (lag, opacity): a double exposure."""
    frames = np.empty((stage.frames, stage.height, stage.width, 3), np.uint8)
    shutter = (-0.25, 0.0, 0.25) if stage.shutter else (0.0,)
    for t in range(stage.frames):
        when = t - time_offset
        acc = np.mean([_scene_at(stage, when + s, copies, offset) for s in shutter], axis=0)
        if blend is not None:
            lag, opacity = blend
            earlier = np.mean([_scene_at(stage, when - lag + s, (), offset) for s in shutter], axis=0)
            acc = (1 - opacity) * acc + opacity * earlier
        frames[t] = _finish(stage, acc, t)
    return frames


def mean_speed(stage: Stage, actor: int = 0) -> float:
    """Mean on-screen speed of an actor over the clip, output pixels per frame (pan included)."""
    a = stage.actors[actor]
    return float(np.mean([math.dist(_screen(stage, a, t + 1), _screen(stage, a, t)) for t in range(stage.frames - 1)]))


def copy_displacement(stage: Stage, lag: int, actor: int = 0) -> float:
    """Median on-screen distance between the actor and its copy from `lag` frames away, output pixels."""
    a = stage.actors[actor]
    return float(np.median([math.dist(_screen(stage, a, t), _screen(stage, a, t - lag)) for t in range(stage.frames)]))


def _screen(stage: Stage, actor: Actor, t: float) -> tuple[float, float]:
    """The actor's centre on the screen at time t (output pixels): its pose, the pan, the zoom of time t. A copy from
    t - lag is drawn where frame t - lag showed it, so this is also where that copy sits."""
    x, y = actor.pose(t)[:2]
    return stage.on_screen(x - stage.pan * t, y, t)


# ---- harmless differences: (T, H, W, 3) uint8 -> same; seeded where random ----

def gaussian_blur(frames: np.ndarray, sigma: float) -> np.ndarray:
    return np.stack([cv2.GaussianBlur(f, (0, 0), sigma) for f in frames])


def sensor_noise(frames: np.ndarray, sigma: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(frames + rng.normal(0, sigma, frames.shape) + 0.5, 0, 255).astype(np.uint8)


def colour_matrix(frames: np.ndarray, seed: int, strength: float) -> np.ndarray:
    """A random 3x3 colour matrix near identity plus an offset, like a different grade."""
    rng = np.random.default_rng(seed)
    m = np.eye(3) + rng.uniform(-strength, strength, (3, 3))
    off = rng.uniform(-12, 12, 3) * strength / 0.1
    out = frames.astype(np.float32) @ m.T.astype(np.float32) + off.astype(np.float32)
    return np.clip(out + 0.5, 0, 255).astype(np.uint8)


def flicker(frames: np.ndarray, amplitude: float, seed: int) -> np.ndarray:
    """Per-frame gain and offset drawn independently: exposure flicker."""
    rng = np.random.default_rng(seed)
    gains = 1 + rng.uniform(-amplitude, amplitude, len(frames))
    offsets = rng.uniform(-amplitude, amplitude, len(frames)) * 40
    out = frames.astype(np.float32) * gains[:, None, None, None].astype(np.float32) \
        + offsets[:, None, None, None].astype(np.float32)
    return np.clip(out + 0.5, 0, 255).astype(np.uint8)

"""Procedural "shapes" dataset for the embedded h3-nano: coloured shapes moving over simple backgrounds, with sound.

Everything here is a pure function of a seed, so the GPU trainer and the CPU verification see the same clips:

- `ClipSpec`: one clip's content (colour, shape, motion, background) and its nuisance parameters (size, start and
  end positions, bounce period). `sample_specs(seed, n, split)` draws them deterministically; some
  (colour, shape, motion) combinations and (colour, motion), (shape, motion), (shape, background) pairs are held out
  of training (train/heldout.toml: `HELD_OUT`, `HELD_OUT_PAIRS`) for the compositional checks.
- `caption(...)`: varied English phrasing, an enumerable function of the content and a template index, so every
  caption the trainer can use is known in advance and its text embedding can be precomputed on CPU.
- `render_video(specs, ...)`: anti-aliased frames, float (B, T, H, W, 3) in [0, 1], batched in torch on any device.
- `render_audio(specs, ...)`: stereo (B, 2, N) at 16 kHz: a tone whose pitch follows the shape's height (220 Hz at
  the bottom to 880 Hz at the top), panned with its x position, with a click at every bounce.

Geometry matches the nano engine: 224x128 canvas (16:9, short edge 128), 124 frames at 24 fps (5.17 s), audio
16 kHz with 207 latents of 400 samples.
"""

from __future__ import annotations

import itertools
import math
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

WIDTH, HEIGHT = 224, 128
FPS = 24
NUM_FRAMES = 124
SAMPLE_RATE = 16000
HOP = 400
NUM_AUDIO_LATENTS = 207
NUM_SAMPLES = NUM_AUDIO_LATENTS * HOP  # 82,800: exactly what the audio VAE decodes for a 124-frame clip
DURATION = NUM_FRAMES / FPS

COLOURS = {
    "red": (0.90, 0.12, 0.10),
    "green": (0.15, 0.80, 0.20),
    "blue": (0.20, 0.40, 1.00),
    "yellow": (0.95, 0.88, 0.15),
    "white": (0.96, 0.96, 0.96),
    "purple": (0.62, 0.22, 0.85),
}
SHAPES = ("circle", "square", "triangle")
MOTIONS = ("left to right", "right to left", "up", "down", "bouncing")
BACKGROUNDS = {
    "black": (0.0, 0.0, 0.0),
    "grey": (0.45, 0.45, 0.45),
    "dark blue": (0.04, 0.06, 0.30),
    "textured": None,  # a fixed checkerboard, see `_background`
}
TEXTURE_COLOURS = ((0.34, 0.27, 0.18), (0.20, 0.16, 0.11))
# One cell per transformer token (x16 VAE, 2x2 patches): the 16 px cells of run 1 made the VAE lose the shape on
# "textured" clips (h3-facts section 11).
TEXTURE_CELL = 32
# Shape size: radius 20-24 px spans about 1.5 transformer tokens of 32x32 px; at 14-18 px (run 1) a shape was about
# one token and decoded as a blob whose colour the VAE mixed with the background.
RADIUS_RANGE = (20.0, 24.0)

# What training never shows is declared as data in train/heldout.toml (the evaluation sets in assets/eval/ are built
# on it): (colour, shape, motion) triples, and from run 11 on unseen pairs of each kind below. Each colour, shape,
# motion and background still appears in training with other partners, so naming a held-out one asks the model to
# compose.
HELD_OUT_FILE = Path(__file__).with_name("heldout.toml")
PAIR_KINDS = {"colour_motion": (0, 2), "shape_motion": (1, 2), "shape_background": (1, 3)}  # positions in a tuple


@dataclass(frozen=True)
class HeldOutPair:
    kind: str  # a PAIR_KINDS key
    values: tuple[str, str]
    set: str  # "dev": may choose between runs; "test": scored once per shipped model, never to choose

    def holds(self, content: tuple[str, ...]) -> bool:
        """Whether a (colour, shape, motion[, background]) tuple contains this pair."""
        first, second = PAIR_KINDS[self.kind]
        return second < len(content) and (content[first], content[second]) == self.values


def _load_held_out() -> tuple[tuple[tuple[str, str, str], ...], tuple[HeldOutPair, ...]]:
    data = tomllib.loads(HELD_OUT_FILE.read_text())
    vocabulary = (COLOURS, SHAPES, MOTIONS, BACKGROUNDS)
    triples = tuple(tuple(t) for t in data["triples"])
    for triple in triples:
        if len(triple) != 3 or any(v not in vocab for v, vocab in zip(triple, vocabulary)):
            raise ValueError(f"{HELD_OUT_FILE.name}: triples: {triple!r} is not (colour, shape, motion)")
    pairs = []
    for entry in data.get("pairs", []):
        kind, values, which = entry.get("kind"), tuple(entry.get("values", ())), entry.get("set")
        if kind not in PAIR_KINDS or len(values) != 2 or which not in ("dev", "test") or any(
                v not in vocabulary[i] for v, i in zip(values, PAIR_KINDS[kind])):
            raise ValueError(f"{HELD_OUT_FILE.name}: pairs: {entry!r} needs kind in {sorted(PAIR_KINDS)}, two "
                             "values of that kind's vocabularies and set = dev or test")
        pairs.append(HeldOutPair(kind, values, which))
    return triples, tuple(pairs)


HELD_OUT, HELD_OUT_PAIRS = _load_held_out()

MOTION_PHRASES = {
    "left to right": ("moves from left to right", "slides left to right", "travels from the left to the right"),
    "right to left": ("moves from right to left", "slides right to left", "travels from the right to the left"),
    "up": ("moves up", "rises upward", "floats up"),
    "down": ("moves down", "falls downward", "sinks down"),
    "bouncing": ("bounces", "is bouncing", "bounces up and down"),
}
BACKGROUND_PHRASES = {
    "black": ("on a black background", "against black", "over a black backdrop"),
    "grey": ("on a grey background", "against grey", "over a grey backdrop"),
    "dark blue": ("on a dark blue background", "against dark blue", "over a dark blue backdrop"),
    "textured": ("on a textured background", "against a textured pattern", "over a textured backdrop"),
}
TEMPLATES = (
    "a {colour} {shape} {motion} {background}",
    "A {colour} {shape} {motion} {background}.",
    "{Background}, a {colour} {shape} {motion}.",
    "{colour} {shape}, {motion}, {bg} background",
    "A video of a {colour} {shape} that {motion} {background}",
    "The {colour} {shape} {motion} {background}.",
)
NUM_TEMPLATES = len(TEMPLATES)


@dataclass(frozen=True)
class ClipSpec:
    """Content and nuisance parameters of one clip. Positions are pixel centres on the 224x128 canvas."""

    colour: str
    shape: str
    motion: str
    background: str
    radius: float
    x0: float
    y0: float
    x1: float
    y1: float
    period: float  # bouncing: seconds between floor contacts
    phase: float  # bouncing: fraction of a period already elapsed at t = 0
    template: int = 0

    @property
    def caption(self) -> str:
        return caption(self.colour, self.shape, self.motion, self.background, self.template)

    def to_dict(self) -> dict:
        return asdict(self)


def caption(colour: str, shape: str, motion: str, background: str, template: int) -> str:
    """The caption of a content tuple under template `template` (0 .. NUM_TEMPLATES-1); phrasing varies with it."""
    motion_text = MOTION_PHRASES[motion][template % len(MOTION_PHRASES[motion])]
    background_text = BACKGROUND_PHRASES[background][(template // 2) % len(BACKGROUND_PHRASES[background])]
    return TEMPLATES[template].format(
        colour=colour, shape=shape, motion=motion_text, background=background_text,
        Background=background_text[0].upper() + background_text[1:], bg=background,
    )


def subject_free_caption(motion: str, background: str, template: int) -> str:
    """A caption of the same template that names neither colour nor shape ("A shape moves up on a grey background."):
    the conditioned tasks' prompts that leave the subject to the keyframe or reference image (train/tasks.py)."""
    return " ".join(caption("", "shape", motion, background, template).split())


def all_captions() -> list[str]:
    """Every caption the generator can produce, in a fixed order (the trainer's text-embedding table)."""
    return [caption(c, s, m, b, t) for c, s, m, b, t in
            itertools.product(COLOURS, SHAPES, MOTIONS, BACKGROUNDS, range(NUM_TEMPLATES))]


def is_held_out(colour: str, shape: str, motion: str) -> bool:
    return (colour, shape, motion) in HELD_OUT


def held_out_pair(content: tuple[str, ...]) -> HeldOutPair | None:
    """The first held-out pair a content tuple holds, or None."""
    return next((pair for pair in HELD_OUT_PAIRS if pair.holds(content)), None)


def content_tuples(split: str) -> list[tuple[str, str, str, str]]:
    """(colour, shape, motion, background) tuples of a split: "train" excludes HELD_OUT and every held-out pair,
    "heldout" is only the HELD_OUT triples, "unseen_pairs" the tuples that hold a held-out pair (and no HELD_OUT
    triple), "runs1to10_train" what runs 1-10 trained on (all but HELD_OUT: the pairs were not yet held out)."""
    tuples = list(itertools.product(COLOURS, SHAPES, MOTIONS, BACKGROUNDS))
    if split == "train":
        return [t for t in tuples if not is_held_out(*t[:3]) and held_out_pair(t) is None]
    if split == "heldout":
        return [t for t in tuples if is_held_out(*t[:3])]
    if split == "unseen_pairs":
        return [t for t in tuples if not is_held_out(*t[:3]) and held_out_pair(t) is not None]
    if split == "runs1to10_train":
        return [t for t in tuples if not is_held_out(*t[:3])]
    if split == "all":
        return tuples
    raise ValueError(f"unknown split {split!r}")


def _nuisance(rng: np.random.Generator, motion: str) -> dict:
    """Size, path and bounce timing for one clip; paths stay inside the canvas with a margin."""
    radius = float(rng.uniform(*RADIUS_RANGE))
    margin = radius + 6.0
    if motion in ("left to right", "right to left"):
        xa, xb = rng.uniform(margin, margin + 30.0), rng.uniform(WIDTH - margin - 30.0, WIDTH - margin)
        y = rng.uniform(margin, HEIGHT - margin)
        x0, x1 = (xa, xb) if motion == "left to right" else (xb, xa)
        y0 = y1 = y
    elif motion in ("up", "down"):
        ya, yb = rng.uniform(margin, margin + 12.0), rng.uniform(HEIGHT - margin - 12.0, HEIGHT - margin)
        x = rng.uniform(margin + 20.0, WIDTH - margin - 20.0)
        y0, y1 = (yb, ya) if motion == "up" else (ya, yb)  # image y grows downwards
        x0 = x1 = x
    else:  # bouncing: floor at y0, apex at y1, slow horizontal drift
        x0 = rng.uniform(margin + 30.0, WIDTH - margin - 30.0)
        x1 = float(np.clip(x0 + rng.uniform(-30.0, 30.0), margin, WIDTH - margin))
        y0 = HEIGHT - margin - rng.uniform(0.0, 6.0)
        y1 = margin + rng.uniform(0.0, 10.0)
    return dict(radius=radius, x0=float(x0), y0=float(y0), x1=float(x1), y1=float(y1),
                period=float(rng.uniform(1.1, 1.8)), phase=float(rng.uniform(0.0, 1.0)))


def make_spec(content: tuple[str, str, str, str], seed: int, template: int | None = None) -> ClipSpec:
    """The clip of one content tuple under `seed` (nuisance parameters and, unless given, the template)."""
    rng = np.random.default_rng(seed)
    colour, shape, motion, background = content
    nuisance = _nuisance(rng, motion)
    chosen = int(rng.integers(NUM_TEMPLATES)) if template is None else template
    return ClipSpec(colour, shape, motion, background, template=chosen, **nuisance)


def sample_specs(seed: int, count: int, split: str = "train") -> list[ClipSpec]:
    """`count` clips drawn deterministically from a split: content cycles through a seeded permutation."""
    tuples = content_tuples(split)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(tuples))
    seeds = rng.integers(0, 2**31 - 1, size=count)
    return [make_spec(tuples[order[i % len(tuples)]], int(seeds[i])) for i in range(count)]


# ---------------------------------------------------------------------------------------------------------------
# Trajectories (shared by video and audio, so the sound is synchronised by construction)


def _params(specs: list[ClipSpec], device) -> dict[str, torch.Tensor]:
    keys = ("radius", "x0", "y0", "x1", "y1", "period", "phase")
    values = torch.tensor([[getattr(s, k) for k in keys] for s in specs], dtype=torch.float64, device=device)
    params = {k: values[:, i:i + 1] for i, k in enumerate(keys)}
    params["bouncing"] = torch.tensor([[s.motion == "bouncing"] for s in specs], device=device)
    return params


def trajectory(specs: list[ClipSpec], times: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Centre (x, y) of each clip's shape at `times` seconds: two (B, len(times)) float64 tensors.

    Linear motions go from (x0, y0) to (x1, y1) over the clip. Bouncing follows |sin| arcs between the floor y0 and
    the apex y1 (a floor contact, i.e. a bounce, whenever the arc returns to y0), drifting from x0 to x1.
    """
    p = _params(specs, times.device)
    frac = (times / DURATION).clamp(0, 1)[None, :].to(torch.float64)
    x = p["x0"] + (p["x1"] - p["x0"]) * frac
    linear_y = p["y0"] + (p["y1"] - p["y0"]) * frac
    arc = torch.sin(math.pi * (times[None, :].to(torch.float64) / p["period"] + p["phase"])).abs()
    bounce_y = p["y0"] + (p["y1"] - p["y0"]) * arc
    return x, torch.where(p["bouncing"], bounce_y, linear_y)


def bounce_times(spec: ClipSpec) -> list[float]:
    """Seconds at which a bouncing shape touches the floor (empty for linear motions)."""
    if spec.motion != "bouncing":
        return []
    first = (math.ceil(spec.phase) - spec.phase) * spec.period
    return [t for t in np.arange(first, DURATION, spec.period).tolist() if 0.0 < t < DURATION]


# ---------------------------------------------------------------------------------------------------------------
# Video


def _background(specs: list[ClipSpec], height: int, width: int, device, cell: int = TEXTURE_CELL) -> torch.Tensor:
    """(B, H, W, 3) static backgrounds; "textured" is a fixed two-tone checkerboard of `cell`-pixel squares."""
    ys, xs = torch.meshgrid(torch.arange(height, device=device), torch.arange(width, device=device), indexing="ij")
    checker = ((ys // cell + xs // cell) % 2).float()[..., None]
    light, dark = (torch.tensor(c, device=device) for c in TEXTURE_COLOURS)
    texture = light * checker + dark * (1 - checker)
    plates = []
    for spec in specs:
        colour = BACKGROUNDS[spec.background]
        plates.append(texture if colour is None else torch.tensor(colour, device=device).expand(height, width, 3))
    return torch.stack(plates)


def background_plates(specs: list[ClipSpec], device="cpu") -> torch.Tensor:
    """(B, H, W, 3) each clip's background without its shape (the silhouette loss compares against it)."""
    return _background(specs, HEIGHT, WIDTH, torch.device(device))


def _signed_distance(shape: str, dx: torch.Tensor, dy: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    """Signed distance (pixels, negative inside) to a shape of circumradius-like size `radius` centred at 0."""
    if shape == "circle":
        return torch.sqrt(dx**2 + dy**2) - radius
    if shape == "square":
        return torch.maximum(dx.abs(), dy.abs()) - 0.85 * radius
    # Upward-pointing equilateral triangle with circumradius `radius`: the max over its three edge half-planes.
    inradius = 0.5 * radius
    edges = [(0.0, 1.0), (math.sqrt(3) / 2, -0.5), (-math.sqrt(3) / 2, -0.5)]
    return torch.stack([nx * dx + ny * dy for nx, ny in edges]).amax(0) - inradius


def _coverage(specs: list[ClipSpec], dx: torch.Tensor, dy: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    """Each spec's shape coverage in [0, 1], anti-aliased with a one-pixel ramp on its signed distance. `dx`, `dy`
    (offsets from the shape's centre) and `radius` hold one entry per spec on dim 0 and broadcast to the output."""
    coverage = torch.empty(torch.broadcast_shapes(dx.shape, dy.shape), device=dx.device)
    for shape in SHAPES:
        index = [i for i, s in enumerate(specs) if s.shape == shape]
        if index:
            picked = torch.tensor(index, device=dx.device)
            coverage[picked] = (0.5 - _signed_distance(shape, dx[picked], dy[picked], radius[picked])).clamp(0, 1)
    return coverage


def render_video(specs: list[ClipSpec], frames: torch.Tensor | None = None, device="cpu",
                 with_mask: bool = False):
    """Frames (B, T, H, W, 3) float32 in [0, 1] for `frames` (indices, default all 124); optionally the (B, T, H, W)
    shape coverage in [0, 1] too. Shapes are anti-aliased with a one-pixel ramp on their signed distance."""
    device = torch.device(device)
    frames = torch.arange(NUM_FRAMES, device=device) if frames is None else frames.to(device)
    cx, cy = trajectory(specs, frames.to(torch.float64) / FPS)
    ys = torch.arange(HEIGHT, device=device, dtype=torch.float32)[None, None, :, None] + 0.5
    xs = torch.arange(WIDTH, device=device, dtype=torch.float32)[None, None, None, :] + 0.5
    dx, dy = xs - cx.float()[..., None, None], ys - cy.float()[..., None, None]
    radius = torch.tensor([s.radius for s in specs], device=device, dtype=torch.float32).view(-1, 1, 1, 1)
    coverage = _coverage(specs, dx, dy, radius)
    colour = torch.tensor([COLOURS[s.colour] for s in specs], device=device).view(-1, 1, 1, 1, 3)
    background = _background(specs, HEIGHT, WIDTH, device)[:, None]
    alpha = coverage[..., None]
    video = background * (1 - alpha) + colour * alpha
    return (video, coverage) if with_mask else video


def render_reference(specs: list[ClipSpec], size: int = 352, device="cpu") -> torch.Tensor:
    """A reference image of each clip's subject (ref2va): (B, size, size, 3) float32 in [0, 1], the shape alone at
    the centre of a square over the clip's background, everything scaled by size / HEIGHT (so the subject and the
    checkerboard keep their proportions to a 128-pixel frame). 352 is the nano's `reference_image_short_edge`: an
    image of that size reaches the VAE and the vision tower without a resize (engine/components.py)."""
    device = torch.device(device)
    scale = size / HEIGHT
    centre = torch.arange(size, device=device, dtype=torch.float32) + 0.5 - size / 2
    dy, dx = centre.view(1, -1, 1).expand(len(specs), -1, -1), centre.view(1, 1, -1).expand(len(specs), -1, -1)
    radius = torch.tensor([s.radius * scale for s in specs], device=device, dtype=torch.float32).view(-1, 1, 1)
    coverage = _coverage(specs, dx, dy, radius)
    colour = torch.tensor([COLOURS[s.colour] for s in specs], device=device).view(-1, 1, 1, 3)
    background = _background(specs, size, size, device, cell=round(TEXTURE_CELL * scale))
    alpha = coverage[..., None]
    return background * (1 - alpha) + colour * alpha


# ---------------------------------------------------------------------------------------------------------------
# Audio

TONE_LOW_HZ, TONE_OCTAVES = 220.0, 2.0
TONE_AMPLITUDE = 0.22
CLICK_AMPLITUDE = 0.5
CLICK_SECONDS = 0.012
HARMONICS = {"circle": (), "square": ((3, 0.30),), "triangle": ((2, 0.30),)}  # timbre follows the shape


def tone_frequency(y: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    """Pitch for a shape centred at image row `y`: 220 Hz at the bottom of its range, 880 Hz at the top."""
    low, high = radius + 6.0, HEIGHT - radius - 6.0
    height = ((high - y) / (high - low)).clamp(0, 1)
    return TONE_LOW_HZ * 2.0 ** (TONE_OCTAVES * height)


def render_audio(specs: list[ClipSpec], device="cpu", num_samples: int = NUM_SAMPLES) -> torch.Tensor:
    """(B, 2, num_samples) float32 stereo in [-1, 1]: the height-following tone panned by x, plus bounce clicks."""
    device = torch.device(device)
    times = torch.arange(num_samples, device=device, dtype=torch.float64) / SAMPLE_RATE
    x, y = trajectory(specs, times)
    radius = torch.tensor([[s.radius] for s in specs], device=device, dtype=torch.float64)
    phase = 2 * math.pi * torch.cumsum(tone_frequency(y, radius), dim=1) / SAMPLE_RATE
    tone = torch.sin(phase)
    for i, spec in enumerate(specs):
        for harmonic, gain in HARMONICS[spec.shape]:
            tone[i] = tone[i] + gain * torch.sin(harmonic * phase[i])
    tone = TONE_AMPLITUDE * tone
    pan = (x / WIDTH).clamp(0, 1) * (math.pi / 2)
    stereo = torch.stack([tone * torch.cos(pan), tone * torch.sin(pan)], dim=1)
    click_t = torch.arange(int(CLICK_SECONDS * SAMPLE_RATE), device=device, dtype=torch.float64) / SAMPLE_RATE
    click = CLICK_AMPLITUDE * torch.exp(-click_t / 0.002) * torch.sin(2 * math.pi * 2000.0 * click_t)
    for i, spec in enumerate(specs):
        for t in bounce_times(spec):
            start = int(round(t * SAMPLE_RATE))
            end = min(start + click.numel(), num_samples)
            stereo[i, :, start:end] += click[: end - start]
    return stereo.clamp(-1, 1).float()

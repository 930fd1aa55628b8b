"""Verify a nano model through the real engine on CPU: the acceptance checks of issue 15.

    python -m train.verify_nano [--model assets/nano] [--loras assets/loras] [--prompts 20] [--json out.json]

All prompts are held out: (colour, shape, motion) triples never seen in training (train/dataset.HELD_OUT), each
with a caption template, generated with seed 42. Clips are made once per (prompt, tier) and shared by the checks.
1. steering: baseline (50 steps); `train.metrics.track` confirms colour and direction (pass ≥ 80%) and shape
   (pass ≥ 60%).
2. turbo: 9 steps + nano-turbo-9 on the same prompts and seed: followed (colour and direction, pass ≥ 70%) and
   mean SSIM to the baseline (pass ≥ 0.8); turbo-5 must be measurably further from the baseline than turbo.
3. audio: the dominant pitch (per video frame, 150-1200 Hz) against the tracked height, Pearson correlation of
   log pitch with height per clip (pass: mean ≥ 0.6); for bouncing prompts, each click (2 kHz band onset) against
   the nearest floor contact of the track (lowest points, sub-frame by parabola) (pass: median ≤ 50 ms).
4. ghost: an aggressive sparse tier (keep 0.1 of video key tiles, no dense steps or blocks; forced past the
   engine's refusal) and the shipped `sol` tier against the baseline, both at the model's sparse tile
   (h3_studio.json `sparse_tile`; `--ghost-tile 64` runs both at 64-row tiles instead); `quality.compare_clips`
   flags ghosting (pass: aggressive flagged on ≥ 6 of 10 prompts, sol on fewer). Each clip also gets the evidence
   that tells a ghost from drift: whether the tracker still finds the prompt's colour and direction, and how far the
   tracked subject sits from the baseline's (median px). `--ghost-strips DIR` writes a PNG strip per prompt.
5. bench: wall time of one 5 s baseline + turbo pair after a warm-up pair (bench/nano_bench.py does it alone).
6. fl2va (issue 21): each held-out prompt with a first-frame keyframe, frame 0 of the prompt's own rendered clip
   (train/dataset.py, seed FL2VA_SEED + i: a known position, colour and shape), through the Engine at 50 steps; the
   t2va baseline clip of the same prompt and seed (no keyframe) is the control. Per clip: the tracked subject's
   centre in frame 0 against the keyframe's (within FL2VA_WITHIN_PX px), SSIM of frame 0 (whole, the subject's
   square of the keyframe, and frames 0-4) to the keyframe, and the tracker's colour, shape and motion (pass: fl2va
   starts within that distance, and the tracker reads the keyframe's colour, on >= 80% of prompts each). SSIM is
   reported, not gated: a frame 0 of bare background scores above a subject in the wrong place.
   `--fl2va-strips DIR`: a PNG per prompt, keyframe | fl2va frame 0 | t2va frame 0.
7. ref2va (issue 21): each held-out prompt's subject as a rendered 352x352 reference (train/tasks.images_for, the
   clip of seed REF2VA_SEED + i) with a prompt that names neither colour nor shape (train/dataset.subject_free_caption
   of its motion, background and template), through the Engine at 50 steps; t2va of the same subject-free prompt and
   seed (no reference) is the control, whose colour rate is what chance gives. The tracker reads each clip's colour,
   shape and motion (pass: ref2va's colour is the reference's on >= 80% of prompts, and on more prompts than the
   control's). `--ref2va-named` (default) adds the full caption with the reference, reported, not gated.
8. vocabulary: what a word outside the training captions does (the studio warns about such words,
   engine/prompt_guide.py). Each held-out prompt three ways, same seed: as captioned; with one unknown adjective
   before the shape ("a red small triangle ..."); and, where the background has one, with the synonym people type
   for it ("gray", "checkered", "navy": unknown words too). Per way: the tracker's colour and direction, its shape,
   and the background (train.metrics.nearest_background). Reported, not gated.
Results are printed and written as JSON; TRAINING.md quotes them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from train.dataset import NUM_TEMPLATES, caption, content_tuples
from train.metrics import nearest_background, ssim, track

ROOT = Path(__file__).resolve().parents[1]

SEED = 42


def tiers_toml(loras: Path, ghost_tile: int = 0, ghost_dense_steps: int = 0) -> str:
    """Tiers that point at the LoRAs under test (absolute paths) plus the aggressive sparse setting (at the model's
    sparse tile, or `ghost_tile` rows; sparse from step `ghost_dense_steps` on) and, with a `ghost_tile`, `v-sol`:
    the shipped sol at that tile."""
    from engine.tiers import TierTable

    sol = TierTable.load().get("sol")
    v_sol = "" if not ghost_tile else "\n".join([
        "[[tier]]", 'name = "v-sol"', f'description = "the shipped sol at {ghost_tile}-row tiles"',
        f"steps = {sol.steps}", f"bucket = {sol.bucket}", f"fused = {str(sol.fused).lower()}",
        f"sparse = {{ keep_ratio = {sol.sparse.keep_ratio}, tile = {ghost_tile}, "
        f"dense_first_steps = {sol.sparse.dense_first_steps}, dense_first_blocks = {sol.sparse.dense_first_blocks} }}",
        f"cache = {{ threshold = {sol.cache.threshold}, warmup_steps = {sol.cache.warmup_steps}, "
        f"max_consecutive = {sol.cache.max_consecutive} }}", ""])
    return f"""
[[tier]]
name = "v-turbo"
description = "9-step LoRA under test"
steps = 9
bucket = 64
lora = {{ path = "{(loras / 'nano-turbo-9.safetensors').resolve()}" }}

[[tier]]
name = "v-turbo-5"
description = "5-step LoRA under test"
steps = 5
bucket = 64
lora = {{ path = "{(loras / 'nano-turbo-5.safetensors').resolve()}" }}

[[tier]]
name = "v-ghost"
description = "aggressive sparse attention: keep 10% of key tiles in every block from step {ghost_dense_steps}"
steps = 50
bucket = 64
sparse = {{ keep_ratio = 0.1, tile = {ghost_tile}, dense_first_steps = {ghost_dense_steps}, dense_first_blocks = 0 }}
""" + v_sol


def heldout_set(count: int, seed: int = 20261209) -> list[tuple[tuple[str, str, str, str], int]]:
    """`count` held-out (content, template) pairs, spread over the combinations deterministically."""
    tuples = content_tuples("heldout")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(tuples))[:count]
    return [(tuples[i], int(rng.integers(NUM_TEMPLATES))) for i in order]


class Clips:
    """Generate each (prompt, tier) once; the checks share the clips. `steps` overrides every tier's step count (the
    plumbing tests' tiny budget; None: each tier's own)."""

    def __init__(self, engine, steps: int | None = None):
        self.engine, self.cache, self.steps = engine, {}, steps

    def _generate(self, payload: dict):
        return self.engine.generate(payload if self.steps is None else {**payload, "steps": self.steps})

    def get(self, prompt: str, tier: str):
        if (prompt, tier) not in self.cache:
            start = time.time()
            payload = {"prompt": prompt, "seed": SEED, "tier": tier}
            if tier == "v-ghost":
                payload["force"] = True
            self.cache[prompt, tier] = self._generate(payload)
            print(f"    {tier:>9} {time.time() - start:5.1f} s  {prompt!r}", flush=True)
        return self.cache[prompt, tier]

    def keyframed(self, prompt: str, first_frame: bytes):
        """The baseline fl2va clip of `prompt` that starts on `first_frame` (PNG bytes), same seed and canvas."""
        key = (prompt, "fl2va", hashlib.sha256(first_frame).hexdigest())
        if key not in self.cache:
            start = time.time()
            self.cache[key] = self._generate({"prompt": prompt, "seed": SEED, "tier": "baseline",
                                              "first_frame": first_frame, "aspect_ratio": "16:9"})
            print(f"    {'fl2va':>9} {time.time() - start:5.1f} s  {prompt!r}", flush=True)
        return self.cache[key]

    def referenced(self, prompt: str, reference: bytes):
        """The baseline ref2va clip of `prompt` with one reference image (PNG bytes), same seed and 16:9 canvas."""
        key = (prompt, "ref2va", hashlib.sha256(reference).hexdigest())
        if key not in self.cache:
            start = time.time()
            self.cache[key] = self._generate({"prompt": prompt, "seed": SEED, "tier": "baseline",
                                              "references": [reference], "aspect_ratio": "16:9"})
            print(f"    {'ref2va':>9} {time.time() - start:5.1f} s  {prompt!r}", flush=True)
        return self.cache[key]


def held_out_prompts(count: int) -> list[tuple[tuple[str, str, str, str], str]]:
    return [(content, caption(*content, template)) for content, template in heldout_set(count)]


def check_steering(clips: Clips, count: int) -> dict:
    rows = []
    for content, prompt in held_out_prompts(count):
        tr = track(clips.get(prompt, "baseline").frames)
        ok = tr.colour == content[0] and tr.motion == content[2]
        rows.append({"prompt": prompt, "expected": list(content[:3]), **tr.to_dict(), "ok": bool(ok),
                     "shape_ok": tr.shape == content[1]})
        print(f"  {'ok ' if ok else 'BAD'} {prompt!r}: {tr.colour}, {tr.shape}, {tr.motion}", flush=True)
    followed = sum(r["ok"] for r in rows) / len(rows)
    shapes = sum(r["shape_ok"] for r in rows) / len(rows)
    return {"heldout_accuracy": followed, "shape_accuracy": shapes, "heldout": rows,
            "pass": followed >= 0.8 and shapes >= 0.6}


UNKNOWN_ADJECTIVES = ("small", "bright", "shiny", "tiny", "big")
BACKGROUND_SYNONYMS = {"grey": "gray", "textured": "checkered", "dark blue": "navy"}  # as typed; the captions' words


def vocabulary_variants(content: tuple[str, str, str, str], prompt: str, index: int) -> dict[str, str]:
    """The prompt with one unknown adjective before its shape and, where its background has one, with that
    background's synonym in place of the caption's word."""
    colour, shape, _, background = content
    adjective = UNKNOWN_ADJECTIVES[index % len(UNKNOWN_ADJECTIVES)]
    variants = {"adjective": prompt.replace(f"{colour} {shape}", f"{colour} {adjective} {shape}", 1)}
    if background in BACKGROUND_SYNONYMS and background in prompt:
        variants["synonym"] = prompt.replace(background, BACKGROUND_SYNONYMS[background], 1)
    return variants


def check_vocabulary(clips: Clips, count: int) -> dict:
    guide = clips.engine.prompt_guide
    rows = []
    for i, (content, prompt) in enumerate(held_out_prompts(count)):
        row = {"expected": list(content)}
        for way, text in {"captioned": prompt, **vocabulary_variants(content, prompt, i)}.items():
            frames = clips.get(text, "baseline").frames
            tr, background = track(frames), nearest_background(frames)
            row[way] = {"prompt": text, "ok": tr.colour == content[0] and tr.motion == content[2],
                        "shape_ok": tr.shape == content[1], "background_ok": background == content[3],
                        "tracked": [tr.colour, tr.shape, tr.motion, background],
                        "unknown_named": [w for w, _ in guide.check(text).unknown] if guide else None}
        rows.append(row)
    result: dict = {"per_prompt": rows}
    for way in ("captioned", "adjective", "synonym"):
        got = [r[way] for r in rows if way in r]
        result[way] = {key: f"{sum(g[field] for g in got)}/{len(got)}"
                       for key, field in (("followed", "ok"), ("shape", "shape_ok"), ("background", "background_ok"))}
    result["pass"] = None  # reported, not gated
    return result


def check_turbo(clips: Clips, count: int) -> dict:
    rows = []
    for content, prompt in held_out_prompts(count):
        base = clips.get(prompt, "baseline").frames
        row = {"prompt": prompt}
        for tier in ("v-turbo", "v-turbo-5"):
            frames = clips.get(prompt, tier).frames
            tr = track(frames)
            row[tier] = {"ssim": ssim(base, frames), "ok": tr.colour == content[0] and tr.motion == content[2]}
        rows.append(row)
    result = {"per_prompt": rows}
    for tier, key in (("v-turbo", "turbo9"), ("v-turbo-5", "turbo5")):
        result[f"ssim_{key}"] = float(np.mean([r[tier]["ssim"] for r in rows]))
        result[f"followed_{key}"] = float(np.mean([r[tier]["ok"] for r in rows]))
    gaps = [r["v-turbo"]["ssim"] - r["v-turbo-5"]["ssim"] for r in rows]
    result["turbo5_further_on"] = f"{sum(g > 0 for g in gaps)}/{len(gaps)} prompts"
    result["pass"] = (result["followed_turbo9"] >= 0.7 and result["ssim_turbo9"] >= 0.8
                      and result["ssim_turbo5"] < result["ssim_turbo9"])
    return result


def dominant_pitch(audio: np.ndarray, sample_rate: int, fps: float, frames: int) -> np.ndarray:
    """(frames,) Hz: the strongest frequency between 150 and 1200 Hz in each video frame's window of the mono mix."""
    mono = audio.mean(0)
    hop = sample_rate / fps
    size = 2048
    window = np.hanning(size)
    freqs = np.fft.rfftfreq(size, 1 / sample_rate)
    band = (freqs >= 150) & (freqs <= 1200)
    pitch = np.full(frames, np.nan)
    for i in range(frames):
        centre = int((i + 0.5) * hop)
        chunk = mono[max(0, centre - size // 2): centre + size // 2]
        if len(chunk) < size:
            chunk = np.pad(chunk, (0, size - len(chunk)))
        spectrum = np.abs(np.fft.rfft(chunk * window))[band]
        if spectrum.max() > 1e-4:
            pitch[i] = freqs[band][int(np.argmax(spectrum))]
    return pitch


CLICK_JUMP = 8.0  # a click frame's band energy against the 5-50 ms before it (and the clip's median)
CLICK_LOOKBACK = 10  # 5 ms frames
CLICK_FLOOR = 1e-5  # absolute: a rendered click frame holds about 0.02; keeps near-silent audio from firing


def click_times(audio: np.ndarray, sample_rate: int) -> list[float]:
    """Seconds of click onsets: 5 ms frames whose 1.5-3 kHz energy jumps above CLICK_JUMP times both the clip's median
    band energy and the mean of the 5-50 ms before it, away from the clip's first and last 50 ms (where the tone's own
    start and end ring through the filter).

    The band holds the square's 3rd and the triangle's 2nd harmonic whenever the tone is high, so a rule against the
    median alone fired wherever a harmonic swept into the band: 109 "clicks" in 20 rendered clips that never bounce,
    and 62 for 29 bounces. A click jumps within one frame; a sweeping harmonic does not."""
    from scipy.signal import butter, sosfiltfilt

    band = sosfiltfilt(butter(4, (1500, 3000), btype="band", fs=sample_rate, output="sos"), audio.mean(0))
    step = int(0.005 * sample_rate)
    energy = np.array([np.square(band[i:i + step]).mean() for i in range(0, len(band) - step, step)])
    median = np.median(energy)
    times, last = [], -1.0
    for i, e in enumerate(energy):
        t = i * step / sample_rate
        before = energy[max(0, i - CLICK_LOOKBACK):max(0, i - 1)]  # skip the frame just before: it may hold the onset
        reference = max(median, before.mean() if len(before) else 0.0)
        if e > CLICK_JUMP * reference + CLICK_FLOOR and t - last > 0.15 and 0.05 <= t <= len(band) / sample_rate - 0.05:
            times.append(t)
            last = t
    return times


PLATEAU_PX = 0.5  # frames whose tracked height differs by at most this much from a run's first frame share it


def height_runs(ys: np.ndarray) -> list[tuple[int, int, float]]:
    """(first frame, last frame + 1, mean height) of each run of frames at one tracked height (NaN frames alone).

    The nano's video VAE decodes 4 frames from each latent frame, so a generated subject holds its place for 4 frames
    and then jumps: its height track is a staircase."""
    y = np.asarray(ys, dtype=float)
    runs, i = [], 0
    while i < len(y):
        j = i + 1
        while not np.isnan(y[i]) and j < len(y) and abs(y[j] - y[i]) <= PLATEAU_PX:
            j += 1
        runs.append((i, j, float(np.mean(y[i:j]))))
        i = j
    return runs


def floor_contacts(ys: np.ndarray, fps: float) -> list[float]:
    """Seconds of the lowest points (image y maxima) of a bouncing track.

    A contact is a run of frames at one height (`height_runs`) lower on screen than the runs on either side, where the
    frames within 6 of it span at least 6 px (not a plateau of jitter). Its time is the vertex of the parabola through
    the three runs' centres, kept inside the run. On a smooth track every run is one frame and this is the per-frame
    local maximum refined by a parabola. Frame i shows time i / fps (train/dataset.py, and the engine's clips).
    Before runs, a staircase counted the last frame of every step up as a contact: 13-20 per 5 s generated clip where
    the subject bounced 3 or 4 times (TRAINING.md section 5g)."""
    y = np.asarray(ys, dtype=float)
    runs = height_runs(y)
    times = []
    for (s0, e0, a), (s1, e1, b), (s2, e2, c) in zip(runs, runs[1:], runs[2:]):
        if np.isnan([a, b, c]).any() or not (b > a and b > c):
            continue
        window = y[max(0, s1 - 6): e1 + 6]
        if np.nanmax(window) - np.nanmin(window) < 6:  # a plateau of jitter, not a bounce
            continue
        xs = np.array([(s0 + e0 - 1) / 2, (s1 + e1 - 1) / 2, (s2 + e2 - 1) / 2])
        curve = np.polyfit(xs - xs[1], [a, b, c], 2)
        vertex = xs[1] - curve[1] / (2 * curve[0]) if curve[0] < 0 else xs[1]
        times.append(float(np.clip(vertex, s1 - 0.5, e1 - 0.5)) / fps)
    return times


def check_contact_rule(clips: int = 12) -> dict:
    """`floor_contacts` on ground truth (no model): rendered bouncing training-split clips (seed 3), tracked as they
    are and held per latent frame at each 4-frame group's mean height (the staircase the nano's VAE makes). Counts
    against `bounce_times`, and ms from each true bounce to the nearest contact found."""
    import torch

    from train.dataset import FPS, bounce_times, render_video, sample_specs

    specs = [s for s in sample_specs(3, 10 * clips, "train") if s.motion == "bouncing"][:clips]
    video = (render_video(specs) * 255).round().to(torch.uint8).numpy()
    result = {}
    for name in ("smooth", "staircase"):
        truths = found = 0
        distances = []
        for spec, frames in zip(specs, video):
            ys = track(frames).ys
            if name == "staircase":
                for first in range(1, len(ys), 4):
                    ys[first:first + 4] = np.nanmean(ys[first:first + 4])
            truth, contacts = bounce_times(spec), floor_contacts(ys, FPS)
            truths, found = truths + len(truth), found + sum(min(abs(c - t) for c in contacts) < 0.1 for t in truth)
            distances += [1000 * min(abs(c - t) for c in contacts) for t in truth] if contacts else []
        result[name] = {"bounces": truths, "found_within_100ms": found, "median_ms": float(np.median(distances)),
                        "max_ms_of_found": float(max(d for d in distances if d < 100))}
    return result


def check_audio(clips: Clips, count: int) -> dict:
    """Sound follows the picture, on the baseline clips of the held-out prompts plus bouncing ones."""
    prompts = [p for _, p in held_out_prompts(count)]
    bouncing = [caption(*content, 1) for content in content_tuples("heldout") if content[2] == "bouncing"][:6]
    correlations, offsets, rows = [], [], []
    contacts_total = contacts_heard = 0  # floor contacts, and those with a click within 50 ms
    for prompt in dict.fromkeys(prompts + bouncing):
        clip = clips.get(prompt, "baseline")
        tr = track(clip.frames)
        pitch = dominant_pitch(clip.audio, clip.sample_rate, clip.fps, len(clip.frames))
        valid = ~np.isnan(tr.ys) & ~np.isnan(pitch)
        row = {"prompt": prompt}
        if valid.sum() >= 20 and np.std(tr.ys[valid]) > 2:
            row["pitch_height_r"] = float(np.corrcoef(-tr.ys[valid], np.log(pitch[valid]))[0, 1])
            correlations.append(row["pitch_height_r"])
        if "bounc" in prompt:
            contacts = floor_contacts(tr.ys, clip.fps)
            clicks = click_times(clip.audio, clip.sample_rate)
            row.update(contacts=[round(t, 3) for t in contacts], clicks=[round(t, 3) for t in clicks])
            for t in clicks:
                if contacts:
                    offsets.append(min(abs(t - c) for c in contacts))
            contacts_total += len(contacts)
            contacts_heard += sum(any(abs(t - c) <= 0.05 for t in clicks) for c in contacts)
        rows.append(row)
    mean_r = float(np.mean(correlations)) if correlations else float("nan")
    median_ms = 1000 * float(np.median(offsets)) if offsets else float("nan")
    return {"pitch_height_r_mean": mean_r, "clips_with_vertical_motion": len(correlations),
            "click_contact_median_ms": median_ms, "clicks_matched": len(offsets),
            "clicks_within_50ms": int(sum(o <= 0.05 for o in offsets)), "contacts": contacts_total,
            "contacts_with_click_within_50ms": contacts_heard, "per_prompt": rows,
            "pass": mean_r >= 0.6 and median_ms <= 50}


def subject_offset(base: np.ndarray, other: np.ndarray) -> float:
    """Median distance (px) between the tracked subject of two clips over the frames where both were found; a
    ghost leaves the subject where the baseline has it (small), drift moves it (large). NaN if never both found."""
    a, b = track(base), track(other)
    d = np.hypot(a.xs - b.xs, a.ys - b.ys)
    return float(np.nanmedian(d)) if np.isfinite(d).any() else float("nan")


def save_strip(path: Path, clips: dict[str, np.ndarray], every: int = 12) -> None:
    """One PNG: a row of every `every`-th frame per clip, the first clip's row on top, each other clip followed by
    its absolute difference to the first (x3)."""
    from PIL import Image

    names = list(clips)
    base = clips[names[0]].astype(np.int16)
    rows = [np.concatenate(list(clips[names[0]][::every]), axis=1)]
    for name in names[1:]:
        frames = clips[name]
        rows.append(np.concatenate(list(frames[::every]), axis=1))
        diff = np.clip(np.abs(frames.astype(np.int16) - base) * 3, 0, 255).astype(np.uint8)
        rows.append(np.concatenate(list(diff[::every]), axis=1))
    Image.fromarray(np.concatenate(rows, axis=0)).save(path)


def sparse_geometry(engine, tier: str) -> dict:
    """The tile geometry a tier's sparse attention runs at on a 5 s clip at the model's canvas."""
    from engine.interface import tier_plan
    from engine.layout import resolve_canvas
    from engine.tiers import SPARSE_TILE_CUBES
    from kernels.tile_select import num_keep_tiles

    request = engine.validate({"prompt": "x", "seed": SEED, "tier": tier, "force": True})
    sparse = tier_plan(engine.tiers, request, engine.num_blocks, engine.components.geometry.sparse_tile).tier.sparse
    geometry = engine.components.geometry
    canvas = resolve_canvas(geometry, request.duration_seconds, request.aspect_ratio, request.short_edge)
    rows = canvas.num_latent_frames * (canvas.latent_height // geometry.patch_size[1]) * (
        canvas.latent_width // geometry.patch_size[2])
    tiles = -(-rows // sparse.tile)
    return {"tile_rows": sparse.tile, "cube_thw": list(SPARSE_TILE_CUBES[sparse.tile]), "video_rows": rows,
            "video_tiles": tiles, "kept_per_query_tile": num_keep_tiles(tiles, sparse.keep_ratio),
            "keep_ratio": sparse.keep_ratio, "dense_first_steps": sparse.dense_first_steps,
            "dense_first_blocks": sparse.dense_first_blocks}


def check_ghost(clips: Clips, count: int, ghost_tile: int = 0, strips: Path | None = None,
                attention_prompts: int = 1, first: int = 0) -> dict:
    """Ghost counts for the aggressive setting and sol, with the drift evidence per clip, and (on the first
    `attention_prompts` prompts) how much of the dense attention the tile rule keeps (train/sparse_probe.py).
    `first` > 0 runs prompts first..count-1 only (a run split over processes; the counts are then of that part)."""
    from quality import ClipData, compare_clips
    from train.sparse_probe import attention_mass_kept

    tiers = {"aggressive": "v-ghost", "sol": "v-sol" if ghost_tile else "sol"}
    rows, flagged = [], dict.fromkeys(tiers, 0)
    prompts = list(enumerate(held_out_prompts(count)))[first:]
    for index, (content, prompt) in prompts:
        base = clips.get(prompt, "baseline")
        row = {"prompt": prompt}
        for key, tier in tiers.items():
            other = clips.get(prompt, tier)
            result = compare_clips(ClipData(base.frames, 24.0), ClipData(other.frames, 24.0), lpips=False)
            tr = track(other.frames)
            row[key] = {"ghosting": bool(result.ghost.ghosting), "ghost_score": float(result.ghost.score),
                        "ssim": ssim(base.frames, other.frames),
                        "followed": bool(tr.colour == content[0] and tr.motion == content[2]),
                        "motion": tr.motion, "subject_offset_px": subject_offset(base.frames, other.frames)}
            flagged[key] += bool(result.ghost.ghosting)
        rows.append(row)
        print("  ghost", json.dumps(row), flush=True)
        if strips is not None:
            strips.mkdir(parents=True, exist_ok=True)
            save_strip(strips / f"ghost_{index:02d}.png",
                       {"baseline": base.frames, **{k: clips.get(prompt, t).frames for k, t in tiers.items()}})
    summary = {}
    for key in tiers:
        offsets = [r[key]["subject_offset_px"] for r in rows]
        summary[key] = {"followed": f"{sum(r[key]['followed'] for r in rows)}/{len(rows)}",
                        "median_subject_offset_px": float(np.nanmedian(offsets)),
                        "mean_ssim": float(np.mean([r[key]["ssim"] for r in rows]))}
    engine = clips.engine
    tiles = tuple(dict.fromkeys([engine.components.geometry.sparse_tile, ghost_tile or 16, 64]))
    attention = [attention_mass_kept(engine, prompt, tiles)
                 for _, (_, prompt) in prompts[:attention_prompts]]
    done = len(rows)
    return {"aggressive_flagged": f"{flagged['aggressive']}/{done}", "sol_flagged": f"{flagged['sol']}/{done}",
            "prompts": [index for index, _ in prompts],
            "tiers": tiers, "geometry": {k: sparse_geometry(engine, t) for k, t in tiers.items()},
            "summary": summary, "attention_mass_kept": attention, "per_prompt": rows,
            "pass": flagged["aggressive"] >= 6 and flagged["sol"] < flagged["aggressive"] if not first else None}


FL2VA_SEED = 20261221  # the keyframes' clips: nuisance parameters no training seed drew
FL2VA_WITHIN_PX = 16.0  # half a transformer token (32 px); the shapes' radius is 20-24 px


def fl2va_keyframes(count: int) -> list[tuple]:
    """(spec, prompt, keyframe uint8 (H, W, 3), keyframe centre (x, y)) for the first `count` held-out prompts: the
    keyframe is frame 0 of the prompt's own clip under seed FL2VA_SEED + i."""
    import torch

    from train.dataset import make_spec, render_video, trajectory

    rows = []
    for index, (content, template) in enumerate(heldout_set(count)):
        spec = make_spec(content, FL2VA_SEED + index, template)
        keyframe = (render_video([spec], torch.tensor([0]))[0, 0] * 255).round().to(torch.uint8).numpy()
        x, y = trajectory([spec], torch.tensor([0.0]))
        rows.append((spec, spec.caption, keyframe, (float(x[0, 0]), float(y[0, 0]))))
    return rows


def first_frames_match(frames: np.ndarray, keyframe: np.ndarray, centre: tuple[float, float], spec) -> dict:
    """How a clip's first frames match a keyframe: the tracked subject's frame-0 centre against the keyframe's, SSIM of
    frame 0 and of frames 0-4 to it, and the whole clip's tracked colour, shape and motion against the keyframe's."""
    tr = track(frames)
    x, y = tr.xs[0], tr.ys[0]
    offset = float(np.hypot(x - centre[0], y - centre[1])) if np.isfinite(x) else None
    # The subject's own square of the keyframe (2 x (radius + 8) px): the whole frame's SSIM is mostly background.
    half = int(round(spec.radius + 8))
    top, left = max(0, int(round(centre[1])) - half), max(0, int(round(centre[0])) - half)
    crop = (slice(top, top + 2 * half), slice(left, left + 2 * half))
    return {"frame0_centre": None if offset is None else [round(float(x), 1), round(float(y), 1)],
            "offset_px": None if offset is None else round(offset, 1),
            "within": offset is not None and offset <= FL2VA_WITHIN_PX,
            "ssim_frame0": round(ssim(frames[:1], keyframe[None]), 4),
            "ssim_frame0_subject": round(ssim(frames[:1, crop[0], crop[1]], keyframe[None, crop[0], crop[1]]), 4),
            "ssim_frames0_4": round(ssim(frames[:5], np.repeat(keyframe[None], 5, axis=0)), 4),
            **spec_match(tr, spec)}


def spec_match(tr, spec) -> dict:
    """A track's colour, shape and motion against a clip spec's (`tally` counts them over prompts)."""
    return {"colour_ok": tr.colour == spec.colour, "shape_ok": tr.shape == spec.shape,
            "motion_ok": tr.motion == spec.motion, "tracked": [tr.colour, tr.shape, tr.motion]}


def tally(arm: list[dict]) -> dict:
    """{"colour": "k/n", "shape": ..., "motion": ...} over one arm's `spec_match` rows."""
    return {key: f"{sum(a[f'{key}_ok'] for a in arm)}/{len(arm)}" for key in ("colour", "shape", "motion")}


def check_fl2va(clips: Clips, count: int, strips: Path | None = None) -> dict:
    """fl2va with a first-frame keyframe against the t2va control (module docstring, check 6)."""
    from train.tasks import png

    rows = []
    for index, (spec, prompt, keyframe, centre) in enumerate(fl2va_keyframes(count)):
        arms = {"fl2va": clips.keyframed(prompt, png(keyframe)), "t2va": clips.get(prompt, "baseline")}
        row = {"prompt": prompt, "keyframe_centre": [round(c, 1) for c in centre],
               **{name: first_frames_match(clip.frames, keyframe, centre, spec) for name, clip in arms.items()}}
        rows.append(row)
        print("  fl2va", json.dumps(row), flush=True)
        if strips is not None:
            from PIL import Image

            strips.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.concatenate([keyframe] + [clip.frames[0] for clip in arms.values()], axis=1)).save(
                strips / f"fl2va_{index:02d}.png")
    summary = {}
    for name in ("fl2va", "t2va"):
        arm = [r[name] for r in rows]
        offsets = [a["offset_px"] for a in arm if a["offset_px"] is not None]
        summary[name] = {f"frame0_within_{FL2VA_WITHIN_PX:g}px": f"{sum(a['within'] for a in arm)}/{len(arm)}",
                         "frame0_found": f"{len(offsets)}/{len(arm)}",
                         "median_offset_px": float(np.median(offsets)) if offsets else None,
                         "mean_ssim_frame0": round(float(np.mean([a["ssim_frame0"] for a in arm])), 4),
                         "mean_ssim_frame0_subject": round(float(np.mean([a["ssim_frame0_subject"] for a in arm])), 4),
                         "mean_ssim_frames0_4": round(float(np.mean([a["ssim_frames0_4"] for a in arm])), 4),
                         **tally(arm)}
    within = sum(r["fl2va"]["within"] for r in rows) / len(rows)
    colour = sum(r["fl2va"]["colour_ok"] for r in rows) / len(rows)
    return {"prompts": len(rows), "within_px": FL2VA_WITHIN_PX, "seed": SEED, "keyframe_seed": FL2VA_SEED,
            "summary": summary, "per_prompt": rows,
            "pass": within >= 0.8 and colour >= 0.8}


REF2VA_SEED = FL2VA_SEED  # the references' specs: the very clips whose frame 0 the fl2va check uses as keyframes
REF2VA_PASS = 0.8


def ref2va_references(count: int) -> list[tuple]:
    """(spec, subject-free prompt, reference uint8 (352, 352, 3)) for the first `count` held-out prompts: the spec is
    the prompt's clip under seed REF2VA_SEED + i, its reference `train.tasks.images_for("ref2va", ...)` (what the
    trainer's ref2va samples show), and the prompt `subject_free_caption` of its motion, background and template."""
    from train.dataset import make_spec, subject_free_caption
    from train.tasks import images_for

    rows = []
    for index, (content, template) in enumerate(heldout_set(count)):
        spec = make_spec(content, REF2VA_SEED + index, template)
        (reference,) = images_for("ref2va", spec, ())
        rows.append((spec, subject_free_caption(spec.motion, spec.background, spec.template), reference))
    return rows


def subject_match(frames: np.ndarray, spec) -> dict:
    """The tracked subject of a clip against a spec's colour, shape and motion, and whether a subject was found."""
    tr = track(frames)
    return {**spec_match(tr, spec), "found": tr.colour is not None, "found_frames": round(tr.found, 3)}


def check_ref2va(clips: Clips, count: int, named: bool = True, strips: Path | None = None) -> dict:
    """ref2va: does the clip take its subject from the reference when the prompt does not name it?

    Per held-out prompt (`ref2va_references`), two clips on the same seed at 50 steps: ref2va (the subject-free
    prompt + the reference) and the control, t2va of the same subject-free prompt without it. The tracker reads each
    clip's colour, shape and motion against the reference's subject and the prompt's motion. The control's colour
    rate is what chance gives (1 / len(COLOURS) for a uniform pick); above it the colour comes from the reference.
    Pass: ref2va's tracked colour is the reference's on >= 80% of prompts, and on more prompts than the control's.
    With `named`, a third clip, ref2va of the full caption (which names the same subject) with the reference, is
    reported beside them (colour, shape, motion; not gated): a reference must not break a prompt that agrees with it.
    `strips`: a PNG per prompt, reference (128 px) | ref2va | t2va (| named) at the middle frame."""
    from collections import Counter

    from train.dataset import COLOURS
    from train.tasks import png

    arms = ("ref2va", "t2va", "named_ref2va") if named else ("ref2va", "t2va")
    rows = []
    for index, (spec, prompt, reference) in enumerate(ref2va_references(count)):
        data = png(reference)
        clip = {"ref2va": clips.referenced(prompt, data), "t2va": clips.get(prompt, "baseline")}
        if named:
            clip["named_ref2va"] = clips.referenced(spec.caption, data)
        row = {"prompt": prompt, "named_prompt": spec.caption, "reference": [spec.colour, spec.shape],
               "motion": spec.motion, **{name: subject_match(c.frames, spec) for name, c in clip.items()}}
        rows.append(row)
        print("  ref2va", json.dumps(row), flush=True)
        if strips is not None:
            from PIL import Image

            strips.mkdir(parents=True, exist_ok=True)
            height = clip["ref2va"].frames.shape[1]
            small = np.asarray(Image.fromarray(reference).resize((height, height), Image.Resampling.LANCZOS))
            middle = [c.frames[len(c.frames) // 2] for c in clip.values()]
            Image.fromarray(np.concatenate([small, *middle], axis=1)).save(strips / f"ref2va_{index:02d}.png")
    summary = {}
    for name in arms:
        arm = [r[name] for r in rows]
        summary[name] = tally(arm)
        summary[name]["found"] = f"{sum(a['found'] for a in arm)}/{len(arm)}"
        summary[name]["tracked_colours"] = dict(sorted(Counter(str(a["tracked"][0]) for a in arm).items()))
    colour = {name: sum(r[name]["colour_ok"] for r in rows) / len(rows) for name in ("ref2va", "t2va")}
    return {"prompts": len(rows), "seed": SEED, "reference_seed": REF2VA_SEED, "steps": clips.steps or "tier",
            "colour_chance": round(1 / len(COLOURS), 3), "colour_rate": colour,
            "gate": f"ref2va colour right on >= {REF2VA_PASS:.0%} of prompts and on more than the t2va control's",
            "summary": summary, "per_prompt": rows,
            "pass": colour["ref2va"] >= REF2VA_PASS and colour["ref2va"] > colour["t2va"]}


def benchmark(engine, repeats: int = 1) -> dict:
    """Seconds for a 5 s baseline + turbo pair (same prompt and seed), after a warm-up pair."""
    prompt = "a red circle bounces on a grey background"
    timings = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        base = engine.generate({"prompt": prompt, "seed": SEED + i, "tier": "baseline"})
        turbo = engine.generate({"prompt": prompt, "seed": SEED + i, "tier": "v-turbo"})
        steps = [s["seconds"] for s in base.steps + turbo.steps]
        fixed = sum(v for clip in (base, turbo) for k, v in clip.timings.items() if k != "denoise")
        timings.append({"pair_s": time.perf_counter() - start, "baseline": base.timings, "turbo": turbo.timings,
                        "forwards": len(steps), "step_min_s": min(steps), "step_median_s": float(np.median(steps)),
                        "non_denoise_s": fixed})
    measured = timings[1:]
    pair = float(np.median([t["pair_s"] for t in measured]))
    # On a shared 2-core machine one step takes 0.1-10 s depending on neighbours; the fastest step times the number
    # of forwards, plus the non-denoise stages, estimates the pair on an idle machine.
    idle = float(np.median([t["forwards"] * t["step_min_s"] + t["non_denoise_s"] for t in measured]))
    return {"pair_seconds": pair, "idle_estimate_seconds": idle, "runs": measured, "pass": pair <= 30.0}


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "assets" / "nano")
    parser.add_argument("--loras", type=Path, default=ROOT / "assets" / "loras")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--ghost-prompts", type=int, default=10)
    parser.add_argument("--ghost-tile", type=int, default=0,
                        help="sparse tile rows for the ghost check's tiers (0: the model's own, h3_studio.json)")
    parser.add_argument("--ghost-strips", type=Path, default=None, help="write a PNG strip per ghost prompt here")
    parser.add_argument("--ghost-first", type=int, default=0, help="ghost check: start at this prompt (split runs)")
    parser.add_argument("--ghost-dense-steps", type=int, default=0,
                        help="ghost check: the aggressive setting's dense steps before sparse attention starts (0: "
                             "the issue's setting; 40 keeps the nano's layout, TRAINING.md section 3)")
    parser.add_argument("--attention-prompts", type=int, default=1,
                        help="ghost check: measure the attention mass sparse attention keeps on this many prompts")
    parser.add_argument("--checks", default="steering,turbo,audio,ghost,bench",
                        help="comma list; also contacts (the floor-contact rule on ground truth, no model), fl2va "
                             "(a first-frame keyframe against the t2va control) and ref2va (a reference image with a "
                             "prompt that names no subject, against t2va of that prompt; pass: ref2va's colour is the "
                             "reference's on >= 80%% of --prompts and on more than the control's) and vocabulary "
                             "(held-out prompts with a word outside the captions; reported)")
    parser.add_argument("--fl2va-strips", type=Path, default=None,
                        help="fl2va check: write a PNG per prompt (keyframe | fl2va frame 0 | t2va frame 0) here")
    parser.add_argument("--ref2va-named", action=argparse.BooleanOptionalAction, default=True,
                        help="ref2va check: also run the full caption (which names the subject) with the reference "
                             "(one more clip per prompt; reported, not gated)")
    parser.add_argument("--ref2va-strips", type=Path, default=None,
                        help="ref2va check: write a PNG per prompt (reference | ref2va | t2va | named, middle frame)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from engine.engine import Engine

    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as handle:
        handle.write(tiers_toml(args.loras, args.ghost_tile, args.ghost_dense_steps))
    engine = Engine.load(str(args.model), tiers_file=handle.name, device="cpu")
    results = {"model": str(args.model), "model_id": engine.model_id, "threads": args.threads}
    clips = Clips(engine)
    checks = {"contacts": check_contact_rule, "bench": lambda: benchmark(engine),
              "steering": lambda: check_steering(clips, args.prompts),
              "turbo": lambda: check_turbo(clips, args.prompts), "audio": lambda: check_audio(clips, args.prompts),
              "ghost": lambda: check_ghost(clips, args.ghost_prompts, args.ghost_tile, args.ghost_strips,
                                           args.attention_prompts, args.ghost_first),
              "vocabulary": lambda: check_vocabulary(clips, args.prompts),
              "fl2va": lambda: check_fl2va(clips, args.prompts, args.fl2va_strips),
              "ref2va": lambda: check_ref2va(clips, args.prompts, args.ref2va_named, args.ref2va_strips)}
    for name in args.checks.split(","):
        start = time.time()
        try:
            results[name] = checks[name]()
        except Exception as error:  # noqa: BLE001 - a failing check is a result, recorded with its reason
            results[name] = {"error": f"{type(error).__name__}: {error}", "pass": False}
        results[name]["check_seconds"] = round(time.time() - start, 1)
        print(name, json.dumps({k: v for k, v in results[name].items() if not isinstance(v, (list, dict))}),
              flush=True)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()

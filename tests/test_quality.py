"""quality: the public API, the CLI on real MP4s, mismatch handling, audio metrics, LPIPS fallbacks and the
overlay cache. Clips are synthetic (quality.synth) and small, so the module runs in seconds here.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

import quality
from quality import (
    ClipData,
    Gates,
    OverlayCache,
    QualityError,
    compare_clips,
    lpips_metric,
    read_clip,
    render_diff_heatmap,
    render_ghost_overlay,
    synth,
    write_clip,
)
from quality.audio import compare_audio, integrated_loudness

ROOT = Path(__file__).resolve().parent.parent
W, H, T = 448, 256, 16
SUMMARY_KEYS = {"frames", "ghosting", "ghost_score", "worst_frame", "psnr_mean", "ssim_mean", "lpips_delta",
                "sharpness_ratio", "temporal_jitter_ratio", "audio", "per_frame", "gates", "suggested_verdict",
                "suggestion_reasons", "lpips_reason", "flip", "flip_reason", "temporal_consistency", "worst_by",
                "ghost_peak_frame", "subject_lost_frames", "subject_present", "subject_displacement_px",
                "subject_fragments", "subject_colour_delta", "subject_patch", "subject_flip"}


@pytest.fixture(scope="module")
def scene() -> synth.Scene:
    return synth.make_scene(11, width=W, height=H, frames=T, speed=6.0)


@pytest.fixture(scope="module")
def base_frames(scene) -> np.ndarray:
    return synth.render_clip(scene)


@pytest.fixture(scope="module")
def ghost_frames(scene) -> np.ndarray:
    return synth.render_clip(scene, synth.Ghost(0.15, 4))


@pytest.fixture(scope="module")
def audio() -> synth.SynthAudio:
    return synth.synth_audio(T / 24.0, seed=3)


def delayed(samples: np.ndarray, rate: int, ms: float) -> np.ndarray:
    """The same audio, `ms` later (positive) or earlier (negative), length kept."""
    shift = round(ms * rate / 1000)
    if shift >= 0:
        return np.concatenate([np.zeros((2, shift), np.float32), samples[:, :samples.shape[1] - shift]], axis=1)
    return np.concatenate([samples[:, -shift:], np.zeros((2, -shift), np.float32)], axis=1)


def clip(frames: np.ndarray, audio: synth.SynthAudio | None = None, samples: np.ndarray | None = None) -> ClipData:
    if audio is None:
        return ClipData(frames, 24.0)
    return ClipData(frames, 24.0, audio.samples if samples is None else samples, audio.sample_rate)


# ------------------------------------------------------------------------------------------------ API


def test_identical_clips_pass_every_gate(base_frames, audio):
    summary = compare_clips(clip(base_frames, audio), clip(base_frames, audio), lpips=False).summary()
    assert set(summary) == SUMMARY_KEYS
    assert summary["frames"] == T and len(summary["per_frame"]) == T
    assert summary["psnr_mean"] == 100.0 and summary["ssim_mean"] == 1.0
    assert summary["sharpness_ratio"] == 1.0 and summary["temporal_jitter_ratio"] == 1.0
    assert summary["ghosting"] is False and summary["ghost_score"] == 0.0
    assert summary["audio"]["desync_ms"] == 0.0 and summary["audio"]["mel_distance_db"] == 0.0
    assert summary["suggested_verdict"] == "accept"
    assert summary["gates"]["lpips_delta"]["passed"] is None  # not requested: reported, never silently passed
    assert summary["lpips_reason"] == "LPIPS not requested"
    assert summary["suggestion_reasons"][-1].startswith("Not measured: LPIPS (LPIPS not requested)")
    assert summary["subject_lost_frames"] == [] and summary["subject_present"] == 1.0
    assert json.loads(json.dumps(summary)) == summary  # plain JSON, no numpy types or infinities


def test_ghost_is_flagged_where_it_is(scene, base_frames, ghost_frames):
    comparison = compare_clips(clip(base_frames), clip(ghost_frames), lpips=False)
    summary = comparison.summary()
    assert summary["ghosting"] is True
    assert 0.08 <= summary["ghost_score"] <= 0.2  # planted at 0.15; the estimate is the copy's opacity
    assert summary["gates"]["ghosting"]["passed"] is False
    assert summary["suggested_verdict"] == "reject"
    worst = summary["worst_frame"]
    assert summary["per_frame"][worst]["ghost"] is True
    assert summary["per_frame"][worst]["ghost_lag"] == 4
    # The heatmap's mass lies on the planted copy: the subject's footprint 4 frames earlier.
    heat = comparison.ghost_heatmap(worst)
    assert heat.shape == (H, W) and heat.dtype == np.float32 and 0 <= heat.min() and heat.max() <= 1
    copy = synth.render_clip(scene, synth.Ghost(1.0, 4))[worst].astype(int) - base_frames[worst]
    footprint = cv2.dilate((np.abs(copy).max(axis=2) > 20).astype(np.uint8), np.ones((9, 9), np.uint8)) > 0
    assert heat[footprint].sum() > 0.9 * heat.sum() > 0


def test_a_shared_baseline_flow_gives_the_same_report_and_is_computed_once(base_frames, ghost_frames):
    """compare_clips(baseline_motion=...): candidates against one baseline reuse its flow, report unchanged."""
    from quality.metrics import BaselineMotionCache

    cache = BaselineMotionCache()
    noisy = synth.noise(base_frames, 8)
    for candidate in (ghost_frames, noisy):
        fresh = compare_clips(clip(base_frames), clip(candidate), lpips=False, flip=False).summary()
        shared = compare_clips(clip(base_frames), clip(candidate), lpips=False, flip=False,
                               baseline_motion=cache).summary()
        assert shared == fresh
    assert cache.computed == 1
    compare_clips(clip(noisy), clip(base_frames), lpips=False, flip=False, baseline_motion=cache)
    assert cache.computed == 2  # a new baseline is computed, never served from the old one


def test_overlays_are_rgb_frames(base_frames, ghost_frames):
    comparison = compare_clips(clip(base_frames), clip(ghost_frames), lpips=False)
    i = comparison.worst_frame
    diff = render_diff_heatmap(comparison, i)
    overlay = render_ghost_overlay(comparison, i)
    assert diff.shape == overlay.shape == (H, W, 3) and diff.dtype == overlay.dtype == np.uint8
    changed = np.abs(overlay.astype(int) - base_frames[i]).max(axis=2) > 10
    assert changed.any() and (comparison.ghost_heatmap(i)[changed] > 0).mean() > 0.5
    assert comparison.absdiff.shape == (T, H, W)
    with pytest.raises(QualityError, match="out of range"):
        render_ghost_overlay(comparison, T)


def test_noise_and_blur_fail_sharpness_and_jitter_but_are_not_ghosts(base_frames):
    noisy = compare_clips(clip(base_frames), clip(synth.noise(base_frames, 8)), lpips=False).summary()
    assert noisy["sharpness_ratio"] > 1.08 and noisy["gates"]["sharpness_ratio"]["passed"] is False
    assert noisy["temporal_jitter_ratio"] > 1.2 and noisy["gates"]["temporal_jitter_ratio"]["passed"] is False
    blurred = compare_clips(clip(base_frames), clip(synth.blur(base_frames, 1.5)), lpips=False).summary()
    assert blurred["sharpness_ratio"] < 0.95 and blurred["gates"]["sharpness_ratio"]["passed"] is False
    assert noisy["ghosting"] is False and blurred["ghosting"] is False
    assert noisy["suggested_verdict"] == blurred["suggested_verdict"] == "reject"


def test_gates_are_configurable(base_frames):
    comparison = compare_clips(clip(base_frames), clip(synth.noise(base_frames, 8)), lpips=False,
                               gates=Gates(sharpness_ratio_min=0.95, sharpness_ratio_max=10.0,
                                           temporal_jitter_ratio_max=100.0, lpips_delta_max=None, flip_mean_max=None,
                                           flip_window_max=None, temporal_consistency_max=None))
    summary = comparison.summary()
    assert summary["gates"]["sharpness_ratio"] == {"value": summary["sharpness_ratio"], "limit": [0.95, 10.0],
                                                   "passed": True, "frames": None, "frame": None, "text": None}
    assert summary["gates"]["lpips_delta"]["limit"] is None
    assert summary["gates"]["flip"] == {"value": summary["flip"], "limit": None, "passed": None, "frames": None,
                                        "frame": None, "text": None}
    assert summary["gates"]["temporal_consistency"]["passed"] is None and summary["temporal_consistency"] > 0
    assert summary["suggested_verdict"] == "accept"


def test_mismatched_pairs_need_align(base_frames):
    with pytest.raises(QualityError, match=r"frame count mismatch: baseline has 16 frames, candidate has 12.*--align"):
        compare_clips(clip(base_frames), clip(base_frames[:12]), lpips=False)
    smaller = np.stack([cv2.resize(f, (W // 2, H // 2), interpolation=cv2.INTER_AREA) for f in base_frames])
    with pytest.raises(QualityError, match=r"frame size mismatch: baseline is 448x256, candidate is 224x128"):
        compare_clips(clip(base_frames), clip(smaller), lpips=False)
    aligned = compare_clips(clip(base_frames), clip(smaller[:12]), lpips=False, align=True)
    assert aligned.frames == 12 and aligned.candidate.frames.shape == (12, H, W, 3)
    assert aligned.summary()["ssim_mean"] > 0.7  # resized back, so close to the baseline, not garbage
    assert any("resized" in n for n in aligned.notes) and any("first 12" in n for n in aligned.notes)


# ---------------------------------------------------------------------------------------------- audio


def test_audio_desync_loudness_and_mel(audio):
    rate = audio.sample_rate
    late = compare_audio(audio.samples, rate, delayed(audio.samples, rate, 80), rate)
    assert late.desync_ms == pytest.approx(80, abs=2)
    early = compare_audio(audio.samples, rate, delayed(audio.samples, rate, -25), rate)
    assert early.desync_ms == pytest.approx(-25, abs=2)
    quiet = compare_audio(audio.samples, rate, audio.samples * 0.5, rate)
    assert quiet.loudness_delta_lu == pytest.approx(-6.02, abs=0.05)
    assert quiet.mel_distance_db == pytest.approx(6.02, abs=0.1) and quiet.desync_ms == pytest.approx(0, abs=1)
    # BS.1770 calibration: a full-scale 997 Hz sine in both channels reads 0 LUFS, in one channel -3.01.
    t = np.arange(3 * 48000) / 48000
    sine = np.sin(2 * np.pi * 997 * t)
    assert integrated_loudness(np.stack([sine, sine]), 48000) == pytest.approx(0.0, abs=0.02)
    assert integrated_loudness(np.stack([sine, 0 * sine]), 48000) == pytest.approx(-3.01, abs=0.02)
    assert integrated_loudness(np.zeros((2, 48000)), 48000) is None


def test_audio_gate_in_summary(base_frames, audio):
    rate = audio.sample_rate
    out = compare_clips(clip(base_frames, audio), clip(base_frames, audio, delayed(audio.samples, rate, 120)),
                        lpips=False).summary()
    assert out["audio"]["desync_ms"] == pytest.approx(120, abs=2)
    assert out["gates"]["audio_desync_ms"]["passed"] is False
    assert out["suggested_verdict"] == "reject"
    ok = compare_clips(clip(base_frames, audio), clip(base_frames, audio, delayed(audio.samples, rate, 30)),
                       lpips=False).summary()
    assert ok["gates"]["audio_desync_ms"]["passed"] is True
    silent = compare_clips(clip(base_frames, audio), clip(base_frames), lpips=False).summary()
    assert silent["audio"] is None and silent["gates"]["audio_desync_ms"]["passed"] is None
    assert any("candidate has no audio track" in r for r in silent["suggestion_reasons"])


def pulse_train(contour, seed: int, seconds: float = 5.0, rate: int = 48000) -> np.ndarray:
    """Stereo like the nano's audio: a 220 Hz burst every ~40 ms, its loudness following a slow contour."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(rate * seconds)) / rate
    pulses = np.zeros_like(t)
    for start in np.arange(0.01, seconds - 0.01, 0.040) + rng.normal(0, 0.002, len(np.arange(0.01, seconds - 0.01,
                                                                                              0.040))):
        i = int(start * rate)
        pulses[i:i + 400] += np.exp(-np.arange(len(pulses[i:i + 400])) / 80)
    x = pulses * np.sin(2 * np.pi * 220 * t) * contour(t) + 0.01 * rng.standard_normal(len(t))
    return np.stack([x, x]).astype(np.float32)


def test_audio_desync_is_not_guessed_when_the_tracks_differ():
    """Two pulse trains whose loudness contours differ have no true lag: the old search read one anyway (the
    correlation is a comb whose highest tooth follows the slow contour) and failed clean nano pairs at its edge."""
    rate = 48000
    rising = pulse_train(lambda t: 1 + 0.8 * np.sin(2 * np.pi * t / 5), seed=1)
    falling = pulse_train(lambda t: 1 - 0.8 * np.sin(2 * np.pi * t / 5), seed=2)
    differ = compare_audio(rising, rate, falling, rate)
    assert differ.desync_ms is None and differ.correlation < 0.7
    assert "differ too much" in differ.desync_reason or "edge" in differ.desync_reason
    # The same train late by 800 ms (beyond the old +-500 ms search) is a measured desync.
    late = compare_audio(rising, rate, delayed(rising, rate, 800), rate)
    assert late.desync_ms == pytest.approx(800, abs=2) and late.desync_reason is None


def test_audio_desync_is_not_read_from_a_comb_tooth_of_a_clean_nano_pair():
    """A clean turbo pair of the seed-48 set (prompt 1; both tracks at 8 kHz, int16): its onset envelopes align best
    300 ms apart at 0.83, a tooth of the pulse-train comb under the loudness contour's hump, and the old 0.7 floor
    failed it as 300 ms out of sync. The same track late by 100 ms is still measured."""
    data = np.load(Path(__file__).parent / "data" / "audio_turbo_s48_p01_8k.npz")
    rate = int(data["rate"])
    base, cand = (np.repeat(data[k][None].astype(np.float32) / 32767, 2, axis=0) for k in ("base", "cand"))
    clean = compare_audio(base, rate, cand, rate)
    assert clean.desync_ms is None and 0.8 < clean.correlation < 0.85
    assert "differ too much" in clean.desync_reason
    late = compare_audio(base, rate, delayed(base, rate, 100), rate)
    assert late.desync_ms == pytest.approx(100, abs=2) and late.correlation > 0.9


def test_audio_gate_not_measured_names_why(base_frames):
    rate = 48000
    samples = pulse_train(lambda t: 1 + 0.8 * np.sin(2 * np.pi * t / 5), seed=1, seconds=T / 24.0)
    other = pulse_train(lambda t: 1 - 0.8 * np.sin(2 * np.pi * t / 5), seed=2, seconds=T / 24.0)
    base = clip(base_frames, synth.SynthAudio(samples, rate))
    out = compare_clips(base, clip(base_frames, synth.SynthAudio(other, rate)), lpips=False).summary()
    assert out["gates"]["audio_desync_ms"]["passed"] is None
    assert out["audio"]["desync_ms"] is None and out["audio"]["desync_reason"]
    assert any(out["audio"]["desync_reason"] in r for r in out["suggestion_reasons"])


# ---------------------------------------------------------------------------------------------- LPIPS


def test_lpips_unavailable_is_null_with_reason(base_frames, monkeypatch, tmp_path):
    """No AlexNet weights on disk (an empty torch hub cache): null, the reason, and no gate verdict. LPIPS with
    weights, and the other reasons, are in test_lpips_weights.py."""
    lpips_metric.reset_lpips_cache()
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    summary = compare_clips(clip(base_frames), clip(base_frames), flip=False).summary()
    assert summary["lpips_delta"] is None and summary["per_frame"][0]["lpips"] is None
    assert summary["lpips_reason"].startswith("LPIPS not available") and "--lpips-weights" in summary["lpips_reason"]
    assert summary["gates"]["lpips_delta"]["passed"] is None
    lpips_metric.reset_lpips_cache()


def test_lpips_values_when_a_model_is_available(base_frames):
    torch = pytest.importorskip("torch")

    class MeanAbs(torch.nn.Module):  # the LPIPS call signature: (N,3,H,W) in [-1, 1] twice -> (N,1,1,1)
        def forward(self, a, b):
            return (a - b).abs().mean(dim=(1, 2, 3), keepdim=True)

    scorer = lpips_metric.LpipsScorer(MeanAbs(), short_side=256)
    summary = compare_clips(clip(base_frames), clip(synth.noise(base_frames, 12)), lpips_scorer=scorer).summary()
    assert summary["lpips_reason"] is None and summary["lpips_delta"] > 0.04
    assert all(row["lpips"] > 0 for row in summary["per_frame"])
    assert summary["gates"]["lpips_delta"]["passed"] is False
    assert any(r.startswith("LPIPS ") and r.endswith("over the clip") for r in summary["suggestion_reasons"])


# -------------------------------------------------------------------------------------- reading clips


@pytest.fixture(scope="module")
def mp4s(tmp_path_factory, base_frames, ghost_frames, audio) -> dict[str, Path]:
    """H.264 yuv420p + AAC stereo MP4s written with PyAV."""
    root = tmp_path_factory.mktemp("mp4")
    rate = audio.sample_rate
    paths = {
        "base": (base_frames, audio.samples),
        "ghost": (ghost_frames, audio.samples),
        "late": (base_frames, delayed(audio.samples, rate, 80)),
        "short": (base_frames[:12], audio.samples),
        "silent": (base_frames, None),
        "small": (np.stack([cv2.resize(f, (W // 2, H // 2)) for f in base_frames]), audio.samples),
    }
    out = {}
    for name, (frames, samples) in paths.items():
        out[name] = root / f"{name}.mp4"
        write_clip(out[name], ClipData(frames, 24.0, samples, None if samples is None else rate))
    return out


def test_read_clip(mp4s, base_frames, audio):
    c = read_clip(mp4s["base"])
    assert c.frames.shape == (T, H, W, 3) and c.frames.dtype == np.uint8 and c.fps == 24.0
    assert np.abs(c.frames.astype(int) - base_frames).mean() < 3  # H.264 at crf 18
    assert c.audio.dtype == np.float32 and c.audio.shape[0] == 2 and c.sample_rate == audio.sample_rate
    assert c.audio.shape[1] >= audio.samples.shape[1]
    assert read_clip(mp4s["silent"]).audio is None


def test_read_clip_errors(tmp_path):
    with pytest.raises(QualityError, match="file not found"):
        read_clip(tmp_path / "missing.mp4")
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"this is not a video" * 100)
    with pytest.raises(QualityError, match="junk.mp4: not a readable video file"):
        read_clip(junk)
    wav = tmp_path / "tone.wav"
    import av
    with av.open(str(wav), "w") as container:
        stream = container.add_stream("pcm_s16le", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 800), np.int16), format="s16", layout="mono")
        frame.sample_rate = 8000
        container.mux(stream.encode(frame))
        container.mux(stream.encode())
    with pytest.raises(QualityError, match="no video stream"):
        read_clip(wav)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "quality", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)


def test_cli_compare_ghost_and_desync(mp4s, tmp_path):
    out = tmp_path / "summary.json"
    run = cli("compare", str(mp4s["base"]), str(mp4s["ghost"]), "--json", str(out))
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert json.loads(out.read_text()) == summary
    assert set(summary) == SUMMARY_KEYS
    assert summary["ghosting"] is True and summary["suggested_verdict"] == "reject"
    assert summary["lpips_delta"] is None or isinstance(summary["lpips_delta"], float)
    assert (summary["lpips_delta"] is None) == (summary["lpips_reason"] is not None)
    late = json.loads(cli("compare", str(mp4s["base"]), str(mp4s["late"]), "--no-lpips").stdout)
    assert late["audio"]["desync_ms"] == pytest.approx(80, abs=3)
    assert late["ghosting"] is False and late["gates"]["audio_desync_ms"]["passed"] is False


def test_cli_mismatch_errors_and_align(mp4s):
    short = cli("compare", str(mp4s["base"]), str(mp4s["short"]), "--no-lpips")
    assert short.returncode == 2 and short.stdout == ""
    assert "error: frame count mismatch: baseline has 16 frames, candidate has 12" in short.stderr
    small = cli("compare", str(mp4s["base"]), str(mp4s["small"]), "--no-lpips")
    assert small.returncode == 2 and "error: frame size mismatch" in small.stderr and "--align" in small.stderr
    aligned = cli("compare", str(mp4s["base"]), str(mp4s["small"]), "--no-lpips", "--align")
    assert aligned.returncode == 0 and json.loads(aligned.stdout)["frames"] == T
    assert "note: aligned: resized the candidate from 224x128 to 448x256" in aligned.stderr
    missing = cli("compare", str(mp4s["base"]), "nowhere.mp4")
    assert missing.returncode == 2 and "error: nowhere.mp4: file not found" in missing.stderr
    silent = json.loads(cli("compare", str(mp4s["silent"]), str(mp4s["silent"]), "--no-lpips").stdout)
    assert silent["audio"] is None and silent["ghosting"] is False


# ---------------------------------------------------------------------------------------------- cache


def test_overlay_cache_computes_once(mp4s, tmp_path, monkeypatch):
    cache = OverlayCache(tmp_path / "overlays", lpips=False)
    first = cache.get_or_compute("pair-1", mp4s["base"], mp4s["ghost"])
    assert first.computed and first.summary["ghosting"] is True
    assert len(first.diff_pngs) == len(first.ghost_pngs) == T
    worst = first.summary["worst_frame"]
    assert quality.overlays.read_overlay_frame(first.ghost_pngs[worst], worst).shape == (H, W, 3)
    assert json.loads(first.summary_path.read_text()) == first.summary
    assert not [p for p in (tmp_path / "overlays" / "pair-1").iterdir() if p.name.endswith(".tmp")]

    def no_recompute(*_args, **_kwargs):
        raise AssertionError("the cache recomputed")

    monkeypatch.setattr(quality.overlays, "compare_clips", no_recompute)
    second = cache.get_or_compute("pair-1", mp4s["base"], mp4s["ghost"])
    assert not second.computed and second.summary == first.summary and second.ghost_pngs == first.ghost_pngs
    os.utime(mp4s["ghost"], ns=(1, 1))  # the source changed: the cache must not answer from old files
    with pytest.raises(AssertionError, match="recomputed"):
        cache.get_or_compute("pair-1", mp4s["base"], mp4s["ghost"])
    with pytest.raises(QualityError, match="pair_key"):
        cache.get_or_compute("../escape", mp4s["base"], mp4s["ghost"])


def test_quality_module_imports_nothing_of_the_studio():
    """The quality module compares two clips and nothing more: no engine, db, gradio or other studio imports."""
    forbidden = {"engine", "db", "gradio", "fastapi", "sqlalchemy", "kernels"}
    for path in (ROOT / "studio" / "quality").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for name in names:
                top = name.split(".")[0]
                assert top not in forbidden, f"{path.name} imports {name}"
                assert not (top == "studio" and not name.startswith("quality")), f"{path.name} imports {name}"

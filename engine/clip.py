"""The one Clip type that flows from the engine onwards; everything downstream reads from it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.sidecar import ClipSidecar


@dataclass
class Clip:
    """A generated clip with everything needed to reproduce and judge it.

    frames: uint8 (T, H, W, 3); audio: float32 (2, N) stereo at `sample_rate`; mp4: the muxed file.
    `timings` maps stage → seconds (validate, plan, encode_text, prepare_noise, denoise, decode_video,
    decode_audio, mux); `inference_time_s` spans encode → decode like SGLang's (muxing excluded).
    """

    frames: np.ndarray
    audio: np.ndarray
    sample_rate: int
    fps: int
    mp4: bytes
    prompt: str
    seed: int
    tier: str
    tier_config: dict
    model_id: str
    model_name: str
    tokens: int
    padded_tokens: int
    width: int
    height: int
    duration_seconds: float
    requested_duration: float
    aspect_ratio: str
    short_edge: int
    timings: dict
    steps: list[dict] = field(default_factory=list)
    lora: dict | None = None
    compiles: dict = field(default_factory=dict)
    untrained: list[str] = field(default_factory=list)
    peak_memory_mb: float | None = None
    stage_peak_memory_mb: dict = field(default_factory=dict)  # CUDA: stage -> its own peak (MiB), as `timings`
    task: str = "t2va"  # t2va, fl2va (keyframes) or ref2va (reference images)
    inputs: dict = field(default_factory=dict)  # the conditioning inputs by field, described (sha256, size)
    trajectory: Any = None  # engine.trajectory.Trajectory when the request asked for it (not in the sidecar)

    @property
    def num_frames(self) -> int:
        return int(self.frames.shape[0])

    @property
    def inference_time_s(self) -> float:
        stages = ("prepare_inputs", "encode_text", "encode_inputs", "prepare_noise", "denoise", "decode_video",
                  "decode_audio")
        return float(sum(self.timings.get(stage, 0.0) for stage in stages))

    def sidecar(self) -> dict:
        """The JSON written next to the MP4 (engine/sidecar.py ClipSidecar, the one sidecar type)."""
        return ClipSidecar(
            prompt=self.prompt, seed=self.seed, tier=self.tier, tier_config=self.tier_config, model_id=self.model_id,
            model_name=self.model_name, tokens=self.tokens, padded_tokens=self.padded_tokens, frames=self.num_frames,
            fps=self.fps, sample_rate=self.sample_rate, width=self.width, height=self.height,
            duration_seconds=self.duration_seconds, requested_duration=self.requested_duration,
            aspect_ratio=self.aspect_ratio, short_edge=self.short_edge, timings=self.timings,
            inference_time_s=self.inference_time_s, steps=self.steps, lora=self.lora, compiles=self.compiles,
            untrained=self.untrained, peak_memory_mb=self.peak_memory_mb,
            stage_peak_memory_mb=self.stage_peak_memory_mb, task=self.task, inputs=self.inputs,
        ).to_json()

    def save(self, path: str | Path) -> tuple[Path, Path]:
        """Write FILE.mp4 and FILE.json; returns both paths."""
        mp4_path = Path(path)
        mp4_path.parent.mkdir(parents=True, exist_ok=True)
        mp4_path.write_bytes(self.mp4)
        json_path = mp4_path.with_suffix(".json")
        json_path.write_text(json.dumps(self.sidecar(), indent=2) + "\n")
        return mp4_path, json_path

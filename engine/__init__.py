"""The engine's public interface: every name the studio and app.py use, and the only place they import it from
(tests/test_imports.py refuses `from engine.<module> import ...` in studio/ and app.py).

Names load on first use (PEP 562): `import engine` stays cheap (no torch), and `from engine import Engine`
imports torch and diffusers only when it is asked for. bench/, train/ and the engine's own tests reach into
engine modules directly; they are the engine's workbench, not its users.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

# name -> the engine module that defines it
_EXPORTS = {
    # running the model
    "Engine": "engine",  # the in-process engine (Engine.load)
    "ParallelEngine": "parallel",  # the same interface over a Ulysses worker group
    "ModelEngine": "interface",  # what the studio needs of an engine (local, parallel or remote)
    "GenerationEngine": "interface",
    "RequestPlan": "interface",  # a validated request with its tier plan: what generate() runs
    # requests and their limits
    "GenerationRequest": "request",
    "ModelLimits": "request",
    "validate_request": "request",
    "validate_prompt": "request",
    "validate_duration": "request",
    "ASPECT_RATIOS": "request",
    "MIN_STEPS": "request",
    "MAX_STEPS": "request",
    "REFUSED_FIELDS": "request",
    "RequestError": "errors",  # names the field that is wrong, from the engine to the screen
    "GenerationCancelled": "errors",
    "fields_renamed": "errors",
    # canvases and conditioning inputs
    "FPS": "canvases",
    "ModelCanvas": "canvases",
    "RELEASED": "canvases",
    "canvas_size": "canvases",
    "frame_count": "canvases",
    "duration_for_frames": "canvases",
    "request_for_size": "canvases",
    "INPUT_FIELDS": "conditioning",
    "IMAGE_FORMATS": "conditioning",
    "MAX_IMAGE_BYTES": "conditioning",
    "MAX_REFERENCES": "conditioning",
    "InputImage": "conditioning",  # a keyframe or reference image as a request carries it
    "keyframes_on_canvas": "tasks",
    # tiers and their knobs
    "DEFAULT_TIERS": "tiers",
    "TierSpec": "tiers",
    "TierTable": "tiers",
    "TierPlan": "tiers",
    "check_tier": "tiers",
    "spec_from_table": "tiers",
    "with_knobs": "tiers",
    "Knob": "techniques",
    "knob": "techniques",
    "all_knobs": "techniques",
    # what a clip carries
    "ClipSidecar": "sidecar",
    "RemoteOrigin": "sidecar",
    "probe_mp4": "media",
    "most_hits": "cache",
    "RANDOM_WEIGHTS": "labels",
    "model_label": "labels",
    "Trajectory": "trajectory",
    "pool_video": "trajectory",
    "sol_series": "trajectory",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r} (its public names: engine.__all__)")
    value = getattr(import_module(f"engine.{module}"), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

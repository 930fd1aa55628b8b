"""The JSON written beside every clip's MP4 (``<sha256>.json``): one typed sidecar for every clip the studio stores.

    ClipSidecar(...).to_json() -> dict          what the engine's Clip and a remote server's clip both write
    ClipSidecar.from_json(stored) -> ClipSidecar  what readers get back (old sidecars included)

Why here: the engine makes most clips (engine/clip.py) and studio/remote.py makes the rest from a server's answer;
both build this one type, so a reader never meets two spellings. db/ stores the JSON without knowing the type
(db never imports the engine) and checks the keys it indexes (db/convert.py clip_columns).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = ["ClipSidecar", "RemoteOrigin"]


@dataclass(frozen=True)
class RemoteOrigin:
    """Where a remote clip came from: the --remotes server, its job id, its params and the model it reported."""

    name: str
    url: str
    video_id: str
    params: dict[str, Any] = field(default_factory=dict)
    model: str | None = None


@dataclass(frozen=True)
class ClipSidecar:
    """What made a clip and what it cost. ``steps``: the engine records each denoising step (a list of dicts);
    a remote server reports only how many it ran (an int). ``timings`` maps stage -> seconds."""

    prompt: str
    seed: int
    tier: str
    tier_config: dict[str, Any]
    model_id: str
    model_name: str
    tokens: int
    frames: int
    fps: float
    sample_rate: int | None
    width: int
    height: int
    duration_seconds: float
    requested_duration: float
    aspect_ratio: str
    short_edge: int
    timings: dict[str, float]
    inference_time_s: float  # encode -> decode, like SGLang's (a remote clip: the server's, else the studio's wait)
    steps: list[dict[str, Any]] | int | None = None
    peak_memory_mb: float | None = None
    # engine clips
    padded_tokens: int | None = None
    lora: dict[str, Any] | None = None
    compiles: dict[str, Any] = field(default_factory=dict)
    untrained: list[str] = field(default_factory=list)
    stage_peak_memory_mb: dict[str, float] = field(default_factory=dict)  # CUDA: stage -> its own peak (MiB)
    task: str = "t2va"
    inputs: dict[str, Any] = field(default_factory=dict)
    # remote clips
    inference_time_source: str | None = None  # "server", or the client's wait when the server reported none
    client_time_s: float | None = None
    remote: RemoteOrigin | None = None

    def to_json(self) -> dict[str, Any]:
        """The stored JSON; fields of the other kind of clip (engine or remote) are left out, not written null."""
        data = asdict(self)
        if self.remote is None:
            for name in ("inference_time_source", "client_time_s", "remote"):
                data.pop(name)
        else:  # a remote fl2va/ref2va clip keeps its task and inputs (issue 38); a t2va one says neither, as before
            for name in ("padded_tokens", "lora", "compiles", "untrained", "stage_peak_memory_mb",
                         *(("task", "inputs") if self.task == "t2va" else ())):
                data.pop(name)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClipSidecar:
        """A stored sidecar back; keys this type does not know are not read, missing optional ones are defaults."""
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        if isinstance(values.get("remote"), dict):
            values["remote"] = RemoteOrigin(**values["remote"])
        return cls(**values)

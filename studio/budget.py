"""Bounded work: a request whose estimated engine time is over the server's limit is refused before it queues.

The engine estimates (engine/cost.py: measured figures per device kind); this module holds the studio's policy,
`--max-job-seconds`, and says what drives a refused request's cost: each of its steps, short edge and duration
is put back to the model's default and estimated again, so the error names the fields that would bring it under
the limit and what each alone would cost. Why before queueing: one job holds the single in-process worker for
every user until it ends, and a 2720×1536 clip on the CPU nano would hold it for days.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from engine import GenerationRequest, RequestError, RequestPlan

DEFAULT_MAX_JOB_SECONDS = 3600.0  # one H200 makes a 14.375 s, 50-step full-size clip in ~30 min (step_bench.md)
DEFAULT_MAX_JOBS_PER_USER = 4  # two pairs queued or running; the default queue holds 8 waiting jobs


class JobTooLong(RequestError):
    """A valid request estimated to hold the engine longer than the limit. Its message names the fields that drive
    the cost; `renamed` keeps those names the caller's (``num_inference_steps``, ``target.short_edge``,
    ``baseline_steps``), as the field itself is renamed."""

    def __init__(self, field: str, template: str, names: dict[str, str], estimate_s: float, limit_s: float):
        self.template, self.names, self.estimate_s, self.limit_s = template, names, estimate_s, limit_s
        super().__init__(field, template.format(**names))

    def renamed(self, renames: dict[str, str]) -> JobTooLong:
        names = {key: renames.get(key, name) for key, name in self.names.items()}
        return JobTooLong(renames.get(self.field, self.field), self.template, names, self.estimate_s, self.limit_s)

    def to_dict(self) -> dict:
        return {**super().to_dict(), "estimate_s": round(self.estimate_s, 1), "limit_s": self.limit_s}


def check_job_time(engine: Any, job: GenerationRequest | RequestPlan, limit_s: float) -> None:
    """Raise `JobTooLong` when `engine.estimate(job)` is over `limit_s` seconds; nothing has run or been stored.
    `job`: a validated request, or the engine's plan of one (whose tier plan the estimate then reuses)."""
    estimate = engine.estimate(job)
    request = job.request if isinstance(job, RequestPlan) else job
    if estimate.seconds <= limit_s:
        return
    limits, tier_steps = engine.limits, engine.tiers.get(request.tier).steps
    drivers = {  # field -> (what the request asks, the same request at the model's default, that default)
        "steps": (f"{estimate.steps} denoising steps", replace(request, steps=None), f"the tier's {tier_steps}"),
        "short_edge": (f"a {request.short_edge} px short edge ({estimate.width}×{estimate.height})",
                       replace(request, short_edge=limits.default_short_edge),
                       f"the default {limits.default_short_edge} px"),
        "duration_seconds": (f"{request.duration_seconds:g} s ({estimate.frames} frames)",
                             replace(request, duration_seconds=limits.min_duration), f"{limits.min_duration:g} s"),
    }
    savings = {}
    for field, (_, default_request, _) in drivers.items():
        if default_request != request:
            seconds = engine.estimate(default_request).seconds
            if seconds < estimate.seconds:
                savings[field] = seconds
    parts = [f"{drivers[f][0]} ({{{f}}}; at {drivers[f][2]}: ~{s:,.0f} s)" for f, s in
             sorted(savings.items(), key=lambda item: item[1])]
    what = ("what drives it: " + ", ".join(parts) if parts else
            "it is over the limit at the model's default steps, size and duration; ask the admin to raise the limit")
    template = (f"this request would hold the engine for about {estimate.seconds:,.0f} s by estimate "
                f"({estimate.describe()}; {estimate.device.kind} figures, engine/cost_figures.json), over this "
                f"server's limit of {limit_s:,.0f} s per job (--max-job-seconds); {what}")
    field = min(savings, key=savings.get) if savings else "steps"
    names = {key: key for key in drivers}
    raise JobTooLong(field, template, names, estimate.seconds, limit_s)  # `template`'s only braces: {field}

"""What a configuration is and what a pair's numbers mean: the review rules the service applies to pairs.

A configuration is what reviewers approve. It must pin down everything a verdict depended on: the candidate's
tier parameters, the baseline it was judged against (a turbo clip judged against a 1-step baseline says nothing
about turbo against the real 50-step reference) and the canvas. Tier descriptions are left out: rewording a
tier must not start a new configuration.
"""

from __future__ import annotations

from typing import Any


def _parameters(tier_config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in tier_config.items() if k != "description"}


def configuration_snapshot(candidate: Any, baseline: Any) -> dict[str, Any]:
    """The tier config stored with a pair and hashed into its configuration key.

    ``candidate``/``baseline``: PlannedRequests. Returns the candidate's parameters plus
    ``baseline`` (the baseline's parameters, steps included) and ``canvas`` ({"width", "height"}; for a remote
    tier, whose server picks the size, the requested {"aspect_ratio", "short_edge"}).
    """
    request = candidate.request
    canvas = {"width": candidate.width, "height": candidate.height} if candidate.width else \
        {"aspect_ratio": request.aspect_ratio, "short_edge": request.short_edge}
    return {**_parameters(candidate.tier_config), "baseline": _parameters(baseline.tier_config), "canvas": canvas}


def baseline_steps(pair_config: dict[str, Any], baseline: Any) -> int | None:
    """The steps the baseline clip ran: from the pair's configuration (pairs made since it records the
    baseline), else the baseline job's override (``baseline``: its VideoView, or None)."""
    steps = (pair_config.get("baseline") or {}).get("steps")
    if steps is None and baseline is not None:
        steps = (baseline.request or {}).get("steps")
    return steps


def speedup_caveat(baseline: Any) -> str | None:
    """A warning when the baseline's steps were overridden: its speed-up is not against the reference."""
    override = (baseline.request or {}).get("steps") if baseline is not None else None
    if override is None:
        return None
    return (f"the baseline ran {override} steps (overridden), not its tier's own: speed-ups and metrics compare "
            f"against that shortened baseline, not the reference")


"""What a search is asked to do, parsed from JSON (CLI, REST) with errors naming the field.

    {"name": "sol-knobs", "base_tier": "sol", "knobs": {...space.py...}, "suite": "nano_heldout", "prompt_count": 4,
     "seeds": [0, 1], "candidates": 24, "seconds": null, "request": {"duration_seconds": 5, "short_edge": 32},
     "sampler_seed": 0}

`suite` is a file of assets/prompts (or `prompts`, a list); `prompt_count` takes its first N. The budget is
`candidates` (finished candidates, counted across resumes) and/or `seconds` (wall time of one run). `request` holds
the clip settings every candidate and its same-seed baseline share (a pair's duration, canvas and `steps`);
`force` defaults to true: a tier rule that refuses a known-risky setting (sparse with too few dense steps on a short
clip) is what the gates are there to judge, so a search generates it unless told not to.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine import RequestError
from studio.campaigns import PROMPTS_DIR, parse_prompts, prompt_suites

from .space import SearchSpace

SPEC_FIELDS = ("name", "base_tier", "knobs", "suite", "prompts", "prompt_count", "seeds", "candidates", "seconds",
               "request", "sampler_seed", "cost")
COSTS = ("measured", "modelled")  # the cost objective; None: modelled on a CPU, measured on a GPU (study.py)
REQUEST_FIELDS = ("duration_seconds", "short_edge", "aspect_ratio", "steps", "force")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,54}$")  # a candidate's tier is NAME-c<n>: tier-name rules
MAX_CANDIDATES = 10_000


@dataclass(frozen=True)
class SearchSpec:
    name: str
    base_tier: str
    knobs: dict[str, Any]
    prompts: tuple[str, ...]
    seeds: tuple[int, ...]
    candidates: int | None = 24
    seconds: float | None = None
    request: dict[str, Any] = field(default_factory=dict)
    sampler_seed: int = 0
    suite: str | None = None
    cost: str | None = None

    @property
    def space(self) -> SearchSpace:
        return SearchSpace.parse(self.knobs)

    @property
    def cases(self) -> list[tuple[str, int]]:
        """(prompt, seed) in evaluation order: prompt-major, so the first failure stops a candidate early."""
        return [(prompt, seed) for prompt in self.prompts for seed in self.seeds]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["prompts"], data["seeds"] = list(self.prompts), list(self.seeds)
        del data["suite"]  # the prompts it gave are stored; parse takes one or the other
        return data

    @classmethod
    def parse(cls, payload: Any, prompts_dir: Path = PROMPTS_DIR) -> SearchSpec:
        if not isinstance(payload, dict):
            raise RequestError("body", "must be a JSON object")
        unknown = sorted(set(payload) - set(SPEC_FIELDS))
        if unknown:
            raise RequestError(unknown[0], f"unknown field; allowed: {', '.join(SPEC_FIELDS)}")
        name = payload.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise RequestError("name", "is required: 1-55 letters, digits, '_' or '-' (its candidates' tiers are "
                               "named <name>-c<n>)")
        base_tier = payload.get("base_tier", "baseline")
        if not isinstance(base_tier, str):
            raise RequestError("base_tier", "must be a tier name")
        SearchSpace.parse(payload.get("knobs"))  # refuse a bad space before anything is stored
        prompts, suite = _prompts(payload, prompts_dir)
        seeds = payload.get("seeds", [0])
        if (not isinstance(seeds, list) or not seeds
                or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**31 for s in seeds)):
            raise RequestError("seeds", "must be a non-empty list of whole numbers in 0..2^31-1")
        candidates, seconds = payload.get("candidates", 24 if payload.get("seconds") is None else None), \
            payload.get("seconds")
        if candidates is not None and (not isinstance(candidates, int) or isinstance(candidates, bool)
                                       or not 1 <= candidates <= MAX_CANDIDATES):
            raise RequestError("candidates", f"must be a whole number in 1..{MAX_CANDIDATES}")
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0):
            raise RequestError("seconds", "must be a positive number of seconds")
        request = payload.get("request", {})
        if not isinstance(request, dict):
            raise RequestError("request", f"must be an object with any of {', '.join(REQUEST_FIELDS)}")
        bad = sorted(set(request) - set(REQUEST_FIELDS))
        if bad:
            raise RequestError(f"request.{bad[0]}", f"unknown field; allowed: {', '.join(REQUEST_FIELDS)}")
        sampler_seed = payload.get("sampler_seed", 0)
        if not isinstance(sampler_seed, int) or isinstance(sampler_seed, bool):
            raise RequestError("sampler_seed", "must be a whole number")
        cost = payload.get("cost")
        if cost is not None and cost not in COSTS:
            raise RequestError("cost", f"must be one of {', '.join(COSTS)} (or left out: modelled on a CPU, measured "
                                       f"on a GPU), got {cost!r}")
        return cls(name, base_tier, dict(payload["knobs"]), tuple(prompts), tuple(dict.fromkeys(seeds)), candidates,
                   None if seconds is None else float(seconds), {"force": True, **request}, sampler_seed, suite, cost)


def _prompts(payload: dict[str, Any], prompts_dir: Path) -> tuple[list[str], str | None]:
    suite, pasted = payload.get("suite"), payload.get("prompts")
    if (suite is None) == (pasted is None):
        raise RequestError("prompts", "give either suite (a file of assets/prompts) or prompts (a list)")
    if suite is not None:
        suites = prompt_suites(prompts_dir)
        if suite not in suites:
            raise RequestError("suite", f"unknown suite {suite!r}; suites: {', '.join(suites) or 'none'}")
        prompts = parse_prompts(suites[suite].read_text(encoding="utf-8"))
    elif isinstance(pasted, list) and all(isinstance(p, str) for p in pasted):
        prompts = [p.strip() for p in pasted if p.strip()]
    else:
        raise RequestError("prompts", "must be a list of strings")
    count = payload.get("prompt_count")
    if count is not None:
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise RequestError("prompt_count", "must be a whole number ≥ 1")
        prompts = prompts[:count]
    if not prompts:
        raise RequestError("prompts", "holds no prompt")
    return list(dict.fromkeys(prompts)), suite

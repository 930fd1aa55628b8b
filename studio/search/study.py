"""The search loop: an Optuna multi-objective study per search, stored in the studio's data dir.

Storage: one SQLite file, `<data_dir>/search.db` (Optuna's RDB storage on SQLAlchemy); a search is a study named
after it, its spec kept in the study's user attributes, so `resume(name)` after a restart reads everything back
and continues the same study (trial numbers go on; the budget counts candidates finished across runs).

Objectives (OBJECTIVES): cost per clip (mean seconds over the cases run, minimise: see below), the worst-case
subject presence (maximise) and the worst-case FLIP inside the subject's box (minimise), the subject-aware gates'
own figures. Feasibility: a candidate failing any gate on any (prompt, seed) is infeasible; the cases are run in
order and the candidate stops at its first failing one (the rest are never generated), its trial finished with
`trial.set_constraint("gates_failed", n)`, n > 0, so the sampler learns where the infeasible region is and
`study.best_trials` (Optuna's Pareto front, constrained) never includes it. A knob combination the tier rules
refuse (engine.tiers.with_knobs, e.g. fp8 without fused) is pruned before any clip (TrialPruned, with the reason).

Cost is reported two ways, each labelled: "measured" (the candidate's wall time on the device the search ran on)
and "modelled" (cost.py: the full-size clip on the H200, composed from the measured per-block parts along the
candidate's own steps and cache hits), both for every candidate; `reference_modelled` gives the shipped tiers'
modelled cost at the same duration and steps. The cost objective is the spec's `cost`, else (cost_objective) the
modelled one on a CPU, whose wall time says little of what a GPU pays (on the nano a sparse step costs more than a
dense one on the CPU and less on the GPU), and the measured one on a GPU. A candidate without a modelled cost (fp8:
no measured parts) is pruned, with the reason, when the modelled cost is the objective.

Sampler: TPE (multi-objective, constrained), seeded. Not NSGA-II: its first generation is `population_size` (50 by
default) random candidates, more than a CPU search's budget (24-ish), so NSGA-II would be random search here; TPE
models from its 10th candidate on and handles constraints (Optuna's c-TPE).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from engine import DEFAULT_TIERS, RequestError, TierSpec, with_knobs

from .cost import CACHE_NOTE, DEFAULT_DURATION_S, LABEL, modelled_or_reason
from .evaluate import CaseResult, Evaluator
from .spec import SearchSpec

OBJECTIVES = (("cost_s", "minimize"), ("subject_present", "maximize"), ("subject_flip", "minimize"))
# A figure the gates could not measure on any case (no subject in the baseline) counts as untouched.
NEUTRAL = {"subject_present": 1.0, "subject_flip": 0.0}
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
STUDY_FILE = "search.db"

optuna.logging.set_verbosity(optuna.logging.WARNING)


class SearchCancelled(Exception):
    """Raised inside a candidate when cancel() turns true: its trial is marked failed and a resume redoes it."""


def storage(data_dir: str | Path) -> optuna.storages.RDBStorage:
    """The data dir's search storage; one per file and process (a server's REST reads share the runner's)."""
    path = (Path(data_dir) / STUDY_FILE).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    return _storage(str(path))


@functools.lru_cache(maxsize=32)
def _storage(path: str) -> optuna.storages.RDBStorage:
    return optuna.storages.RDBStorage(f"sqlite:///{path}", engine_kwargs={"connect_args": {"timeout": 30}})


def names(data_dir: str | Path) -> list[str]:
    return [summary.study_name for summary in optuna.get_all_study_summaries(storage(data_dir))]


def load(data_dir: str | Path, name: str) -> tuple[optuna.Study, SearchSpec]:
    try:
        study = optuna.load_study(study_name=name, storage=storage(data_dir))
    except KeyError:
        raise RequestError("name", f"no search named {name!r}; searches: {', '.join(names(data_dir)) or 'none'}") \
            from None
    return study, SearchSpec.parse(study.user_attrs["spec"])


def _worst(cases: list[CaseResult], figure: str, direction: str) -> float:
    values = [case.figures.get(figure) for case in cases]
    values = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not values:
        return NEUTRAL[figure]
    return min(values) if direction == "maximize" else max(values)


def duration_of(spec: SearchSpec) -> float:
    return float(spec.request.get("duration_seconds") or DEFAULT_DURATION_S)


def modelled_cases(tier: TierSpec, spec: SearchSpec, cases: list[CaseResult]) -> tuple[float | None, str | None]:
    """The modelled full-size cost of a candidate: the mean over its cases, each along the steps its clip ran and
    the cache hits it had (or the spec's steps and the most hits the cache allows, where a case does not say)."""
    values = []
    for case in cases:
        steps = case.steps_run or spec.request.get("steps")
        value, reason = modelled_or_reason(tier, duration_of(spec),
                                           None if case.cache_hits is None else list(case.cache_hits), steps)
        if value is None:
            return None, reason
        values.append(value)
    return round(sum(values) / len(values), 4), None


def measured_cost(cases: list[CaseResult]) -> float:
    return sum(case.cost_s for case in cases) / len(cases)


def objectives(cost_s: float, cases: list[CaseResult]) -> list[float]:
    return [cost_s] + [_worst(cases, name, direction) for name, direction in OBJECTIVES[1:]]


def cost_objective(spec: SearchSpec, device: str) -> str:
    """"measured" or "modelled": the spec's choice, else modelled on a CPU (device_label "CPU ...") and measured on
    anything else (a GPU)."""
    return spec.cost or ("modelled" if device.startswith("CPU") else "measured")


class SearchRun:
    """One run of a search (start or resume) until its budget, its time or cancel()."""

    def __init__(self, data_dir: str | Path, evaluator: Evaluator,
                 progress: Callable[[dict[str, Any]], None] | None = None,
                 cancel: Callable[[], bool] | None = None):
        self.data_dir = Path(data_dir)
        self.evaluator = evaluator
        self.progress = progress or (lambda event: None)
        self.cancel = cancel or (lambda: False)

    def start(self, spec: SearchSpec) -> dict[str, Any]:
        """Create the study and run it; RequestError naming `name` if a search of that name exists."""
        return self._run(self.create(spec), spec)

    def create(self, spec: SearchSpec, **attrs: Any) -> optuna.Study:
        """Create and store the study (nothing runs: `resume(name)` runs it); `attrs`: more user attributes."""
        spec.space  # noqa: B018 - refuse a bad space before storing anything
        self.evaluator.tiers.get(spec.base_tier)
        try:
            study = optuna.create_study(study_name=spec.name, storage=storage(self.data_dir),
                                        directions=[d for _, d in OBJECTIVES])
        except optuna.exceptions.DuplicatedStudyError:
            raise RequestError("name", f"a search named {spec.name!r} exists: resume it or pick another name") \
                from None
        study.set_user_attr("spec", spec.to_dict())
        study.set_user_attr("objectives", [list(o) for o in OBJECTIVES])
        study.set_user_attr("device", self.evaluator.device)
        study.set_user_attr("cost_objective", cost_objective(spec, self.evaluator.device))
        study.set_user_attr("base_tier_config", self.evaluator.tiers.get(spec.base_tier).to_dict())
        for key, value in attrs.items():
            study.set_user_attr(key, value)
        return study

    def resume(self, name: str) -> dict[str, Any]:
        study, spec = load(self.data_dir, name)
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):  # a run that died mid-candidate
            study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        return self._run(study, spec)

    def _run(self, study: optuna.Study, spec: SearchSpec) -> dict[str, Any]:
        done = len(study.get_trials(deepcopy=False, states=FINISHED))
        remaining = None if spec.candidates is None else max(spec.candidates - done, 0)
        study.sampler = optuna.samplers.TPESampler(
            seed=spec.sampler_seed + len(study.trials),  # a resume does not replay the first run's random draws
            n_startup_trials=min(10, max(4, (spec.candidates or 24) // 3)))
        space, base = spec.space, self.evaluator.tiers.get(spec.base_tier)
        by_model = study.user_attrs.get("cost_objective", "measured") == "modelled"
        started = time.monotonic()

        def objective(trial: optuna.Trial) -> list[float]:
            values = space.suggest(trial)
            try:
                tier = with_knobs(base, values, name=f"{spec.name}-c{trial.number}")
            except RequestError as error:
                trial.set_user_attr("refused", f"{error.field}: {error.message}")
                raise optuna.TrialPruned(error.message) from None
            cases: list[CaseResult] = []
            for index, (prompt, seed) in enumerate(spec.cases):
                if self.cancel():
                    raise SearchCancelled
                self.progress({"event": "case", "candidate": trial.number, "case": index + 1,
                               "cases": len(spec.cases), "prompt": prompt, "seed": seed})
                try:
                    result = self.evaluator.evaluate(tier, prompt, seed, dict(spec.request))
                except RequestError as error:  # e.g. the cache needs more steps than the request has
                    trial.set_user_attr("refused", f"{error.field}: {error.message}")
                    raise optuna.TrialPruned(error.message) from None
                cases.append(result)
                trial.set_user_attr("cases", [case.to_dict() for case in cases])
                if not result.passed:
                    break
            failed = cases[-1].failed
            measured = measured_cost(cases)
            modelled, reason = modelled_cases(tier, spec, cases)
            trial.set_user_attr("measured_cost_s", measured)
            trial.set_user_attr("modelled_cost_s", modelled)
            if reason:
                trial.set_user_attr("modelled_note", reason)
            if failed:
                trial.set_user_attr("stopped_after_case", len(cases))
            if by_model and modelled is None:
                trial.set_user_attr("refused", f"cost: no modelled cost to optimise ({reason})")
                raise optuna.TrialPruned(reason)
            trial.set_constraint("gates_failed", float(len(failed)))
            return objectives(modelled if by_model else measured, cases)

        def after(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
            summary = report(study, spec)
            self.progress({"event": "candidate", "candidate": trial.number, "state": trial.state.name,
                           "objective": summary["cost"]["objective"],
                           "done": summary["done"], "budget": spec.candidates, "feasible": summary["feasible"],
                           "front": len(summary["front"]), "best_cost_s": summary["best_cost_s"],
                           "best_modelled_cost_s": summary["best_modelled_cost_s"],
                           "elapsed_s": round(time.monotonic() - started, 1)})

        if remaining != 0:
            try:
                study.optimize(objective, n_trials=remaining, timeout=spec.seconds, callbacks=[after],
                               catch=())
            except SearchCancelled:
                return report(study, spec) | {"status": "cancelled"}
        return report(study, spec) | {"status": "finished"}


def _trial_row(trial: optuna.trial.FrozenTrial, objective: str) -> dict[str, Any]:
    cases = trial.user_attrs.get("cases", [])
    feasible = trial.state == TrialState.COMPLETE and all(v <= 0 for v in trial.constraints.values())
    row = {"candidate": trial.number, "state": trial.state.name.lower(), "knobs": trial.params,
           "feasible": feasible, "cases_run": len(cases)}
    if trial.values is not None:
        row["objectives"] = {name: round(value, 6) for (name, _), value in zip(OBJECTIVES, trial.values, strict=True)}
        # Both costs, each named for what it is (`objective` is the one cost_s holds; a study stored before the
        # measured cost had its own attribute optimised the measured one).
        measured = trial.user_attrs.get("measured_cost_s", row["objectives"]["cost_s"] if objective == "measured"
                                        else None)
        row["cost"] = {"measured_s": None if measured is None else round(measured, 6),
                       "modelled_s": trial.user_attrs.get("modelled_cost_s")}
        if "modelled_note" in trial.user_attrs:
            row["cost"]["modelled_note"] = trial.user_attrs["modelled_note"]
    if "refused" in trial.user_attrs:
        row["refused"] = trial.user_attrs["refused"]
    if "stopped_after_case" in trial.user_attrs:
        row["stopped_after_case"] = trial.user_attrs["stopped_after_case"]
        row["failed_gates"] = cases[-1]["failed"]
    if cases:
        worst = min(cases, key=lambda c: (not c["failed"], c["figures"].get("subject_present") or 1.0))
        row["worst_case"] = {key: worst[key] for key in ("prompt", "seed", "worst_frame", "failed")}
        row["baseline_cost_s"] = round(sum(c["baseline_cost_s"] for c in cases) / len(cases), 4)
    return row


def report(study: optuna.Study, spec: SearchSpec | None = None) -> dict[str, Any]:
    """The search's state as JSON: every candidate, the Pareto front (Optuna's best_trials: feasible only)."""
    spec = spec or SearchSpec.parse(study.user_attrs["spec"])
    trials = study.get_trials(deepcopy=False)
    objective = study.user_attrs.get("cost_objective", "measured")
    rows = [_trial_row(trial, objective) for trial in trials]
    front = {trial.number for trial in study.best_trials} if any(t.state == TrialState.COMPLETE for t in trials) \
        else set()
    for row in rows:
        row["on_front"] = row["candidate"] in front
    for kind in ("measured", "modelled"):  # the front under each cost (one of them is Optuna's, "on_front")
        key = f"{kind}_s"
        kind_front = pareto([row for row in rows if row["feasible"] and row["cost"][key] is not None],
                            lambda row, key=key: [row["cost"][key], *(row["objectives"][n] for n, _ in OBJECTIVES[1:])])
        for row in rows:
            row[f"on_front_{kind}"] = row["candidate"] in kind_front
    feasible = [row for row in rows if row["feasible"]]
    measured, modelled = f"measured on {study.user_attrs.get('device', '?')}", f"{LABEL}; {CACHE_NOTE}"
    return {
        "name": spec.name, "spec": spec.to_dict(),
        "cost": {"unit": "seconds per clip", "label": modelled if objective == "modelled" else measured,
                 "objective": objective,
                 "measured": {"label": measured, "key": "cost.measured_s",
                              "what": "the candidate's wall time (encode to decode) at the search's clip settings"},
                 "modelled": {"label": modelled, "key": "cost.modelled_s", "duration_s": duration_of(spec)}},
        "objectives": [{"name": n, "direction": d} for n, d in OBJECTIVES],
        "done": sum(t.state in FINISHED for t in trials), "budget": spec.candidates,
        "feasible": len(feasible),
        "best_cost_s": min((row["objectives"]["cost_s"] for row in feasible), default=None),
        "best_modelled_cost_s": min((row["cost"]["modelled_s"] for row in feasible
                                     if row["cost"]["modelled_s"] is not None), default=None),
        "reference_modelled": reference_modelled(study, spec),
        "front": [row for row in rows if row["on_front"]],
        # The front under each cost: the modelled full-size one is what the H200 would pay.
        "front_measured": [row["candidate"] for row in rows if row["on_front_measured"]],
        "front_modelled": [row["candidate"] for row in rows if row["on_front_modelled"]],
        "candidates": rows,
    }


def pareto(rows: list[dict[str, Any]], values: Callable[[dict[str, Any]], list[float]]) -> set[int]:
    """The candidates no other row dominates under OBJECTIVES' directions (at least as good on every objective,
    better on one)."""
    signs = [1 if direction == "minimize" else -1 for _, direction in OBJECTIVES]
    keyed = [(row["candidate"], [sign * value for sign, value in zip(signs, values(row), strict=True)])
             for row in rows]

    def dominates(a: list[float], b: list[float]) -> bool:
        return all(x <= y for x, y in zip(a, b, strict=True)) and any(x < y for x, y in zip(a, b, strict=True))

    return {number for number, mine in keyed if not any(dominates(other, mine) for _, other in keyed)}


def base_tier(study: optuna.Study, spec: SearchSpec) -> TierSpec | None:
    """The tier the search's candidates start from, as stored when it started (a tiers-file tier included)."""
    from .tierfile import tier_from_dict

    stored = study.user_attrs.get("base_tier_config")
    if stored:
        return tier_from_dict(stored)
    return next((tier for tier in DEFAULT_TIERS if tier.name == spec.base_tier), None)


def reference_modelled(study: optuna.Study, spec: SearchSpec) -> list[dict[str, Any]]:
    """The shipped tiers (and the search's base tier) modelled at the search's duration and steps, the most cache
    hits their rules allow: where the candidates sit against `sol` and `turbo` in the same units."""
    tiers = {tier.name: tier for tier in DEFAULT_TIERS}
    base = base_tier(study, spec)
    if base is not None:
        tiers[base.name] = base
    rows = []
    for tier in tiers.values():
        value, reason = modelled_or_reason(tier, duration_of(spec), None, spec.request.get("steps"))
        rows.append({"tier": tier.name, "modelled_s": value} | ({"modelled_note": reason} if reason else {}))
    return rows

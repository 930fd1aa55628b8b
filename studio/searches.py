"""Configuration searches inside the studio server: start, watch, cancel and resume them in the background, open a
candidate's worst pair, queue the front for blind review, save an approved candidate as a tier.

The search itself is studio/search/ (the same code `python -m studio.search` runs); this module runs it on a
thread of the server against the served engine, and keeps its live progress in memory beside the study that
<data_dir>/search.db holds.

People before searches. A search shares the one in-process engine with the job queue, so every clip it makes
first waits until that queue is idle (no job running or waiting), and runs with a cancel check that is true as soon
as a job arrives: the search's clip stops before its next denoising step, the person's job runs, and the search
makes the same clip again once the queue is idle (the interrupted clip's time is thrown away, so the measured cost
is one uninterrupted run). A pair submitted while a search runs so waits at most one denoising step of the
search's clip, and campaigns (whose pairs go through the queue) go first too. One search runs at a time.

Candidates a person wants to see become tiers of the served engine, `<search>-c<n>` (the study's own names), with
a description naming the search and knobs: "worst pair" queues the candidate's worst (prompt, seed) as a normal
pair, "review" queues each front candidate as a review campaign. Such tiers are re-registered whenever an engine
attaches (a restart), so their campaigns keep feeding. "Save as tier" appends an approved candidate, with its
search record, to the tiers file (--tiers-file, else <data_dir>/search_tiers.toml).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from db.errors import Conflict, NotFound
from engine import GenerationCancelled, RequestError, TierSpec, with_knobs
from studio.roles import OPEN, Actor

if TYPE_CHECKING:
    from studio.search.evaluate import Evaluator

log = logging.getLogger(__name__)

POLL_S = 0.5  # how often a waiting search looks at the job queue again
SAVED_TIERS = "search_tiers.toml"  # in the data dir, when the server has no --tiers-file


class EngineBusy:
    """The served engine, as a search sees it: `generate` waits for the job queue to be idle and gives way
    (cancels its clip, then makes it again) as soon as a job arrives. Anything else is the engine's."""

    def __init__(self, engine: Any, busy: Callable[[], bool], cancelled: Callable[[], bool], poll_s: float = POLL_S):
        self._engine, self._busy, self._cancelled, self._poll_s = engine, busy, cancelled, poll_s
        self.preempted = 0  # clips given up for a person's job and made again
        self.waited_s = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def wait_idle(self) -> None:
        """Block while the job queue has a job (SearchCancelled when the search is cancelled meanwhile). The
        evaluator calls it before its quality comparison too, so that CPU work also waits for people's jobs."""
        from studio.search import SearchCancelled

        started = time.monotonic()
        while self._busy():
            if self._cancelled():
                raise SearchCancelled
            time.sleep(self._poll_s)
        self.waited_s += time.monotonic() - started
        if self._cancelled():
            raise SearchCancelled

    def generate(self, payload: Any, on_step: Callable | None = None, cancel: Callable[[], bool] | None = None):
        from studio.search import SearchCancelled

        while True:
            self.wait_idle()
            try:
                return self._engine.generate(payload, on_step=on_step,
                                             cancel=lambda: self._cancelled() or self._busy())
            except GenerationCancelled:
                if self._cancelled():
                    raise SearchCancelled from None
                self.preempted += 1
                log.info("search clip gave way to a queued job; it runs again when the queue is idle")


@dataclass
class ActiveRun:
    """One start or resume of a search in this process."""

    name: str
    thread: threading.Thread | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    state: str = "running"  # running | finished | cancelled | failed
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    error: str | None = None
    current: dict[str, Any] | None = None  # the last case event: candidate, case i of n, prompt, seed
    engine: EngineBusy | None = None

    def as_dict(self) -> dict[str, Any]:
        state = "cancelling" if self.state == "running" and self.cancel.is_set() else self.state
        data = {"state": state, "started_at": int(self.started_at),
                "ended_at": None if self.ended_at is None else int(self.ended_at),
                "elapsed_s": round((self.ended_at or time.time()) - self.started_at, 1), "current": self.current}
        if self.error:
            data["error"] = self.error
        if self.engine is not None:
            data["gave_way_to_jobs"] = self.engine.preempted
            data["waited_for_queue_s"] = round(self.engine.waited_s, 1)
        return data


def default_evaluator(engine: Any) -> Evaluator:
    from studio.search import EngineEvaluator

    return EngineEvaluator(engine)


class SearchManager:
    """The studio's searches over one StudioService (its engine, job queue, store and campaigns)."""

    def __init__(self, service: Any, evaluator_factory: Callable[[Any], Evaluator] = default_evaluator,
                 tiers_file: str | Path | None = None, poll_s: float = POLL_S):
        self.service = service
        self.evaluator_factory = evaluator_factory
        self.tiers_file = Path(tiers_file) if tiers_file else Path(service.config.data_dir) / SAVED_TIERS
        self.poll_s = poll_s
        self._runs: dict[str, ActiveRun] = {}
        self._lock = threading.Lock()

    @property
    def data_dir(self) -> Path:
        return Path(self.service.config.data_dir)

    # ------------------------------------------------------------------------------------------ reading

    def _study(self, name: str):
        from studio.search import load

        if not (self.data_dir / "search.db").exists():
            raise NotFound("name", f"no search named {name!r}; searches: none")
        try:
            return load(self.data_dir, name)
        except RequestError as error:
            raise NotFound(error.field, error.message) from None

    def names(self) -> list[str]:
        from studio.search import names

        return names(self.data_dir) if (self.data_dir / "search.db").exists() else []

    def show(self, name: str) -> dict[str, Any]:
        """The search's report (studio.search.report: every candidate, the front, costs labelled) with its
        progress: candidates done of the budget, the best so far, and the live state of a run in this process."""
        from studio.search import report

        with self._lock:
            active = self._runs.get(name)
        live = active.as_dict() if active else None  # read before the study: a run that ended has all it did
        study, spec = self._study(name)
        data = report(study, spec)
        live = live or {"state": self._stored_state(study, data)}
        return {"object": "search", **data, "progress": self._progress(data, live), "review": self._review(study)}

    def _progress(self, data: dict[str, Any], live: dict[str, Any]) -> dict[str, Any]:
        budget = data["budget"]
        feasible = [row for row in data["candidates"] if row["feasible"]]
        best = {}
        if feasible:
            cheapest = min(feasible, key=lambda row: row["objectives"]["cost_s"])
            kept = max(feasible, key=lambda row: (row["objectives"]["subject_present"], -row["objectives"]["cost_s"]))
            best = {"cheapest_feasible": {"candidate": cheapest["candidate"], **cheapest["cost"]},
                    "best_subject_present": {"candidate": kept["candidate"],
                                             "subject_present": kept["objectives"]["subject_present"],
                                             **kept["cost"]}}
        return {"done": data["done"], "budget": budget,
                "fraction": None if not budget else round(min(data["done"] / budget, 1.0), 4),
                "feasible": data["feasible"], "front": len(data["front"]), "best_so_far": best, **live}

    @staticmethod
    def _stored_state(study: Any, data: dict[str, Any]) -> str:
        """A search not running in this process: finished when its budget is spent, else as its last run ended
        ("stopped": a server stopped under it; resume continues)."""
        if data["budget"] is not None and data["done"] >= data["budget"]:
            return "finished"
        return study.user_attrs.get("last_run", {}).get("state", "stopped").replace("running", "stopped")

    def list(self) -> list[dict[str, Any]]:
        rows = []
        for name in self.names():
            try:
                shown = self.show(name)
            except Exception as error:  # noqa: BLE001 - one unreadable study must not hide the others
                rows.append({"name": name, "error": f"{type(error).__name__}: {error}"})
                continue
            rows.append({"object": "search", "name": name, "base_tier": shown["spec"]["base_tier"],
                         "knobs": list(shown["spec"]["knobs"]), "progress": shown["progress"],
                         "best_cost_s": shown["best_cost_s"], "best_modelled_cost_s": shown["best_modelled_cost_s"],
                         "cost": {"measured": shown["cost"]["measured"]["label"],
                                  "modelled": shown["cost"]["modelled"]["label"]}})
        return rows

    def front(self, name: str) -> dict[str, Any]:
        shown = self.show(name)
        return {"object": "search.front", "name": name, "cost": shown["cost"], "objectives": shown["objectives"],
                "data": shown["front"], "reference_modelled": shown["reference_modelled"]}

    # ------------------------------------------------------------------------------------------ running

    def _engine(self):
        engine = self.service.engine  # ServiceUnavailable (503) while it loads
        from engine import Engine

        if not isinstance(engine, Engine):
            raise Conflict("engine", "searches run on the in-process engine; this server's engine is "
                           f"{type(engine).__name__} (--ulysses workers load their own tier tables)")
        return engine

    def _busy(self) -> bool:
        status = self.service.queue_status()
        return status["running"] is not None or bool(status["queued"])

    def _new_run(self, name: str) -> ActiveRun:
        """The run's record, refused (409 naming name) while any search runs here."""
        with self._lock:
            running = [run.name for run in self._runs.values() if run.state == "running"]
            if running:
                raise Conflict("name", f"search {running[0]!r} is running; one search runs at a time (cancel it "
                               "or wait for it)")
            active = self._runs[name] = ActiveRun(name)
            return active

    def _evaluator(self, active: ActiveRun) -> Evaluator:
        active.engine = EngineBusy(self._engine(), self._busy, active.cancel.is_set, self.poll_s)
        return self.evaluator_factory(active.engine)

    def _check_request(self, spec: Any) -> None:
        """Every prompt at the search's clip settings, planned as its baseline would be (the studio's own request
        rules and --max-job-seconds), so a search that could only fail is refused before it starts."""
        for prompt in spec.prompts:
            try:
                self.service.plan({**spec.request, "prompt": prompt, "seed": spec.seeds[0], "tier": "baseline"})
            except RequestError as error:
                where = "prompts" if error.field == "prompt" else f"request.{error.field}"
                raise RequestError(where, f"{prompt[:40]!r}: {error.message}" if where == "prompts"
                                   else error.message) from None

    def start(self, payload: Any, created_by: str | None = None) -> dict[str, Any]:
        """Parse a search spec (studio/search/spec.py; RequestError naming the field), store the study and run it
        in the background. Conflict (409) naming `name` when a search of that name exists or another one runs."""
        from studio.search import SearchSpec

        spec = SearchSpec.parse(payload)
        engine = self._engine()
        if spec.base_tier not in engine.tiers.tiers:
            raise RequestError("base_tier", f"unknown tier {spec.base_tier!r}; tiers: {', '.join(engine.tiers.tiers)}")
        if spec.name in self.names():
            raise Conflict("name", f"a search named {spec.name!r} exists: resume it or pick another name")
        self._check_request(spec)
        active = self._new_run(spec.name)
        try:
            run = self._search_run(active)
            run.create(spec, created_by=created_by, last_run={"state": "running"})
        except Exception:
            with self._lock:
                self._runs.pop(spec.name, None)
            raise
        self._launch(active, run)
        return self.show(spec.name)

    def resume(self, name: str, actor: Actor = OPEN) -> dict[str, Any]:
        """Run a stopped or cancelled search on (its budget counts what is done); Conflict while it runs."""
        study, _ = self._study(name)
        actor.require_owner(study.user_attrs.get("created_by"), "name", "resume this search")
        active = self._new_run(name)
        try:
            run = self._search_run(active)
        except Exception:
            with self._lock:
                self._runs.pop(name, None)
            raise
        self._launch(active, run)
        return self.show(name)

    def cancel(self, name: str, actor: Actor = OPEN) -> dict[str, Any]:
        """Stop a running search after its current clip (the candidate it was on is redone by a resume)."""
        study, _ = self._study(name)
        actor.require_owner(study.user_attrs.get("created_by"), "name", "cancel this search")
        with self._lock:
            active = self._runs.get(name)
        if active is None or active.state != "running":
            raise Conflict("name", f"search {name!r} is not running")
        active.cancel.set()
        return self.show(name)

    def _search_run(self, active: ActiveRun):
        from studio.search import SearchRun

        def progress(event: dict[str, Any]) -> None:
            if event["event"] == "case":
                active.current = {key: event[key] for key in ("candidate", "case", "cases", "prompt", "seed")}

        return SearchRun(self.data_dir, self._evaluator(active), progress, active.cancel.is_set)

    def _launch(self, active: ActiveRun, run: Any) -> None:
        def work() -> None:
            try:
                result = run.resume(active.name)
                active.state = result["status"]
            except Exception as error:  # noqa: BLE001 - recorded and shown; the server keeps serving
                log.exception("search %s failed", active.name)
                active.state, active.error = "failed", f"{type(error).__name__}: {error}"
            finally:
                active.ended_at, active.current = time.time(), None
                self._set_attr(active.name, "last_run", {"state": active.state, "error": active.error})

        active.thread = threading.Thread(target=work, name=f"search-{active.name}", daemon=True)
        active.thread.start()

    def _set_attr(self, name: str, key: str, value: Any) -> None:
        try:
            self._study(name)[0].set_user_attr(key, value)
        except Exception:  # noqa: BLE001 - a read-only data dir: the in-memory state still answers
            log.exception("could not record %s of search %s", key, name)

    def wait(self, name: str, timeout: float | None = None) -> str:
        """Block until this process's run of `name` ends (tests, the CLI); its final state."""
        with self._lock:
            active = self._runs.get(name)
        if active is not None and active.thread is not None:
            active.thread.join(timeout)
        return active.state if active else "not running"

    def close(self) -> None:
        with self._lock:
            runs = list(self._runs.values())
        for active in runs:
            active.cancel.set()
        for active in runs:
            if active.thread is not None:
                active.thread.join(10)

    # --------------------------------------------------------------------------- candidates as tiers

    def candidate_tier(self, name: str, candidate: int) -> tuple[TierSpec, dict[str, Any], dict[str, Any]]:
        """(the candidate's tier as the served engine and a tiers file hold it, its report row, the report)."""
        from studio.search import report
        from studio.search.study import base_tier
        from studio.search.tierfile import file_form

        study, spec = self._study(name)
        data = report(study, spec)
        if isinstance(candidate, bool) or not isinstance(candidate, int):
            raise RequestError("candidate", "must be a candidate number")
        row = next((r for r in data["candidates"] if r["candidate"] == candidate), None)
        if row is None:
            raise NotFound("candidate", f"search {name!r} has no candidate {candidate}; candidates: "
                           f"{', '.join(str(r['candidate']) for r in data['candidates']) or 'none'}")
        if "objectives" not in row:
            raise Conflict("candidate", f"candidate {candidate} made no clip ({row['state']}"
                           f"{': ' + row['refused'] if 'refused' in row else ''})")
        base = base_tier(study, spec)
        if base is None:
            raise Conflict("candidate", f"the search's base tier {spec.base_tier!r} is not known here")
        knobs = ", ".join(f"{key}={value}" for key, value in row["knobs"].items())
        tier = with_knobs(base, row["knobs"], name=f"{name}-c{candidate}")
        tier = replace(file_form(tier), description=f"search {name}, candidate {candidate} from {base.name}: {knobs}")
        return tier, row, data

    def register(self, tier: TierSpec) -> None:
        """Make `tier` servable by the engine (kept until the server stops; attach() adds it again)."""
        tiers = self._engine().tiers
        current = tiers.tiers.get(tier.name)
        if current is None:
            tiers.add(tier)
        elif current != tier:
            raise Conflict("candidate", f"the engine serves another tier named {tier.name!r}")

    def _registered(self, name: str, candidate: int) -> None:
        study, _ = self._study(name)
        numbers = sorted({*study.user_attrs.get("registered", []), candidate})
        study.set_user_attr("registered", numbers)

    def attach(self, engine: Any) -> None:
        """A newly attached engine serves again the candidates earlier servers registered (their campaigns and
        worst pairs name them). Called by StudioService before its job queue starts."""
        from engine import Engine

        if not isinstance(engine, Engine):
            return
        try:
            names = self.names()
        except Exception:  # noqa: BLE001 - an unreadable search.db must not keep the engine from serving
            log.exception("could not read the searches to serve their candidates again")
            return
        for name in names:
            try:
                study, _ = self._study(name)
                for candidate in study.user_attrs.get("registered", []):
                    tier = self.candidate_tier(name, candidate)[0]
                    if tier.name not in engine.tiers.tiers:
                        engine.tiers.add(tier)
            except Exception:  # noqa: BLE001 - one bad study must not stop the server from starting
                log.exception("could not serve the candidates of search %s again", name)

    def _pair_settings(self, spec: Any) -> dict[str, Any]:
        """The search's clip settings as a pair's fields (its baseline ran with the same steps)."""
        request = dict(spec.request)
        target = {key: request[key] for key in ("duration_seconds", "short_edge", "aspect_ratio") if key in request}
        settings: dict[str, Any] = {"force": bool(request.get("force", True))}
        if target:
            settings["target"] = target
        if request.get("steps") is not None:
            settings["steps"] = settings["baseline_steps"] = request["steps"]
        return settings

    def worst_pair(self, name: str, candidate: int, submitted_by: str | None = None,
                   client: str | None = None) -> dict[str, Any]:
        """The candidate's worst (prompt, seed) as a studio pair: the one made before (unless it failed), else
        queued now through the job queue (the baseline is reused when stored). Compare opens it once completed."""
        tier, row, data = self.candidate_tier(name, candidate)
        if "worst_case" not in row:
            raise Conflict("candidate", f"candidate {candidate} has no case to show")
        study, spec = self._study(name)
        known = study.user_attrs.get("pairs", {}).get(str(candidate))
        if known:
            try:
                pair = self.service.get_pair(known)
                if pair.status != "failed":
                    return self._pair_answer(name, candidate, row, pair.id, pair.status)
            except NotFound:
                pass
        self.register(tier)
        self._registered(name, candidate)
        worst = row["worst_case"]
        payload = {**self._pair_settings(spec), "prompt": worst["prompt"], "seed": worst["seed"], "tier": tier.name}
        pair = self.service.submit_pair(payload, submitted_by=submitted_by, client=client)
        pairs = {**study.user_attrs.get("pairs", {}), str(candidate): pair.id}
        study.set_user_attr("pairs", pairs)
        return self._pair_answer(name, candidate, row, pair.id, pair.status)

    @staticmethod
    def _pair_answer(name: str, candidate: int, row: dict[str, Any], pair_id: str, status: str) -> dict[str, Any]:
        return {"object": "search.worst_pair", "search": name, "candidate": candidate, "pair_id": pair_id,
                "status": status, "worst_case": row["worst_case"], "url": f"/v1/pairs/{pair_id}"}

    def _review(self, study: Any) -> dict[str, Any]:
        return study.user_attrs.get("review", {})

    # ------------------------------------------------------------------------------- review and tiers

    def review(self, name: str, created_by: str | None = None) -> dict[str, Any]:
        """Queue every front candidate not queued before as a review campaign (studio/campaigns.py) over the
        search's prompts × seeds at its clip settings: its pairs go through the job queue as it has room, and
        reviewers take them from "Next unreviewed pair", blind (the Review tab opens a search candidate's pair as
        A and B in a random order; over REST, POST /v1/pairs/{id}/blind). Conflict naming `name` when the front
        is empty or all of it is queued already."""
        study, spec = self._study(name)
        from studio.search import report

        front = report(study, spec)["front"]
        if not front:
            raise Conflict("name", f"search {name!r} has no front yet: no candidate passed every gate")
        review = dict(self._review(study))
        queued = dict(review.get("campaigns", {}))
        # A sampler may propose the same knobs again: one campaign per distinct configuration (its first candidate).
        knobs_queued = {repr(sorted(row["knobs"].items())) for row in report(study, spec)["candidates"]
                        if str(row["candidate"]) in queued}
        fresh = []
        for row in sorted(front, key=lambda r: r["candidate"]):
            key = repr(sorted(row["knobs"].items()))
            if str(row["candidate"]) not in queued and key not in knobs_queued:
                knobs_queued.add(key)
                fresh.append(row)
        if not fresh:
            raise Conflict("name", f"every front candidate of {name!r} is queued for review already (campaigns "
                           f"{', '.join(queued.values())})")
        settings = self._pair_settings(spec)
        created = []
        for row in fresh:
            tier = self.candidate_tier(name, row["candidate"])[0]
            self.register(tier)
            self._registered(name, row["candidate"])
            campaign = self.service.campaigns.create(
                {**settings, "tier": tier.name, "prompts": list(spec.prompts), "seeds": list(spec.seeds),
                 "name": f"search {name} · candidate {row['candidate']} (blind review)"}, created_by=created_by)
            queued[str(row["candidate"])] = campaign["id"]
            created.append(campaign)
        review.update({"blind": True, "campaigns": queued, "tiers": sorted(
            {*review.get("tiers", []), *(f"{name}-c{c}" for c in queued)})})
        study.set_user_attr("review", review)
        return {"object": "search.review", "search": name, "blind": True, "campaigns": created,
                "queued_before": len(queued) - len(created), "review": review}

    def blind_tiers(self) -> set[str]:
        """The tiers of search candidates queued for blind review (the Review tab opens their pairs blind)."""
        tiers: set[str] = set()
        for name in self.names():
            try:
                tiers.update(self._review(self._study(name)[0]).get("tiers", []))
            except Exception:  # noqa: BLE001 - a study that cannot be read has no tiers to hide
                log.exception("could not read the review of search %s", name)
        return tiers

    def approval(self, tier: TierSpec) -> list[dict[str, Any]]:
        """The served model's configurations of `tier` (any duration) with their tallies."""
        model_id = self._engine().model_id
        return [{key: config[key] for key in ("key", "duration_seconds", "approved", "accepts", "rejects",
                                              "distinct_accepted_prompts", "accepting_reviewers", "blind")}
                for config in self.service.store.list_configurations()
                if config["tier_name"] == tier.name and config["model_id"] == model_id]

    def records(self) -> dict[str, dict[str, Any]]:
        """{tier name: search record} of the tiers file saved tiers go to ({} without one, or unreadable)."""
        from studio.search.tierfile import search_records

        try:
            return search_records(self.tiers_file)
        except RequestError:
            log.warning("the tiers file %s cannot be read for search records", self.tiers_file.name)
            return {}

    def save_tier(self, name: str, candidate: int, tier_name: str | None = None,
                  actor: Actor = OPEN) -> dict[str, Any]:
        """Append an approved candidate to the tiers file as a named tier (default: its candidate name, so its
        approval carries over) with its search record, and serve it now. Admins only (it changes what the server
        loads). Conflict naming `candidate` until one of its configurations is approved."""
        from studio.search.tierfile import check_tier, save_tier

        actor.require_admin("name", "save a tier")
        tier, row, data = self.candidate_tier(name, candidate)
        approvals = self.approval(tier)
        if not any(config["approved"] for config in approvals):
            tallies = "; ".join(f"{c['accepts']} accepts, {c['rejects']} rejects on {c['distinct_accepted_prompts']}"
                                f" prompts" for c in approvals) or "never reviewed"
            raise Conflict("candidate", f"candidate {candidate} ({tier.name}) is not approved ({tallies}): queue the "
                           "front for review first")
        if tier_name is not None:
            if not isinstance(tier_name, str):
                raise RequestError("name", "must be a tier name")
            try:
                check_tier(replace(tier, name=tier_name))
            except RequestError as error:
                raise RequestError("name", error.message) from None
        saved = replace(tier, name=tier_name or tier.name)
        study, spec = self._study(name)
        trial = next(t for t in study.trials if t.number == candidate)
        record = {
            "search": name, "candidate": candidate, "candidate_tier": tier.name, "base_tier": spec.base_tier,
            "knobs": row["knobs"], "feasible": row["feasible"], "on_front": row["on_front"],
            "objectives": row["objectives"], "cost": row["cost"],
            "cost_labels": {"measured": data["cost"]["measured"]["label"],
                            "modelled": data["cost"]["modelled"]["label"]},
            "cases": [{key: case.get(key) for key in ("prompt", "seed", "cost_s", "baseline_cost_s", "failed",
                                                      "figures", "worst_frame")}
                      for case in trial.user_attrs.get("cases", [])],
            "prompts": list(spec.prompts), "seeds": list(spec.seeds), "request": dict(spec.request),
            "approved_configurations": [c for c in approvals if c["approved"]],
            "review_campaign": self._review(study).get("campaigns", {}).get(str(candidate)),
            "saved_by": actor.name, "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        if saved.name != tier.name:
            record["note"] = (f"approved as {tier.name}; a configuration is keyed by its tier's name, so pairs of "
                              f"{saved.name} start a new configuration")
        save_tier(self.tiers_file, saved, record)
        engine = self._engine()
        if saved.name not in engine.tiers.tiers:
            engine.tiers.add(saved)
        shown = saved.to_dict()
        if shown.get("lora"):  # the response names no file on the server's disk: the LoRA by its file name
            shown["lora"] = {**shown["lora"], "path": Path(shown["lora"]["path"]).name}
        return {"object": "search.tier", "tier": shown, "record": record,
                "tiers_file": self.tiers_file.name, "served_now": True,
                "load_with": "--tiers-file " + (str(self.service.config.tiers_file.name)
                                                if self.service.config.tiers_file else f"<data dir>/{SAVED_TIERS}")}

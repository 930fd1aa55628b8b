"""Configuration searches over REST (issue 36 items 4-5): start, progress, cancel, resume, the front, a candidate's
worst pair, errors naming the field; searches give way to the job queue. The search objective is a stub (no clip is
made for it); the served engine is the nano, which makes the pairs a person asks for."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from engine.errors import GenerationCancelled
from studio.api import create_app
from studio.search import CaseResult, SearchCancelled
from studio.searches import EngineBusy
from studio.service import StudioService
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = ["a red circle moves left to right", "a blue square moves up"]
REQUEST = {"duration_seconds": 5, "short_edge": 32, "steps": 2}
# The stub objective over turbo's LoRA scale × bucket: (cost, subject presence); scale 1.5 fails a gate on prompt 2.
TABLE = {(0.5, 0): (1.0, 0.70), (0.5, 64): (1.2, 0.60), (1.0, 0): (2.0, 0.95), (1.0, 64): (2.5, 0.90),
         (1.5, 0): (0.5, 0.99), (1.5, 64): (0.6, 0.99)}
KNOWN_FRONT = {(0.5, 0), (1.0, 0)}


class StubObjective:
    """Answers from TABLE; `hold` (when set) makes every case wait until released, so a run can be watched."""

    def __init__(self):
        self.hold: threading.Event | None = None
        self.entered = threading.Event()
        self.calls: list[tuple[str, str]] = []

    def evaluator(self, engine):
        outer = self

        class Evaluator:
            device = "stub"
            tiers = engine.tiers  # the served engine's table, through the search's EngineBusy view

            def evaluate(self, tier, prompt, seed, request):
                outer.calls.append((tier.name, prompt))
                outer.entered.set()
                if outer.hold is not None:
                    while not outer.hold.wait(0.05):
                        if engine._cancelled():
                            raise SearchCancelled
                cost, present = TABLE[(tier.lora.scale, tier.bucket)]
                failed = ("subject_lost",) if tier.lora.scale == 1.5 and prompt == PROMPTS[1] else ()
                return CaseResult(prompt, seed, cost, 3.0, failed, {"subject_present": present, "subject_flip": 0.1})

        return Evaluator()


@pytest.fixture(scope="module")
def studio(tmp_path_factory, nano_engine):
    root = tmp_path_factory.mktemp("search_api")
    objective = StubObjective()
    service = StudioService.open(root / "data", engine=nano_engine, queue_size=8, quality_loader=lambda: None)
    service.searches.evaluator_factory = objective.evaluator
    app = create_app(service)
    served = dict(nano_engine.tiers.tiers)
    with TestClient(app) as client:
        yield SimpleNamespace(client=client, service=service, objective=objective)
    nano_engine.tiers.tiers.clear()  # the session's engine serves only its own tiers to the modules after this one
    nano_engine.tiers.tiers.update(served)


def spec(name: str, candidates: int = 12, **extra) -> dict:
    return {"name": name, "base_tier": "turbo", "prompts": PROMPTS, "seeds": [0], "candidates": candidates,
            "sampler_seed": 1, "request": REQUEST,
            "knobs": {"lora.scale": {"choices": [0.5, 1.0, 1.5]}, "bucket": {"choices": [0, 64]}}, **extra}


def finished(client, name: str, timeout_s: float = 120, auth=None) -> dict:
    return wait_until(lambda: (body := client.get(f"/v1/searches/{name}", auth=auth).json())["progress"]["state"]
                      in ("finished", "cancelled", "failed") and body, timeout_s, 0.05, f"search {name}")


def ensure_front(studio) -> dict:
    """The finished search "front" (the first test starts it; run alone, a test starts it here)."""
    if "front" not in studio.service.searches.names():
        assert studio.client.post("/v1/searches", json=spec("front")).status_code == 200
    return finished(studio.client, "front")


def error_of(response) -> dict:
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]


def test_a_search_runs_in_the_background_and_reports_progress_best_so_far_and_the_front(studio):
    client = studio.client
    started = client.post("/v1/searches", json=spec("front"))
    assert started.status_code == 200, started.text
    assert started.json()["progress"]["budget"] == 12 and started.json()["progress"]["state"] in ("running",
                                                                                                "finished")
    done = finished(client, "front")
    progress = done["progress"]
    assert (progress["state"], progress["done"], progress["budget"], progress["fraction"]) == ("finished", 12, 12, 1.0)
    front = client.get("/v1/searches/front/front").json()
    assert {(row["knobs"]["lora.scale"], row["knobs"]["bucket"]) for row in front["data"]} == KNOWN_FRONT
    cheapest = progress["best_so_far"]["cheapest_feasible"]
    assert cheapest["measured_s"] == 1.0  # scale 1.5 is cheaper still, but fails a gate: never "best"
    assert cheapest["modelled_s"] is not None
    # Every cost says what it is.
    assert front["cost"]["measured"]["label"] == "measured on stub"
    assert front["cost"]["modelled"]["label"].startswith("modelled: full-size clip on the NVIDIA H200")
    assert all(set(row["cost"]) >= {"measured_s", "modelled_s"} for row in front["data"])
    listed = {row["name"]: row for row in client.get("/v1/searches").json()["data"]}
    assert listed["front"]["progress"]["done"] == 12 and listed["front"]["cost"]["measured"] == "measured on stub"
    assert listed["front"]["best_modelled_cost_s"] == done["best_modelled_cost_s"]


@pytest.mark.parametrize(("body", "status", "field"), [
    ({**spec("bad"), "knobs": {"sparse.nope": None}}, 400, "knobs.sparse.nope"),
    ({**spec("bad"), "base_tier": "nope"}, 400, "base_tier"),
    ({**spec("bad"), "request": {**REQUEST, "duration_seconds": 9999}}, 400, "request.duration_seconds"),
    ({**spec("bad"), "request": {"colour": 1}}, 400, "request.colour"),
    ({**spec("bad"), "seeds": []}, 400, "seeds"),
    ({**spec("bad"), "name": "a.b"}, 400, "name"),
    ([1, 2], 400, "body"),
])
def test_a_bad_search_is_refused_naming_the_field_and_nothing_is_stored(studio, body, status, field):
    response = studio.client.post("/v1/searches", json=body)
    assert response.status_code == status, response.text
    assert error_of(response)["field"] == field
    assert "bad" not in studio.service.searches.names()


def test_unknown_searches_and_candidates_are_404_naming_them(studio):
    client = studio.client
    for method, url in (("get", "/v1/searches/nope"), ("delete", "/v1/searches/nope"),
                        ("post", "/v1/searches/nope/resume"), ("get", "/v1/searches/nope/front")):
        response = getattr(client, method)(url)
        assert response.status_code == 404 and error_of(response)["field"] == "name", (url, response.text)
    ensure_front(studio)
    response = client.post("/v1/searches/front/candidates/999/worst-pair")
    assert response.status_code == 404 and error_of(response)["field"] == "candidate"
    response = client.post("/v1/searches/front/candidates/x/worst-pair")
    assert response.status_code == 400 and error_of(response)["field"] == "candidate"
    response = client.post("/v1/searches", json=spec("front"))
    assert response.status_code == 409 and error_of(response)["field"] == "name"
    response = client.delete("/v1/searches/front")
    assert response.status_code == 409 and error_of(response)["field"] == "name"  # not running
    wrong = client.put("/v1/searches/front")  # a path the search routes serve, with another method
    assert (wrong.status_code, wrong.headers["allow"]) == (405, "DELETE, GET"), wrong.text


def test_cancel_stops_a_running_search_and_resume_finishes_its_budget(studio):
    client, objective = studio.client, studio.objective
    objective.hold, objective.entered = threading.Event(), threading.Event()
    try:
        assert client.post("/v1/searches", json=spec("held", candidates=4)).status_code == 200
        assert objective.entered.wait(30)
        running = client.get("/v1/searches/held").json()["progress"]
        assert running["state"] == "running" and running["current"]["candidate"] == 0 and running["done"] == 0
        other = client.post("/v1/searches", json=spec("second"))  # one search at a time
        assert other.status_code == 409 and error_of(other)["field"] == "name"
        again = client.post("/v1/searches/held/resume")
        assert again.status_code == 409 and error_of(again)["field"] == "name"
        cancelled = client.delete("/v1/searches/held")
        assert cancelled.status_code == 200 and cancelled.json()["progress"]["state"] in ("cancelling", "cancelled")
        stopped = finished(client, "held")
        assert stopped["progress"]["state"] == "cancelled" and stopped["progress"]["done"] < 4
    finally:
        objective.hold = None
    resumed = client.post("/v1/searches/held/resume")
    assert resumed.status_code == 200, resumed.text
    done = finished(client, "held")
    assert (done["progress"]["state"], done["progress"]["done"]) == ("finished", 4)


class FakeEngine:
    """Steps through `steps` denoising steps, checking cancel before each, as the engine does."""

    def __init__(self, steps: int = 5, on_step=None, busy=lambda: False):
        self.steps, self.on_step, self.busy = steps, on_step, busy
        self.runs, self.cancelled_runs, self.busy_at_start = 0, 0, []
        self.tiers = "served tiers"

    def generate(self, payload, on_step=None, cancel=None):
        self.runs += 1
        self.busy_at_start.append(self.busy())
        for index in range(self.steps):
            if cancel and cancel():
                self.cancelled_runs += 1
                raise GenerationCancelled("cancelled")
            if self.on_step:
                self.on_step(self, index)
        return f"clip of {payload}"


def test_a_search_clip_waits_for_an_idle_queue_and_gives_way_to_a_job_that_arrives_mid_clip():
    queue = {"busy": True}  # a person's job is running when the search wants its clip

    def job_arrives(engine, index):
        if engine.runs == 1 and index == 2:  # another job is queued while the search's first clip runs
            queue["busy"] = True
            threading.Timer(0.1, lambda: queue.update(busy=False)).start()

    engine = FakeEngine(on_step=job_arrives, busy=lambda: queue["busy"])
    view = EngineBusy(engine, lambda: queue["busy"], lambda: False, poll_s=0.01)
    assert view.tiers == "served tiers"  # anything but generate is the engine's
    threading.Timer(0.1, lambda: queue.update(busy=False)).start()
    assert view.generate("p") == "clip of p"
    assert engine.busy_at_start == [False, False]  # no clip started while the queue held a job
    assert (engine.runs, engine.cancelled_runs, view.preempted) == (2, 1, 1)  # gave way once, then made it again
    assert view.waited_s >= 0.15

    stop = EngineBusy(FakeEngine(), lambda: True, lambda: True, poll_s=0.01)
    with pytest.raises(SearchCancelled):  # a cancelled search stops waiting
        stop.generate("p")


def test_the_search_sees_the_studios_queue_as_busy_while_a_pair_waits_or_runs(studio):
    service = studio.service
    assert not service.searches._busy()
    pair = service.submit_pair({"prompt": PROMPTS[0], "seed": 7, "tier": "turbo", "steps": 2, "baseline_steps": 2,
                                "target": {"duration_seconds": 5, "short_edge": 32}})
    assert service.searches._busy()
    wait_until(lambda: service.get_pair(pair.id).status in ("completed", "failed"), 240, 0.1, "the pair")
    assert wait_until(lambda: not service.searches._busy(), 30, 0.05, "an idle queue")


def test_a_candidates_worst_pair_is_queued_once_as_a_pair_of_its_own_tier(studio):
    client = studio.client
    shown = ensure_front(studio)
    infeasible = next(row for row in shown["candidates"] if row["state"] == "complete" and not row["feasible"])
    assert infeasible["worst_case"]["prompt"] == PROMPTS[1]  # where it failed
    url = f"/v1/searches/front/candidates/{infeasible['candidate']}/worst-pair"
    first = client.post(url)
    assert first.status_code == 200, first.text
    pair = client.get(first.json()["url"]).json()
    tier = f"front-c{infeasible['candidate']}"
    assert (pair["tier"], pair["prompt"], pair["seed"]) == (tier, PROMPTS[1], 0)
    assert pair["candidate"]["request"]["steps"] == 2 and pair["baseline"]["request"]["steps"] == 2
    served = {row["name"]: row for row in client.get("/v1/tiers").json()["data"]}
    assert served[tier]["description"].startswith(f"search front, candidate {infeasible['candidate']} from turbo")
    assert served[tier]["config"]["lora"]["scale"] == 1.5
    assert client.post(url).json()["pair_id"] == first.json()["pair_id"]  # the same pair, not a second one
    wait_until(lambda: client.get(first.json()["url"]).json()["status"] in ("completed", "failed"), 240, 0.2,
               "the worst pair")


def test_the_front_goes_to_blind_review_and_an_approved_candidate_is_saved_as_a_tier_app_py_loads(studio):
    from engine.tiers import TierTable, with_knobs
    from studio.search.tierfile import search_records
    from studio.searches import SAVED_TIERS

    client, service = studio.client, studio.service
    shown = ensure_front(studio)
    first = {}  # one campaign per distinct configuration on the front: its first candidate
    for row in sorted(shown["front"], key=lambda r: r["candidate"]):
        first.setdefault((row["knobs"]["lora.scale"], row["knobs"]["bucket"]), row["candidate"])
    front = sorted(first.values())
    queued = client.post("/v1/searches/front/review")
    assert queued.status_code == 200, queued.text
    campaigns = queued.json()["campaigns"]
    assert queued.json()["blind"] is True and len(campaigns) == len(front) == 2
    assert {c["tier"] for c in campaigns} == {f"front-c{n}" for n in front}
    assert all(c["total"] == len(PROMPTS) for c in campaigns)
    again = client.post("/v1/searches/front/review")
    assert again.status_code == 409 and error_of(again)["field"] == "name"  # nothing new on the front
    assert {f"front-c{n}" for n in front} <= service.searches.blind_tiers()

    chosen = front[0]
    early = client.post(f"/v1/searches/front/candidates/{chosen}/tier", json={"name": "found-fast"})
    assert early.status_code == 409 and error_of(early)["field"] == "candidate"  # not approved yet

    campaign = next(c for c in campaigns if c["tier"] == f"front-c{chosen}")
    done = wait_until(lambda: (body := client.get(f"/v1/campaigns/{campaign['id']}").json())["pairs"].get(
        "completed") == len(PROMPTS) and body, 300, 0.2, "the candidate's review pairs")
    from studio.ui.review import blind_for_search

    assert all(blind_for_search(service, item["pair_id"], False) for item in done["data"])  # the Review tab: blind
    assert not blind_for_search(service, shown_pair_of_turbo(service), False)  # a hand-made pair stays as chosen
    assert client.put("/v1/approval-rule", json={"min_distinct_prompts": 2, "min_reviewers": 1}).status_code == 200
    for item in done["data"]:  # judged blind: A and B in a random order, the verdict recorded on the pair
        blind = client.post(f"/v1/pairs/{item['pair_id']}/blind", json={"reviewer": "rita"}).json()
        answer = client.post(f"/v1/blind/{blind['id']}/verdict", json={"reviewer": "rita", "answer": "no_difference"})
        assert answer.status_code == 200, answer.text

    bad = client.post(f"/v1/searches/front/candidates/{chosen}/tier", json={"name": "no spaces"})
    assert bad.status_code == 400 and error_of(bad)["field"] == "name"
    saved = client.post(f"/v1/searches/front/candidates/{chosen}/tier", json={"name": "found-fast"})
    assert saved.status_code == 200, saved.text
    assert saved.json()["tiers_file"] == SAVED_TIERS and "/" not in saved.json()["tiers_file"]
    assert saved.json()["tier"]["lora"]["path"] == "nano-turbo-9.safetensors"  # no server path in the answer

    path = service.config.data_dir / SAVED_TIERS
    loaded = TierTable.load(path)  # what app.py's --tiers-file hands Engine.load
    tier = loaded.get("found-fast")
    knobs = next(row["knobs"] for row in shown["front"] if row["candidate"] == chosen)
    expected = with_knobs(TierTable.load().get("turbo"), knobs)
    assert (tier.lora.scale, tier.bucket, tier.steps) == (expected.lora.scale, expected.bucket, expected.steps)
    assert tier.lora.resolved() == expected.lora.resolved()  # the LoRA file, wherever the tiers file lives
    record = search_records(path)["found-fast"]
    assert (record["search"], record["candidate"], record["candidate_tier"]) == ("front", chosen, f"front-c{chosen}")
    assert record["knobs"] == knobs and record["cost"]["measured_s"] == knobs_cost(knobs)
    assert record["cost_labels"]["measured"] == "measured on stub" and record["approved_configurations"]
    assert record["review_campaign"] == campaign["id"] and len(record["cases"]) == len(PROMPTS)
    served = {row["name"]: row for row in client.get("/v1/tiers").json()["data"]}
    assert served["found-fast"]["search_record"]["candidate"] == chosen  # served at once, with its record
    twice = client.post(f"/v1/searches/front/candidates/{chosen}/tier", json={"name": "found-fast"})
    assert twice.status_code == 400 and error_of(twice)["field"] == "name"
    assert TierTable.load(path).get("found-fast") == tier  # the refused save left the file as it was


def knobs_cost(knobs: dict) -> float:
    return TABLE[(knobs["lora.scale"], knobs["bucket"])][0]


def shown_pair_of_turbo(service) -> str:
    """A pair of the shipped turbo tier (made here if none exists)."""
    pairs = [p for p in service.list_pairs() if p.tier == "turbo"]
    if pairs:
        return pairs[0].id
    return service.submit_pair({"prompt": PROMPTS[0], "seed": 9, "tier": "turbo", "steps": 2, "baseline_steps": 2,
                                "target": {"duration_seconds": 5, "short_edge": 32}}).id


def test_with_auth_a_search_is_its_creators_to_cancel_and_only_admins_save_tiers(tmp_path, nano_engine):
    import json

    from studio.auth import load_accounts

    (tmp_path / "users.json").write_text(json.dumps({"alice": "wonder", "bob": "builder",
                                                     "root": {"password": "r00t", "role": "admin"}}))
    objective = StubObjective()
    objective.hold = threading.Event()
    service = StudioService.open(tmp_path / "data", engine=nano_engine, quality_loader=lambda: None)
    service.searches.evaluator_factory = objective.evaluator
    accounts = load_accounts(tmp_path / "users.json")
    app = create_app(service, accounts=accounts)
    alice, bob, root = ("alice", "wonder"), ("bob", "builder"), ("root", "r00t")
    try:
        with TestClient(app) as client:
            assert client.get("/v1/searches").status_code == 401
            assert client.post("/v1/searches", json=spec("mine", candidates=2), auth=alice).status_code == 200
            assert objective.entered.wait(30)
            refused = client.delete("/v1/searches/mine", auth=bob)
            assert refused.status_code == 403 and error_of(refused)["field"] == "name"
            assert client.delete("/v1/searches/mine", auth=root).status_code == 200  # an admin may
            objective.hold.set()
            assert finished(client, "mine", auth=bob)["progress"]["state"] == "cancelled"
            refused = client.post("/v1/searches/mine/resume", auth=bob)
            assert refused.status_code == 403 and error_of(refused)["field"] == "name"
            assert client.post("/v1/searches/mine/resume", auth=alice).status_code == 200
            shown = finished(client, "mine", auth=bob)
            assert shown["progress"]["state"] == "finished"
            candidate = shown["candidates"][-1]["candidate"]
            saved = client.post(f"/v1/searches/mine/candidates/{candidate}/tier", json={}, auth=alice)
            assert saved.status_code == 403 and error_of(saved)["field"] == "name"
    finally:
        service.close()


def test_after_a_restart_the_searches_state_is_read_back_and_reviewed_candidates_are_served_again(studio):
    from engine.engine import Engine
    from engine.tiers import TierTable
    from studio.searches import SearchManager

    client, service = studio.client, studio.service
    shown = ensure_front(studio)
    if not shown["review"].get("campaigns"):
        assert client.post("/v1/searches/front/review").status_code == 200
    review = service.searches.show("front")["review"]
    fresh = object.__new__(Engine)  # a newly loaded engine: the built-in tiers only (no weights needed here)
    fresh.tiers = TierTable.load()
    restarted = SearchManager(service)  # a new server's manager over the same data dir: no run in memory
    restarted.attach(fresh)
    assert set(review["tiers"]) <= set(fresh.tiers.tiers)  # their campaigns' pairs can be planned again
    assert fresh.tiers.get(review["tiers"][0]) == studio.service.engine.tiers.get(review["tiers"][0])
    assert restarted.show("front")["progress"]["state"] == "finished"  # its budget is spent
    # A search whose server stopped mid-run reads "stopped" (resume continues it), not "running".
    study = restarted._study("front")[0]
    last = study.user_attrs["last_run"]
    study.set_user_attr("last_run", {"state": "running"})
    try:
        assert restarted._stored_state(study, {"budget": 99, "done": 3}) == "stopped"
    finally:
        study.set_user_attr("last_run", last)


def test_a_real_nano_search_in_the_server_gives_way_to_a_pair_submitted_meanwhile(tmp_path, nano_engine):
    """The served nano makes the search's clips (EngineEvaluator through EngineBusy): a pair submitted while the
    search runs is made, the search waits for it (or gives its clip up and makes it again) and still finishes."""
    from studio.search import EngineEvaluator

    served = dict(nano_engine.tiers.tiers)
    service = StudioService.open(tmp_path / "data", engine=nano_engine, quality_loader=lambda: None)
    service.searches.evaluator_factory = lambda engine: EngineEvaluator(engine, lpips=False)
    try:
        body = {"name": "nano", "base_tier": "sol", "prompts": [PROMPTS[0]], "seeds": [0], "candidates": 2,
                "request": {"duration_seconds": 5, "short_edge": 32, "steps": 3},
                "knobs": {"sparse.keep_ratio": {"low": 0.05, "high": 0.5}, "sparse.dense_first_steps": {"low": 0,
                                                                                                       "high": 1}}}
        service.searches.start(body)
        wait_until(lambda: service.searches.show("nano")["progress"].get("current"), 60, 0.02, "the first case")
        pair = service.submit_pair({"prompt": PROMPTS[1], "seed": 3, "tier": "turbo", "steps": 2,
                                    "baseline_steps": 2, "target": {"duration_seconds": 5, "short_edge": 32}})
        made = wait_until(lambda: (p := service.get_pair(pair.id)).status in ("completed", "failed") and p, 240,
                          0.1, "the person's pair")
        assert made.status == "completed", made.error
        assert service.searches.wait("nano", 240) == "finished"
        shown = service.searches.show("nano")
        progress = shown["progress"]
        assert progress["done"] == 2 and (progress["gave_way_to_jobs"] >= 1 or progress["waited_for_queue_s"] > 0)
        assert all(row["cost"]["measured_s"] > 0 and row["cost"]["modelled_s"] > 0
                   for row in shown["candidates"] if "cost" in row)
        assert shown["cost"]["measured"]["label"].startswith("measured on CPU")
    finally:
        service.close()
        nano_engine.tiers.tiers.clear()
        nano_engine.tiers.tiers.update(served)

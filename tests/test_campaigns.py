"""Review campaigns (issue 18): a tier over a prompt suite × seeds; the studio queues every pair through the job queue
as it has room, shows progress, gives each reviewer the next pair they have not judged, and the configuration
reports the campaign's coverage. The nano engine at 32 px and 2 steps, over REST with --auth."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from studio.api import create_app
from studio.auth import load_accounts
from studio.campaigns import CampaignRunner, parse_prompts, prompt_suites
from studio.service import StudioService
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ALICE, BOB, ROOT = ("alice", "wonder"), ("bob", "builder"), ("root", "r00t")
TARGET = {"duration_seconds": 5, "aspect_ratio": "16:9", "short_edge": 32}
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def studio(tmp_path_factory, nano_engine):
    root = tmp_path_factory.mktemp("campaigns")
    (root / "users.json").write_text(json.dumps({"alice": "wonder", "bob": "builder",
                                                 "root": {"password": "r00t", "role": "admin"}}))
    service = StudioService.open(root / "data", engine=nano_engine, queue_size=8, quality_loader=lambda: None)
    with TestClient(create_app(service, accounts=load_accounts(root / "users.json"))) as client:
        yield SimpleNamespace(client=client, service=service)


def campaign_body(**extra) -> dict:
    return {"tier": "turbo", "steps": 2, "baseline_steps": 2, "target": TARGET, **extra}


def test_prompt_suites_are_the_prompt_files():
    assert parse_prompts("# a suite\na fox\n\n  an owl  \n# done\n") == ["a fox", "an owl"]
    suites = prompt_suites()
    assert "mixed" in suites
    assert {"name": "mixed", "prompts": len(parse_prompts(suites["mixed"].read_text()))} in \
        CampaignRunner.suites(SimpleNamespace(prompts_dir=suites["mixed"].parent))


def test_a_campaign_queues_every_pair_and_feeds_reviewers_their_next_pair(studio):
    client = studio.client
    prompts = "a red circle moves left to right\n# not a prompt\na blue square moves up\n"
    created = client.post("/v1/campaigns", auth=ALICE, json=campaign_body(prompts=prompts, seeds=[1, 2]))
    assert created.status_code == 200, created.text
    campaign = created.json()
    assert (campaign["total"], campaign["created_by"], campaign["status"]) == (4, "alice", "running")
    url = f"/v1/campaigns/{campaign['id']}"

    done = wait_until(lambda: (body := client.get(url, auth=ALICE).json())["pairs"].get("completed") == 4 and body,
                      TIMEOUT_S, 0.2, "the campaign's four pairs")
    assert done["status"] == "finished" and done["items"] == {"queued": 4}
    assert sorted((item["prompt"], item["seed"]) for item in done["data"]) == sorted(
        (p, s) for p in ("a red circle moves left to right", "a blue square moves up") for s in (1, 2))
    key = done["configurations"][0]
    assert done["configurations"] == [key]  # one configuration: the tier reviewed

    seen = []
    for left in (4, 3, 2, 1):
        nxt = client.get(f"{url}/next", auth=BOB).json()
        assert nxt["left_for_reviewer"] == left and nxt["pair"]["status"] == "completed"
        seen.append(nxt["pair"]["id"])
        assert client.post(f"/v1/pairs/{seen[-1]}/verdicts", auth=BOB, json={"decision": "accept"}).status_code == 200
    assert len(set(seen)) == 4
    finished = client.get(f"{url}/next", auth=BOB).json()
    assert (finished["pair"], finished["left_for_reviewer"]) == (None, 0)
    assert client.get(f"{url}/next", auth=ALICE).json()["left_for_reviewer"] == 4  # each reviewer has their own

    # The configuration page shows the campaign's coverage.
    config = client.get(f"/v1/configurations/{key}", auth=ALICE).json()
    coverage = next(c for c in config["campaigns"] if c["id"] == campaign["id"])
    assert (coverage["total"], coverage["reviewed"], coverage["fully_reviewed"], coverage["min_reviewers"]) == \
        (4, 4, 0, 2)  # one reviewer each; the rule asks for two
    assert campaign["id"] in [c["id"] for c in client.get("/v1/campaigns", auth=BOB).json()["data"]]


@pytest.mark.parametrize(("body", "field"), [
    (campaign_body(suite="no-such-suite"), "suite"),
    (campaign_body(suite="mixed", prompts="a fox"), "prompts"),
    (campaign_body(), "prompts"),
    (campaign_body(prompts="# only a comment\n\n"), "prompts"),
    (campaign_body(prompts="a fox\n\u200b\u200b\n"), "prompts"),  # the second prompt holds nothing visible
    (campaign_body(prompts="a fox", seeds=[]), "seeds"),
    (campaign_body(prompts="a fox", seeds=[True]), "seeds.0"),
    (campaign_body(prompts="a fox", seeds=[-1]), "seeds"),
    (campaign_body(prompts="a fox", tier="warp"), "tier"),
    (campaign_body(prompts="a fox", steps=0), "steps"),
    (campaign_body(prompts="a fox", colour="red"), "colour"),
    # pydantic's union branch tags leaked into the field (`prompts.function-after[_unicode_text(), str]`, issue 42)
    (campaign_body(prompts=5), "prompts"),
    (campaign_body(prompts=["a fox", 5]), "prompts.1"),
])
def test_a_bad_campaign_is_refused_naming_the_field(studio, body, field):
    before = len(studio.client.get("/v1/campaigns", auth=ALICE).json()["data"])
    response = studio.client.post("/v1/campaigns", auth=ALICE, json=body)
    assert (response.status_code, response.json()["error"]["field"]) == (400, field), response.text
    assert "function-after" not in response.json()["error"]["message"]  # no pydantic type expressions in it
    assert len(studio.client.get("/v1/campaigns", auth=ALICE).json()["data"]) == before  # nothing stored


def test_cancelling_stops_the_pending_pairs_and_only_the_creator_or_an_admin_may(studio):
    client, service = studio.client, studio.service
    pairs_before = len(service.store.list_pairs())
    created = client.post("/v1/campaigns", auth=ALICE, json=campaign_body(
        prompts=["a yellow triangle bounces", "a green dot drifts"], seeds=list(range(6)))).json()
    url = f"/v1/campaigns/{created['id']}"
    refused = client.delete(url, auth=BOB)
    assert (refused.status_code, refused.json()["error"]["field"]) == (403, "campaign_id")
    cancelled = client.delete(url, auth=ROOT).json()
    assert cancelled["status"] == "cancelled"
    again = client.delete(url, auth=ALICE)
    assert (again.status_code, again.json()["error"]["field"]) == (409, "campaign_id")

    # The pairs queued before the cancel (one may have been on its way) belong to the campaign and finish;
    # nothing more is queued.
    def settled():
        body = client.get(url, auth=ALICE).json()
        queued, pairs = body["items"].get("queued", 0), body["pairs"]
        made = len(service.store.list_pairs()) - pairs_before
        return made == queued == pairs.get("completed", 0) + pairs.get("failed", 0) and body

    body = wait_until(settled, TIMEOUT_S, 0.2, "the queued pairs")
    assert set(body["items"]) <= {"queued", "cancelled"} and body["items"]["cancelled"] >= 1
    assert body["items"].get("queued", 0) + body["items"]["cancelled"] == 12


def test_the_feeder_leaves_room_for_reviewers_own_pairs():
    """A campaign never takes the last INTERACTIVE_SLOTS queue places (a person's Generate would get 429)."""
    def runner(queued: int, max_queued: int) -> bool:
        service = SimpleNamespace(remotes=None, queue_status=lambda: {"queued": ["v"] * queued,
                                                                       "max_queued": max_queued})
        return CampaignRunner._room_for(SimpleNamespace(service=service), SimpleNamespace(tier="turbo"))

    assert [runner(q, 8) for q in range(7)] == [True] * 5 + [False] * 2  # a pair takes 2 of the 8, 2 stay free
    assert runner(0, 2) and not runner(1, 2)  # a queue too small to spare places still feeds
    assert not runner(0, 0)  # the engine is loading


def test_pending_items_are_queued_by_the_next_server(tmp_path, nano_engine):
    """A campaign stored while nothing could run it (the server stopped, or was still loading) is picked up by the
    next server on the data dir: its pending items become pairs."""
    from db.campaigns import CampaignStore
    from db.store import Store

    settings = {"steps": 2, "baseline_steps": 2, "target": TARGET}
    with Store(tmp_path / "data") as store:  # no engine and no feeder: the items stay pending
        campaign = CampaignStore(store).create("left over", "turbo", settings, [("a red kite", 5)], "alice")
        assert CampaignStore(store).progress(campaign.id)["items"] == {"pending": 1}
    service = StudioService.open(tmp_path / "data", engine=nano_engine, quality_loader=lambda: None)
    try:
        done = wait_until(lambda: (p := service.campaigns.progress(campaign.id))["pairs"].get("completed") == 1
                          and p, TIMEOUT_S, 0.2, "the left-over pair")
        assert (done["items"], done["status"]) == ({"queued": 1}, "finished")
        pair = service.get_pair(service.campaigns.items(campaign.id)[0]["pair_id"])
        assert (pair.prompt, pair.seed, pair.tier) == ("a red kite", 5, "turbo")
    finally:
        service.close()

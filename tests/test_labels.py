"""Honest weight labels (issue 15 item 5): the "random weights" badge follows the checkpoint's own metadata.

Two cases. A temp copy of the model folder and LoRAs marked random (h3_studio.json says untrained, the LoRAs say
h3_untrained="true", as the nano shipped before training landed) must show the badge everywhere and never call a
LoRA distilled. The shipped trained nano (no "untrained", LoRAs h3_untrained="false") must show no badge and call
the turbo LoRAs distilled, with no code change: the labels come from the files.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from safetensors.torch import load_file, save_file

import engine.techniques.lora as lora_technique
from engine.__main__ import main as engine_cli
from engine.components import NANO_PATH
from engine.engine import Engine
from engine.labels import RANDOM_WEIGHTS, lora_weights, model_untrained
from engine.tiers import ASSETS, TierTable
from studio.api import create_app
from studio.service import StudioService
from studio.ui.generate import tier_card_html, tier_choices
from studio.ui.page import status_html

LORA_TIERS = ("turbo", "turbo-5", "turbo-sparse")


def _cli_json(argv: list[str], capsys) -> object:
    assert engine_cli(argv) == 0
    return json.loads(capsys.readouterr().out)


def _mark_lora(source: Path, target: Path, untrained: str) -> None:
    """Copy a LoRA file with its `h3_untrained` metadata set (what a trained LoRA carries)."""
    from safetensors import safe_open

    with safe_open(str(source), framework="pt") as handle:
        metadata = dict(handle.metadata())
    save_file(load_file(str(source)), str(target), metadata={**metadata, "h3_untrained": untrained})


def _copy_assets(root: Path, untrained: bool) -> Path:
    shutil.copytree(NANO_PATH, root / "nano")
    studio = json.loads((root / "nano" / "h3_studio.json").read_text())
    studio.pop("untrained", None)
    (root / "nano" / "h3_studio.json").write_text(json.dumps({**studio, **({"untrained": True} if untrained else {})}))
    (root / "loras").mkdir()
    for lora in (ASSETS / "loras").glob("*.safetensors"):
        _mark_lora(lora, root / "loras" / lora.name, "true" if untrained else "false")
    return root


@pytest.fixture(scope="module")
def trained_assets(tmp_path_factory) -> Path:
    """A copy of assets/ whose nano and LoRAs are marked trained (as shipped)."""
    return _copy_assets(tmp_path_factory.mktemp("assets"), untrained=False)


@pytest.fixture(scope="module")
def random_assets(tmp_path_factory) -> Path:
    """A copy of assets/ whose nano and LoRAs are marked random, as the untrained nano shipped."""
    return _copy_assets(tmp_path_factory.mktemp("random_assets"), untrained=True)


def _service(tmp_path: Path, engine) -> tuple[StudioService, TestClient]:
    service = StudioService.open(tmp_path / "data", engine=engine, quality_loader=lambda: None)
    return service, TestClient(create_app(service))


def test_shipped_nano_is_labelled_trained():
    assert not model_untrained(NANO_PATH)
    assert {lora_weights(p) for p in (ASSETS / "loras").glob("*.safetensors")} == {"distilled"}


def test_random_assets_carry_the_badge_everywhere(random_assets, tmp_path, capsys, monkeypatch):
    nano = random_assets / "nano"
    assert model_untrained(nano)
    info = _cli_json(["info", "--model", str(nano)], capsys)
    assert info["random_weights"] is True and RANDOM_WEIGHTS in info["weights"]
    monkeypatch.setattr(lora_technique, "ASSETS", random_assets)
    rows = {row["name"]: row for row in _cli_json(["tiers", "--model", str(nano)], capsys)}
    assert all(row["random_weights"] for row in rows.values())  # the model itself is random
    for name in LORA_TIERS:
        assert rows[name]["lora_weights"] == "random"
        assert "distilled" not in rows[name]["description"]
        assert rows[name]["lora_text"].startswith("random weights")

    service, client = _service(tmp_path, Engine.load(str(nano)))
    with client:
        health = client.get("/health").json()
        assert health["random_weights"] is True
        rest_rows = {r["name"]: r for r in client.get("/v1/tiers", params={"duration": 5}).json()["data"]}
        assert rest_rows["turbo"]["lora_weights"] == "random" and rest_rows["baseline"]["random_weights"]
        assert RANDOM_WEIGHTS in status_html(service)
        card = tier_card_html(list(rest_rows.values()), "turbo", 5.0)
        assert RANDOM_WEIGHTS in card and "LoRA: random weights (untrained, not distilled)" in card
        assert "LoRA: distilled" not in card
        assert all(RANDOM_WEIGHTS in label for label, _ in tier_choices(list(rest_rows.values())) if "✗" not in label)


def test_a_copy_marked_trained_shows_no_badge_and_distilled_loras(trained_assets, tmp_path, capsys, monkeypatch):
    nano = trained_assets / "nano"
    info = _cli_json(["info", "--model", str(nano)], capsys)
    assert info["random_weights"] is False and info["weights"] == "trained"
    # Built-in tiers resolve their LoRAs under the LoRA technique's ASSETS: point it at the trained copy.
    monkeypatch.setattr(lora_technique, "ASSETS", trained_assets)
    rows = {row["name"]: row for row in _cli_json(["tiers", "--model", str(nano)], capsys)}
    assert not any(row["random_weights"] for row in rows.values())
    assert all(rows[name]["lora_weights"] == "distilled" for name in LORA_TIERS)

    engine = Engine.load(str(nano))
    assert engine.components.untrained is False
    service, client = _service(tmp_path, engine)
    with client:
        assert client.get("/health").json()["random_weights"] is False
        rest_rows = client.get("/v1/tiers", params={"duration": 5}).json()["data"]
        assert not any(row["random_weights"] for row in rest_rows)
        assert RANDOM_WEIGHTS not in status_html(service)
        card = tier_card_html(rest_rows, "turbo", 5.0)
        assert RANDOM_WEIGHTS not in card and "LoRA: distilled" in card


def test_one_random_lora_keeps_its_tier_badged_on_a_trained_model(trained_assets, tmp_path):
    """A trained model with one LoRA still random: only the tiers using that LoRA carry the badge."""
    random_lora = tmp_path / "random.safetensors"
    _mark_lora(ASSETS / "loras" / "nano-turbo-9.safetensors", random_lora, "true")
    unlabelled = tmp_path / "unlabelled.safetensors"
    save_file(load_file(str(ASSETS / "loras" / "nano-turbo-9.safetensors")), str(unlabelled))
    tiers_file = tmp_path / "tiers.toml"
    tiers_file.write_text(f'''
[[tier]]
name = "still-random"
description = "9-step adapter"
steps = 9
[tier.lora]
path = "{random_lora.name}"

[[tier]]
name = "user-adapter"
description = "production adapter"
steps = 9
[tier.lora]
path = "{unlabelled.name}"
''')
    rows = {r["name"]: r for r in TierTable.load(tiers_file).describe(5.0, model_untrained(trained_assets / "nano"))}
    assert rows["still-random"]["random_weights"] and rows["still-random"]["lora_weights"] == "random"
    assert not rows["baseline"]["random_weights"]
    assert not rows["user-adapter"]["random_weights"] and rows["user-adapter"]["lora_weights"] == "unlabelled"

"""LPIPS without torchvision (quality/lpips_net.py): it runs wherever the AlexNet backbone weights are on
disk (a path, or the torch hub cache), computes what the lpips package computes, and says how to enable it
otherwise. The weights files are made here: random AlexNet weights under torchvision's key names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from quality import ClipData, compare_clips, lpips_metric, lpips_net, synth, write_clip
from tests.lpips_stub import random_backbone_lpips

ROOT = Path(__file__).resolve().parent.parent


def _random_alexnet_state(seed: int) -> dict[str, torch.Tensor]:
    """A full torchvision-style AlexNet state dict (features and classifier), random, seeded."""
    torch.manual_seed(seed)
    features = lpips_net.alexnet_features()
    state = {f"features.{k}": v.clone() for k, v in features.state_dict().items()}
    state["classifier.1.weight"] = torch.randn(16, 8)  # torchvision's file has a classifier too; ignored
    return state


@pytest.fixture(autouse=True)
def fresh_cache():
    lpips_metric.reset_lpips_cache()
    yield
    lpips_metric.reset_lpips_cache()


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("lpips") / lpips_net.BACKBONE_FILE
    torch.save(_random_alexnet_state(7), path)
    return path


def test_network_equals_the_lpips_package_on_the_same_weights(weights):
    """Our module vs lpips.LPIPS (built under the test stub's stand-in torchvision) with the same backbone."""
    reference = random_backbone_lpips()
    if reference is None:
        pytest.skip("this lpips version cannot be built under the stub")
    state = torch.load(weights, weights_only=True)
    slices = [reference.net.slice1, reference.net.slice2, reference.net.slice3, reference.net.slice4,
              reference.net.slice5]
    for sl in slices:  # lpips keeps torchvision's layer indices as module names inside each slice
        for name, layer in sl.named_children():
            if isinstance(layer, torch.nn.Conv2d):
                layer.weight.data.copy_(state[f"features.{name}.weight"])
                layer.bias.data.copy_(state[f"features.{name}.bias"])
    ours = lpips_net.build_alex_lpips(weights)
    g = torch.Generator().manual_seed(0)
    a = torch.rand(3, 3, 96, 128, generator=g) * 2 - 1
    b = (a + 0.2 * torch.randn(a.shape, generator=g)).clamp(-1, 1)
    with torch.no_grad():
        want = reference.eval()(a, b)
        got = ours(a, b)
    assert got.shape == want.shape == (3, 1, 1, 1)
    assert float(want.abs().min()) > 0
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    assert float(ours(a, a).abs().max()) == 0.0


def test_compare_uses_weights_from_a_path_or_the_hub_cache(weights, tmp_path, monkeypatch):
    frames = synth.render_clip(synth.make_scene(2, width=224, height=128, frames=4, speed=3.0))
    noisy = synth.noise(frames, 10, seed=1)
    given = compare_clips(ClipData(frames, 24.0), ClipData(noisy, 24.0), flip=False, lpips_weights=str(weights))
    summary = given.summary()
    assert summary["lpips_reason"] is None and summary["lpips_delta"] > 0
    assert all(row["lpips"] > 0 for row in summary["per_frame"])
    # The same file found in the torch hub cache (TORCH_HOME/hub/checkpoints), no path given.
    lpips_metric.reset_lpips_cache()
    checkpoints = tmp_path / "torch" / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / lpips_net.BACKBONE_FILE).write_bytes(weights.read_bytes())
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    cached = compare_clips(ClipData(frames, 24.0), ClipData(noisy, 24.0), flip=False).summary()
    assert cached["lpips_delta"] == summary["lpips_delta"]
    # Other weights give other distances: the file is really what is loaded.
    lpips_metric.reset_lpips_cache()
    other = tmp_path / "other.pth"
    torch.save(_random_alexnet_state(8), other)
    changed = compare_clips(ClipData(frames, 24.0), ClipData(noisy, 24.0), flip=False,
                            lpips_weights=str(other)).summary()
    assert changed["lpips_delta"] != summary["lpips_delta"]


def test_missing_or_wrong_weights_say_how_to_enable(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty"))
    scorer, reason = lpips_metric.load_lpips()
    assert scorer is None
    assert reason.startswith("LPIPS not available") and "--lpips-weights PATH" in reason
    assert str(tmp_path / "empty" / "hub" / "checkpoints" / lpips_net.BACKBONE_FILE) in reason
    wrong = tmp_path / "wrong.pth"
    torch.save({"conv.weight": torch.zeros(1)}, wrong)
    _, reason = lpips_metric.load_lpips(str(wrong))
    assert "is not torchvision's AlexNet checkpoint (missing features.0.bias" in reason
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"not a torch file")
    _, reason = lpips_metric.load_lpips(str(garbage))
    assert f"the AlexNet backbone weights at {garbage} could not be read" in reason


def test_without_the_lpips_package_it_says_what_to_install(weights, monkeypatch):
    monkeypatch.setitem(sys.modules, "lpips", None)  # find_spec then reports it missing
    _, reason = lpips_metric.load_lpips(str(weights))
    assert "the lpips package" in reason and "pip install --no-deps lpips" in reason


def test_importing_does_not_need_torchvision():
    """The network builds in a process where torchvision cannot be imported, and transformers still imports."""
    code = ("import sys; sys.modules['torchvision'] = None\n"
            "from quality.lpips_net import AlexLpips; AlexLpips()\n"
            "import transformers; print('ok')")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


def test_cli_lpips_weights(weights, tmp_path):
    frames = synth.render_clip(synth.make_scene(4, width=224, height=128, frames=3, speed=3.0))
    paths = tmp_path / "a.mp4", tmp_path / "b.mp4"
    write_clip(paths[0], ClipData(frames, 24.0))
    write_clip(paths[1], ClipData(synth.blur(frames, 2.0), 24.0))

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "quality", "compare", *map(str, paths), "--no-flip",
                               *args], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)

    run = cli("--lpips-weights", str(weights))
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["lpips_reason"] is None and isinstance(summary["lpips_delta"], float)
    assert np.isfinite(summary["lpips_delta"]) and summary["lpips_delta"] > 0
    missing = cli("--lpips-weights", str(tmp_path / "nowhere.pth"))
    assert missing.returncode == 2 and "error: --lpips-weights:" in missing.stderr and "nowhere.pth" in missing.stderr

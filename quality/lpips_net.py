"""LPIPS (Zhang et al. 2018, version 0.1, AlexNet) built here, without torchvision.

The `lpips` package imports torchvision at import time, and PyPI's torchvision does not import beside the CPU torch
this project pins (installing it also broke transformers' imports). The network is small, so it is built here,
layer for layer as `lpips.LPIPS(net="alex", version="0.1")` builds it:
  - input scaling: (x - shift) / scale per channel, x in [-1, 1];
  - torchvision's AlexNet `features` (layers 0-11) in five slices ending at relu1..relu5;
  - per slice: channel-normalised features, squared difference, a trained 1x1 convolution (no bias), spatial mean;
  - the sum over the five slices.
Two files hold the weights, read with torch.load only:
  - the backbone: torchvision's ImageNet AlexNet checkpoint (`alexnet-owt-7be5be79.pth`, 233 MB), given as a path
    or found in the torch hub cache (`torch.hub.get_dir()/checkpoints`), where torchvision would have put it;
  - the linear heads: `weights/v0.1/alex.pth` inside the installed lpips package (6 KB), located without importing
    lpips (which would import torchvision).
tests/test_lpips_weights.py checks the result against the lpips package's own module on the same weights.

Shapes: images float32 (N, 3, H, W) in [-1, 1]; distances (N, 1, 1, 1), as lpips returns them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch import nn

BACKBONE_FILE = "alexnet-owt-7be5be79.pth"  # torchvision's name for the ImageNet AlexNet weights
_SHIFT = (-0.030, -0.088, -0.188)
_SCALE = (0.458, 0.448, 0.450)
_CHANNELS = (64, 192, 384, 256, 256)
_SLICES = ((0, 2), (2, 5), (5, 8), (8, 10), (10, 12))  # features[a:b] ends at relu1 .. relu5
_CONVS = (0, 3, 6, 8, 10)  # the Conv2d layers of features, by index


class LpipsUnavailable(Exception):
    """LPIPS cannot be built here; the message says what is missing and how to enable it."""


def alexnet_features() -> nn.Sequential:
    """torchvision's AlexNet.features up to relu5 (layer indices 0-11 match torchvision's state-dict keys)."""
    return nn.Sequential(
        nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=2), nn.ReLU(inplace=True),
        nn.MaxPool2d(kernel_size=3, stride=2),
        nn.Conv2d(64, 192, kernel_size=5, padding=2), nn.ReLU(inplace=True),
        nn.MaxPool2d(kernel_size=3, stride=2),
        nn.Conv2d(192, 384, kernel_size=3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(384, 256, kernel_size=3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(256, 256, kernel_size=3, padding=1), nn.ReLU(inplace=True),
    )


class AlexLpips(nn.Module):
    """LPIPS v0.1 on AlexNet: forward(in0, in1) -> (N, 1, 1, 1) distances for [-1, 1] NCHW images."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("shift", torch.tensor(_SHIFT).view(1, 3, 1, 1))
        self.register_buffer("scale", torch.tensor(_SCALE).view(1, 3, 1, 1))
        self.features = alexnet_features()
        self.lins = nn.ModuleList(nn.Conv2d(c, 1, kernel_size=1, bias=False) for c in _CHANNELS)
        self.requires_grad_(False)

    def _stages(self, x: torch.Tensor) -> list[torch.Tensor]:
        out = []
        h = (x - self.shift) / self.scale
        for start, stop in _SLICES:
            for layer in self.features[start:stop]:
                h = layer(h)
            out.append(h)
        return out

    def forward(self, in0: torch.Tensor, in1: torch.Tensor) -> torch.Tensor:
        total = 0
        for lin, f0, f1 in zip(self.lins, self._stages(in0), self._stages(in1)):
            diff = (_unit(f0) - _unit(f1)) ** 2
            total = total + lin(diff).mean(dim=(2, 3), keepdim=True)
        return total


def _unit(features: torch.Tensor, eps: float = 1e-10) -> torch.Tensor:
    """Features divided by their L2 norm over channels (lpips.normalize_tensor)."""
    return features / (features.pow(2).sum(dim=1, keepdim=True).sqrt() + eps)


def hub_backbone_path() -> Path:
    """Where torchvision keeps the AlexNet weights in the torch hub cache (TORCH_HOME respected)."""
    return Path(torch.hub.get_dir()) / "checkpoints" / BACKBONE_FILE


def heads_path() -> Path:
    """The lpips package's trained linear heads for AlexNet, found without importing lpips."""
    spec = importlib.util.find_spec("lpips")
    if spec is None or not spec.submodule_search_locations:
        raise LpipsUnavailable(
            "LPIPS not available: the lpips package (its trained linear heads, weights/v0.1/alex.pth) is not "
            "installed. To enable: `pip install --no-deps lpips==0.1.4` (scripts/install.sh does this; torchvision "
            "is not needed)")
    return Path(spec.submodule_search_locations[0]) / "weights" / "v0.1" / "alex.pth"


def _load(path: Path, what: str) -> dict:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - unreadable, truncated or not a torch file: one message
        raise LpipsUnavailable(f"LPIPS not available: the {what} at {path} could not be read "
                               f"({type(exc).__name__}: {exc})") from exc
    if not isinstance(state, dict):
        raise LpipsUnavailable(f"LPIPS not available: the {what} at {path} is not a state dict")
    return state


def build_alex_lpips(backbone: str | Path | None = None) -> AlexLpips:
    """AlexLpips with its weights loaded; backbone: the AlexNet checkpoint, default the torch hub cache's.

    Raises LpipsUnavailable naming the missing or bad file and how to enable LPIPS.
    """
    path = Path(backbone) if backbone is not None else hub_backbone_path()
    if not path.is_file():
        where = f"{path} does not exist" if backbone is not None else f"not in the torch hub cache ({path})"
        raise LpipsUnavailable(
            f"LPIPS not available: the AlexNet backbone weights ({BACKBONE_FILE}, 233 MB): {where}. To enable: "
            f"pass --lpips-weights PATH to that file (CLI) or lpips_weights= (compare_clips, OverlayCache), or "
            f"copy it to {hub_backbone_path()}; this machine cannot download it")
    model = AlexLpips()
    backbone_state = _load(path, "AlexNet backbone weights")
    wanted = {f"features.{i}.{p}" for i in _CONVS for p in ("weight", "bias")}
    missing = sorted(wanted - set(backbone_state))
    if missing:
        raise LpipsUnavailable(f"LPIPS not available: {path} is not torchvision's AlexNet checkpoint "
                               f"(missing {', '.join(missing[:3])})")
    try:
        model.features.load_state_dict({k[len("features."):]: v for k, v in backbone_state.items() if k in wanted})
        heads = _load(heads_path(), "lpips linear heads")
        model.lins.load_state_dict({f"{i}.weight": heads[f"lin{i}.model.1.weight"] for i in range(5)})
    except (KeyError, RuntimeError) as exc:  # wrong shapes or keys: a different network's file
        raise LpipsUnavailable(f"LPIPS not available: weights do not fit LPIPS' AlexNet ({type(exc).__name__}: "
                               f"{exc})") from exc
    return model.eval()

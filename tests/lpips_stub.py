"""A stand-in LPIPS for machines where the real one cannot run (h3-facts §9).

The lpips package imports torchvision, which does not import beside the CPU torch here, and its AlexNet weights
need a download. For test-only rankings we build `lpips.LPIPS(net="alex", pnet_rand=True)`: the package's own
trained linear heads on a randomly initialised AlexNet. A minimal `torchvision.models.alexnet` (the layer layout
lpips slices) is put in sys.modules only while the model is built, and every module imported meanwhile is
removed afterwards, so nothing else in the test session sees a fake torchvision.

Its numbers are not LPIPS; reports label them "lpips_random_backbone".
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager

from quality.lpips_net import alexnet_features


def _alexnet(pretrained: bool = False, **_kwargs):
    from torch import nn

    if pretrained:
        raise RuntimeError("the stub has no pretrained AlexNet weights")
    # torchvision's AlexNet.features, layer for layer: up to relu5, then its last max-pool
    features = nn.Sequential(*alexnet_features(), nn.MaxPool2d(kernel_size=3, stride=2))
    return types.SimpleNamespace(features=features)


@contextmanager
def _fake_torchvision() -> Iterator[None]:
    before = set(sys.modules)
    saved = {name: sys.modules.get(name) for name in ("torchvision", "torchvision.models")}
    models = types.ModuleType("torchvision.models")
    models.alexnet = _alexnet
    package = types.ModuleType("torchvision")
    package.models = models
    sys.modules["torchvision"], sys.modules["torchvision.models"] = package, models
    try:
        yield
    finally:
        for name in set(sys.modules) - before:
            if name == "lpips" or name.startswith(("lpips.", "torchvision")):
                del sys.modules[name]
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def random_backbone_lpips(seed: int = 0):
    """An lpips.LPIPS with a seeded random AlexNet, or None when even that cannot be built."""
    import torch

    torch.manual_seed(seed)
    try:
        with _fake_torchvision():
            import lpips

            return lpips.LPIPS(net="alex", pnet_rand=True, verbose=False)
    except Exception:  # noqa: BLE001 - an lpips version with other internals: no stand-in, the report says so
        return None

"""engine/placement.py's device check: the conditioner's hooks must see a tensor on cuda:0 as on the engine's "cuda"
(issue 23: offload never sent the conditioner away on the H200 because cuda:0 != cuda)."""

from __future__ import annotations

import torch

from engine.placement import on_device


def test_a_tensor_on_cuda_0_is_on_the_engines_unindexed_cuda_device():
    assert on_device(torch.device("cuda", 0), torch.device("cuda"))
    assert on_device(torch.device("cuda", 1), torch.device("cuda"))  # "cuda" is whichever GPU is current
    assert on_device(torch.device("cuda", 0), torch.device("cuda", 0))
    assert on_device(torch.device("cpu"), torch.device("cpu"))


def test_other_devices_are_not():
    assert not on_device(torch.device("cpu"), torch.device("cuda"))
    assert not on_device(torch.device("cuda", 0), torch.device("cpu"))
    assert not on_device(torch.device("cuda", 1), torch.device("cuda", 0))
    assert not on_device(torch.device("meta"), torch.device("cuda"))

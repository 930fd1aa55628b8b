"""engine/placement.py's conditioner placement (issue 23), as measured wrong on the H200: offload never sent the
conditioner away (cuda:0 != cuda), and when it did, only at the transformer's first call, after a LoRA merge."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine.placement import apply_plan, on_device


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


class _Conditioner(torch.nn.Module):
    """Records where it is moved; its `model` is what diffusers calls to encode (the hooks hang off it)."""

    def __init__(self, fail: bool = False):
        super().__init__()
        self.model = torch.nn.Identity()
        self.where, self.moves, self.fail = torch.device("cpu"), [], fail
        self.model.register_forward_hook(self._encode)

    def to(self, device):
        self.where = torch.device(device)
        self.moves.append(str(device))
        return self

    def parameters(self, recurse: bool = True):
        yield SimpleNamespace(device=self.where, is_meta=False)

    def _encode(self, module, args, output):
        self.seen_on = self.where
        if self.fail:
            raise RuntimeError("encode failed")


def _offloaded(fail: bool = False):
    encoder = _Conditioner(fail)
    components = SimpleNamespace(text_encoder=encoder, device=torch.device("cuda"), path=".", dtype=torch.bfloat16,
                                 transformer=torch.nn.Identity())
    return encoder, apply_plan(components, SimpleNamespace(placement="offload"))


def test_offload_encodes_on_the_gpu_and_sends_the_conditioner_away_before_denoising_starts():
    encoder, hooks = _offloaded()
    encoder.model(torch.zeros(1))
    assert encoder.seen_on == torch.device("cuda")
    # back in CPU memory as soon as it has encoded: a LoRA merge (before the transformer's first call) has the room
    assert encoder.moves == ["cpu", "cuda", "cpu"]
    encoder.model(torch.zeros(1))  # the next prompt brings it again
    assert encoder.moves == ["cpu", "cuda", "cpu", "cuda", "cpu"]
    for hook in hooks:
        hook.remove()


def test_offload_sends_the_conditioner_away_even_when_the_encode_fails():
    encoder, _ = _offloaded(fail=True)
    with pytest.raises(RuntimeError, match="encode failed"):
        encoder.model(torch.zeros(1))
    assert encoder.moves == ["cpu", "cuda", "cpu"]

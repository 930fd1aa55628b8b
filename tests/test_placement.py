"""engine/placement.py's conditioner placement (issue 23), as measured wrong on the H200: offload never sent the
conditioner away (cuda:0 != cuda), and when it did, only at the transformer's first call, after a LoRA merge."""

from __future__ import annotations

import weakref
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


class _Model(torch.nn.Module):
    def __init__(self, fail: bool):
        super().__init__()
        self.first, self.second = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
        self.second.weight = self.first.weight  # tied, as embeddings and heads are
        self.register_buffer("inv_freq", torch.arange(4.0))
        self.fail, self.seen_on = fail, []

    def forward(self, x):
        self.seen_on.append((self.first.weight.device, self.second.weight.device, self.inv_freq.device))
        if self.fail:
            raise RuntimeError("encode failed")
        return self.second(self.first(x)) + self.inv_freq


class _Conditioner(torch.nn.Module):
    """What the engine holds: diffusers calls `text_encoder.model(...)` to encode, and the hooks hang off it."""

    def __init__(self, fail: bool = False):
        super().__init__()
        self.model = _Model(fail)


def _offloaded(fail: bool = False):
    """An offloaded conditioner on a stand-in device: "meta" plays the GPU (a CPU test cannot copy to CUDA)."""
    encoder = _Conditioner(fail)
    components = SimpleNamespace(text_encoder=encoder, device=torch.device("meta"), path=".", dtype=torch.float32,
                                 transformer=torch.nn.Identity())
    return encoder, apply_plan(components, SimpleNamespace(placement="offload"))


def test_offload_encodes_on_the_device_and_is_back_on_its_host_copy_before_denoising_starts():
    encoder, hooks = _offloaded()
    model = encoder.model
    host = {name: tensor.data_ptr() for name, tensor in (*model.named_parameters(), *model.named_buffers())}
    expected = torch.nn.functional.linear(torch.nn.functional.linear(torch.ones(1, 4), model.first.weight,
                                                                     model.first.bias),
                                          model.first.weight, model.second.bias) + model.inv_freq
    for _ in range(2):  # each prompt brings it and sends it away again
        model(torch.ones(1, 4, device="meta"))
        # sent away as soon as it has encoded (a LoRA merge before the transformer's first call has the room), by
        # pointing back at the host copies: nothing copied, nothing changed
        assert {name: tensor.data_ptr() for name, tensor in (*model.named_parameters(), *model.named_buffers())} \
            == host
    assert model.seen_on == [(torch.device("meta"),) * 3] * 2  # weights, the tied one and buffers all moved
    assert model.second.weight is model.first.weight
    for hook in hooks:
        hook.remove()
    assert torch.equal(model(torch.ones(1, 4)), expected)  # on its host copy it computes as before


def test_offload_sends_the_conditioner_away_even_when_the_encode_fails():
    encoder, _ = _offloaded(fail=True)
    with pytest.raises(RuntimeError, match="encode failed"):
        encoder.model(torch.ones(1, 4, device="meta"))
    assert encoder.model.seen_on == [(torch.device("meta"),) * 3]
    assert all(parameter.device.type == "cpu" for parameter in encoder.parameters())


def test_reload_keeps_no_copy_and_reads_the_conditioner_from_disk_for_every_encode_the_first_too(monkeypatch):
    """On the H200 the first reload encode found the weights on the host, not on disk, and crashed (there is no host
    copy under reload); "meta" plays the GPU here too, so a dropped parameter is one whose device is meta before
    the encode and the stand-in loader is what reads the disk."""
    from engine import conditioner

    loads = []

    loaded = []

    def read_from_disk(folder, dtype, device):
        loads.append(device)
        model = _Conditioner().to(device)
        # as engine.conditioner's vision-on-demand hook does: a closure that refers back to the model (a cycle)
        model.model.register_forward_pre_hook(lambda module, args: model and None)
        loaded.append(weakref.ref(model))
        return model

    monkeypatch.setattr(conditioner, "load_conditioner", read_from_disk)
    encoder = _Conditioner()
    components = SimpleNamespace(text_encoder=encoder, device=torch.device("meta"), path=".", dtype=torch.float32,
                                 transformer=torch.nn.Identity())
    apply_plan(components, SimpleNamespace(placement="reload"))
    assert all(parameter.is_meta for parameter in encoder.parameters())  # nothing held between prompts
    assert encoder.model.inv_freq.device.type == "cpu"  # buffers stay: they are not in the checkpoint
    for _ in range(2):
        encoder.model(torch.ones(1, 4, device="meta"))
    assert loads == [torch.device("meta")] * 2
    # the loaded copies are gone once their weights are dropped: on the H200 the cycle kept 47.8 GiB alive
    assert [ref() for ref in loaded] == [None, None]
    assert encoder.model.seen_on[-1][0] == torch.device("meta")

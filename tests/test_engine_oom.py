"""A request that runs out of memory mid-denoise must leave the base weights exactly as loaded (issue 23).

Seen on the H200 (bench/gpu_memory.sh, turbo-sparse at 14.375 s): the step ran out of memory inside a block, and the
LoRA restore then ran out too, because the exception's traceback kept the step's activations alive; the merged
weights stayed in the model and the engine went on serving. Here the out-of-memory error is raised on the CPU by a
block hook that holds a tensor, as a failed step would."""

from __future__ import annotations

import weakref

import pytest
import torch

from engine.engine import Engine
from engine.lora import LoraHandle

TURBO = {"prompt": "a red circle moves left to right", "tier": "turbo", "seed": 5}


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def _failing_block(engine: Engine, held: list) -> torch.utils.hooks.RemovableHandle:
    def run_out(module, args):
        activation = torch.ones(256, 256)  # stands for the step's activations, kept alive by the traceback
        held.append(weakref.ref(activation))
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.04 GiB (raised by the test)")

    return engine.components.transformer.transformer_blocks[1].register_forward_pre_hook(run_out)


def test_out_of_memory_mid_step_frees_the_step_before_restoring_the_base_weights(monkeypatch):
    engine = Engine.load()
    before = _state(engine.components.transformer)
    held, alive_at_restore = [], []
    unmerge = LoraHandle.unmerge

    def watched_unmerge(self):
        alive_at_restore.append(held[0]() is not None)
        return unmerge(self)

    monkeypatch.setattr(LoraHandle, "unmerge", watched_unmerge)
    hook = _failing_block(engine, held)
    with pytest.raises(torch.OutOfMemoryError):
        engine.generate(TURBO)
    hook.remove()
    assert alive_at_restore == [False]  # the failed step's tensors were gone before the restore ran
    after = _state(engine.components.transformer)
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert engine.damaged is None
    engine.generate({**TURBO, "tier": "baseline", "steps": 2})  # still serving


def test_a_restore_that_fails_for_any_reason_stops_the_engine_serving(monkeypatch):
    engine = Engine.load()

    def out_of_memory(self):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 588.00 MiB (raised by the test)")

    monkeypatch.setattr(LoraHandle, "unmerge", out_of_memory)
    with pytest.raises(RuntimeError, match="OutOfMemoryError"):
        engine.generate({**TURBO, "steps": 1})
    monkeypatch.undo()
    with pytest.raises(RuntimeError, match="restart it to reload the checkpoint"):  # never serves merged weights
        engine.generate({**TURBO, "tier": "baseline", "steps": 2})

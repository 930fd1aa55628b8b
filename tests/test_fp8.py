"""FP8 as an acceleration dimension on CPU (issue 17 item 3): the torch reference of the quantization, the fp8
block against the stock block, the tier rules, and the fp8 tiers through the nano engine.

The Triton kernels are checked against these references in the interpreter (tests/kernels_interp_checks.py) and on
the GPU at real shapes (tests/test_kernels_gpu.py, marked gpu).
"""

from __future__ import annotations

import pytest
import torch

from engine.errors import RequestError
from engine.fp8 import BLOCK_LINEARS, FP8_HOOK, install_fp8_linears, quantize_block_linears, remove_fp8_linears
from engine.fused import disable_fused_blocks, enable_fused_blocks
from engine.hooks import has_hook
from engine.tiers import LoraSpec, TierSpec, TierTable
from kernels.fp8_rows import FP8_MAX, fp8_linear, quantize_rows, quantize_rows_reference, quantize_weight
from kernels.norm_modulate_fp8 import norm_modulate_fp8
from kernels.swiglu_fp8 import swiglu_fp8

PROMPT = "a yellow triangle bounces over a dark blue background"


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_rowwise_quantization_round_trips_within_e4m3_precision():
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 3, 64)  # six decades
    x[0, 0] = 0.0
    q = quantize_rows_reference(x)
    assert q.data.dtype == torch.float8_e4m3fn and q.scale.shape == (3, 5, 1) and q.dtype == x.dtype
    # The row's largest magnitude lands on ±448; every element is within half an e4m3 step (1/16 relative) or,
    # below the normal range, within half the smallest subnormal step.
    assert torch.allclose(q.data.float().abs().amax(-1)[1:], torch.full((2, 5), FP8_MAX))
    back = q.dequantize()
    assert ((back - x).abs() <= x.abs() / 16 + q.scale * 2.0 ** -10).all()
    assert torch.equal(back[0, 0], torch.zeros(64)) and torch.isfinite(q.scale).all()


def test_fp8_linear_reference_is_the_dequantized_matmul_and_close_to_fp32():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 7, 96, generator=g), torch.randn(48, 96, generator=g) * 0.05
    xq, wq = quantize_rows(x), quantize_weight(w)
    y = fp8_linear(xq, wq)
    assert y.shape == (2, 7, 48) and y.dtype == x.dtype
    assert torch.allclose(y, xq.dequantize() @ wq.dequantize().t(), rtol=1e-5, atol=1e-6)
    assert 1e-3 < rel(y, x @ w.t()) < 0.06  # e4m3: about 2-4 % on random data, never exact


def test_quantized_rows_reorder_with_their_scales():
    q = quantize_rows(torch.randn(1, 6, 32, generator=torch.Generator().manual_seed(0)))
    order = torch.tensor([5, 0, 3, 1, 4, 2])
    moved = q.index_select(1, order)
    assert torch.equal(moved.dequantize(), q.dequantize().index_select(1, order))
    with pytest.raises(ValueError, match="last dimension"):
        q.index_select(2, torch.tensor([0]))


def test_fused_ops_quantize_what_the_bf16_ops_compute():
    from kernels.norm_modulate import norm_modulate_reference

    B, S, C = 1, 9, 64
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(B, S, C, generator=g), torch.randn(C, generator=g)
    shift, scale = torch.randn(6, 6 * C, generator=g).chunk(6, dim=-1)[:2]
    idx = torch.randint(0, 6, (S,), generator=g)
    assert rel(norm_modulate_fp8(x, w, 1e-5, scale, shift, idx).dequantize(),
               norm_modulate_reference(x, w, 1e-5, scale, shift, idx)) < 0.04
    h = torch.randn(2, S, 2 * C, generator=g)
    value, gate = h.chunk(2, dim=-1)
    assert rel(swiglu_fp8(h).dequantize(), value * torch.nn.functional.silu(gate)) < 0.04
    with pytest.raises(ValueError, match="value and gate"):
        swiglu_fp8(torch.randn(2, 5, generator=g))


def test_fp8_block_is_close_to_the_stock_block_and_leaves_it_stock():
    from tests.nano_inputs import nano_model_and_inputs

    model, inputs = nano_model_and_inputs()
    weights = quantize_block_linears(model)
    assert len(weights) == len(model.transformer_blocks) * len(BLOCK_LINEARS)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        ref = model(**inputs)
        enable_fused_blocks(model, fp8=True)
        install_fp8_linears(model, weights)
        got = model(**inputs)
        remove_fp8_linears(model, weights)
        disable_fused_blocks(model)
        after = model(**inputs)
    error = rel(got.sample, ref.sample)
    assert 1e-4 < error < 0.1, error  # fp8 changes the output, a little
    assert torch.equal(after.sample, ref.sample) and torch.equal(after.audio_sample, ref.audio_sample)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert not any(has_hook(m, FP8_HOOK) for m in model.modules())


def test_fp8_tier_rules():
    table = TierTable.load()
    assert table.get("fp8").fp8 and table.get("fp8").steps == 50 and table.get("fp8").sparse is None
    sol8 = table.get("sol-fp8")
    assert sol8.fp8 and sol8.sparse == table.get("sol").sparse and sol8.cache == table.get("sol").cache
    assert "fp8 linears" in sol8.techniques
    with pytest.raises(RequestError) as error:
        TierTable().add(TierSpec("f", "fp8 without fused kernels", steps=50, fp8=True))
    assert error.value.field == "tier.fp8"
    with pytest.raises(RequestError, match="LoRA"):
        TierTable().add(TierSpec("f", "fp8 with a LoRA", steps=9, fused=True, fp8=True,
                                 lora=LoraSpec("nano-turbo-9.safetensors")))


def test_fp8_tiers_run_on_the_nano_and_leave_the_model_as_it_was(nano_engine):
    transformer = nano_engine.components.transformer
    state = {k: v.clone() for k, v in transformer.state_dict().items()}
    base = nano_engine.latents({"prompt": PROMPT, "seed": 3, "steps": 3})
    fp8 = nano_engine.latents({"prompt": PROMPT, "seed": 3, "steps": 3, "tier": "fp8"})
    error = rel(fp8["video_rows"], base["video_rows"])
    assert 1e-4 < error < 0.2, error
    sol8 = nano_engine.latents({"prompt": PROMPT, "seed": 3, "steps": 20, "tier": "sol-fp8"})
    assert all(s["sparse_blocks"] == 0 for s in sol8["steps"][:10]) and any(s["sparse_blocks"] for s in sol8["steps"])
    assert torch.isfinite(sol8["video_rows"]).all()
    assert all(torch.equal(v, state[k]) for k, v in transformer.state_dict().items())
    assert not any(has_hook(m, FP8_HOOK) for m in transformer.modules())
    again = nano_engine.latents({"prompt": PROMPT, "seed": 3, "steps": 3})
    assert torch.equal(again["video_rows"], base["video_rows"])

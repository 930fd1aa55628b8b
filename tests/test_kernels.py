"""CPU tests of the kernels (issue 5).

- Triton kernels at small shapes through Triton's CPU interpreter, in a subprocess (TRITON_INTERPRET=1 must be set
  before triton is imported and changes every kernel in the process, so it stays out of this pytest process).
- The torch references against diffusers' own ops, the fused blocks against the stock ones, strict mode, and the
  compile key staying the same across prompt lengths (checked with Triton's own binder, no GPU needed).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kernels import block_sparse_attn as bsa
from kernels import tile_select as sel
from kernels._common import use_triton
from kernels.norm_modulate import norm_modulate, norm_modulate_reference
from kernels.qk_norm_rope import qk_norm_rope_reference
from kernels.residual_gate import residual_gate_

ROOT = Path(__file__).resolve().parents[1]
INTERP_CHECKS = [
    "norm_modulate",
    "residual_gate",
    "qk_norm_rope",
    "select_tiles",
    "topk_radix_select",
    "attention_keep1_equals_dense",
    "attention_sparse_vs_reference",
    "attention_padding_exact",
    "fused_model_interpreter",
    "quantize_rows",
    "norm_modulate_fp8",
    "swiglu_fp8",
]


# The checks run in two subprocesses at once, about half of the interpreter's time each (the checks' own seconds:
# attention_sparse_vs_reference 14.5, topk_radix_select 12.4, attention_keep1_equals_dense 6.1, qk_norm_rope 4.6,
# fused_model_interpreter 4.1, select_tiles 3.0, attention_padding_exact 2.3, the rest under 1 s). This process only
# waits meanwhile, so on the 2-core CI machine the pair takes about half the time of one process running them all.
INTERP_HALVES = (
    ["attention_sparse_vs_reference", "qk_norm_rope", "fused_model_interpreter", "norm_modulate", "residual_gate"],
    ["topk_radix_select", "attention_keep1_equals_dense", "select_tiles", "attention_padding_exact", "quantize_rows",
     "norm_modulate_fp8", "swiglu_fp8"],
)


@pytest.fixture(scope="module")
def interp_results():
    assert sorted(sum(INTERP_HALVES, [])) == sorted(INTERP_CHECKS), "every check in exactly one half"
    env = dict(os.environ, TRITON_INTERPRET="1", H3_KERNELS_INTERPRET="1", PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-m", "tests.kernels_interp_checks", *half], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for half in INTERP_HALVES]
    results: dict[str, list] = {}
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=480)
            assert proc.returncode == 0, stderr[-3000:]
            results.update(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


@pytest.mark.parametrize("name", INTERP_CHECKS)
def test_triton_interpreter(interp_results, name):
    ok, detail = interp_results[name][:2]
    assert ok, detail


def test_cpu_uses_reference_without_interpreter():
    if os.environ.get("TRITON_INTERPRET") == "1" or os.environ.get("H3_KERNELS_INTERPRET") == "1":
        pytest.skip("interpreter forced in this process")
    assert not use_triton(torch.zeros(1))


def test_norm_modulate_reference_matches_diffusers_math():
    g = torch.Generator().manual_seed(11)
    B, S, C = 2, 11, 64
    x = torch.randn(B, S, C, generator=g)
    norm = torch.nn.RMSNorm(C, eps=1e-5)
    torch.nn.init.normal_(norm.weight, generator=g)
    shift, scale = torch.randn(6, 6 * C, generator=g).chunk(6, dim=-1)[:2]
    idx = torch.randint(0, 6, (S,), generator=g)
    ref = norm(x) * (1.0 + scale.index_select(0, idx)) + shift.index_select(0, idx)
    got = norm_modulate(x, norm.weight, 1e-5, scale, shift, idx)
    assert (got - ref).abs().max().item() <= 1e-5
    assert torch.allclose(norm_modulate_reference(x, norm.weight, 1e-5, scale, shift, idx), got)


def test_residual_gate_in_place():
    g = torch.Generator().manual_seed(7)
    x, h = torch.randn(1, 7, 16, generator=g), torch.randn(1, 7, 16, generator=g)
    gate = torch.randn(6, 16, generator=g)
    idx = torch.randint(0, 6, (7,), generator=g)
    ref = x + gate.index_select(0, idx) * h
    y = residual_gate_(x, gate, idx, h)
    assert y is x and torch.allclose(x, ref, atol=1e-6)


def test_qk_norm_rope_reference_matches_diffusers():
    from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3RotaryPosEmbed, _apply_rotary_emb

    g = torch.Generator().manual_seed(13)
    B, S, H, D = 1, 13, 2, 128
    cos, sin = MiniMaxH3RotaryPosEmbed(16)(torch.randint(0, 90, (S, 3), generator=g))
    assert cos.shape == (S, 96)  # 96 of 128 channels rotate on the released config
    q, k = torch.randn(B, S, H, D, generator=g), torch.randn(B, S, H, D, generator=g)
    nq, nk = torch.nn.RMSNorm(D, eps=1e-5), torch.nn.RMSNorm(D, eps=1e-5)
    torch.nn.init.normal_(nq.weight, generator=g)
    torch.nn.init.normal_(nk.weight, generator=g)
    qo, ko = qk_norm_rope_reference(q, k, nq.weight, nk.weight, 1e-5, cos, sin)
    assert (qo - _apply_rotary_emb(nq(q), cos, sin)).abs().max().item() <= 1e-5
    assert (ko - _apply_rotary_emb(nk(k), cos, sin)).abs().max().item() <= 1e-5


@pytest.mark.parametrize("S,vs,vl", [(200, 17, 200), (256, 0, 230), (300, 64, 257)])
def test_attention_reference_keep1_is_dense(S, vs, vl):
    g = torch.Generator().manual_seed(S + vs + vl)
    D = 32
    q, k, v = (torch.randn(2, S, 3, D, generator=g) for _ in range(3))
    out = bsa.block_sparse_attention(q, k, v, video_start=vs, valid_len=vl, keep_ratio=1.0)
    dense = F.scaled_dot_product_attention(*(t[:, :vl].transpose(1, 2) for t in (q, k, v))).transpose(1, 2)
    # Two fp32 computations of the same function (masked matmul + softmax over S keys, SDPA over vl) differ only by
    # rounding, which scales with the values' size and the reductions' length: each output is a softmax-weighted sum
    # of vl rows of v (|error| <~ sqrt(n) * eps * max|v| for n rounded terms, the usual probabilistic bound for an
    # n-term fp32 sum, Higham & Mary 2019), after D-term dot products for the scores. A fixed 1e-6 failed one run in
    # six (issue 42: 1.0133e-06; over 100 unseeded draws up to 1.49e-6). Over 900 seeded draws of these cases the
    # error stayed <= 2.6 * eps * max|v| (this bound: 15-17 of them); a tile left out moves outputs by 0.39-0.67.
    tol = math.sqrt(vl + D) * torch.finfo(torch.float32).eps * v[:, :vl].abs().max().item()
    assert (out[:, :vl] - dense).abs().max().item() <= tol
    assert (out[:, vl:] == 0).all()


def test_attention_reference_semantics_brute_force():
    # Independent check of the mask: per query row, softmax over exactly the allowed keys.
    S, vs, vl, tile, keep = 150, 10, 140, 16, 0.3
    g = torch.Generator().manual_seed(150)
    q, k, v = (torch.randn(1, S, 2, 16, dtype=torch.float64, generator=g) for _ in range(3))
    ti = sel.select_tiles_reference(q, k, vs, vl, keep, tile)
    out = bsa.block_sparse_attention_reference(q, k, v, video_start=vs, valid_len=vl, keep_ratio=keep, tile=tile,
                                               tile_indices=ti)
    for h in range(2):
        for i in range(S):
            if i >= vl:
                assert (out[0, i, h] == 0).all()
                continue
            if i < vs:
                keys = list(range(vl))
            else:
                keys = list(range(vs))
                for t in ti[0, h, (i - vs) // tile].tolist():
                    keys += list(range(vs + t * tile, min(vs + (t + 1) * tile, vl)))
            s = (k[0, keys, h] @ q[0, i, h]) / math.sqrt(16)
            ref = torch.softmax(s, 0) @ v[0, keys, h]
            assert torch.allclose(out[0, i, h], ref, atol=1e-12)


def test_select_tiles_shape_and_keep():
    g = torch.Generator().manual_seed(670)
    q, k = torch.randn(1, 64 * 10 + 30, 2, 32, generator=g), torch.randn(1, 64 * 10 + 30, 2, 32, generator=g)
    ti = sel.select_tiles(q, k, 30, 64 * 10 + 30, 0.1)
    assert ti.shape == (1, 2, 10, 1) and ti.dtype == torch.long
    ti = sel.select_tiles(q, k, 30, 64 * 10 + 30, 0.25)
    assert ti.shape == (1, 2, 10, 3)
    assert sel.num_keep_tiles(583, 0.1) == 59


def test_strict_mode_raises_instead_of_dense(monkeypatch):
    q = torch.randn(1, 128, 2, 32, generator=torch.Generator().manual_seed(128))
    monkeypatch.setattr(bsa, "triton_path", lambda x: True)  # pretend these are GPU tensors
    monkeypatch.setattr(sel, "HAS_TRITON", False)  # ... on a machine whose Triton cannot run
    with pytest.raises(bsa.KernelUnavailable):
        bsa.block_sparse_attention(q, q, q, video_start=10, valid_len=128, keep_ratio=0.1)
    with pytest.raises(bsa.KernelUnavailable):
        bsa.block_sparse_attention(q, q, q, video_start=10, valid_len=128, keep_ratio=0.1, strict=True,
                                   tile_indices=torch.zeros(1, 2, 2, 1, dtype=torch.long))


@pytest.mark.parametrize("impl", [1, 3])
def test_no_recompile_across_lengths_within_bucket(impl, monkeypatch):
    """Triton's own binder gives the same specialisation key for every prompt length in a bucket."""
    if not isinstance(bsa._bsa_fwd_kernel, __import__("triton").runtime.jit.JITFunction):
        pytest.skip("interpreter active in this process")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    monkeypatch.setitem(bsa.CONFIG, "impl", impl)
    fn = {1: bsa._bsa_fwd_kernel, 3: bsa._bsa_fwd3_kernel}[impl]
    binder = create_function_from_signature(fn.signature, fn.params, make_backend(GPUTarget("cuda", 90, 32)))

    g = torch.Generator().manual_seed(4096)

    def key(S, vs, vl, keep, dtype=torch.bfloat16):
        q = torch.randn(1, S, 2, 128, generator=g).to(dtype)
        ti = sel.select_tiles_reference(q, q, vs, vl, keep, 64)
        kernel, grid, args, kwargs = bsa._attention_launch(q, q, q, torch.empty_like(q), vs, vl, 64, ti)
        assert kernel is fn  # impl 3's K/V descriptors hold valid_len in their shape; the key must not see it
        _, spec, opts = binder(*args, **kwargs)
        return repr(spec) + repr(opts)

    bucket = 4096  # one 64-aligned bucket, three prompt lengths / sink sizes / keep counts
    keys = {key(bucket, 464, 3990, 0.1), key(bucket, 50, 4096, 0.1), key(bucket, 1, 3001, 0.25)}
    assert len(keys) == 1
    assert key(bucket, 464, 3990, 0.1, torch.float16) not in keys  # the key does see what it must


def test_fused_blocks_equal_stock_blocks():
    from engine.attention import AttentionRuntime, install_processors, restore_processors
    from engine.fused import disable_fused_blocks, enable_fused_blocks, fused_blocks_enabled
    from tests.nano_inputs import nano_model_and_inputs

    model, inputs = nano_model_and_inputs()
    rows = inputs["position_ids"].shape[0]
    with torch.no_grad():
        ref = model(**inputs)
        assert enable_fused_blocks(model) == model.config.num_layers
        assert fused_blocks_enabled(model)
        fused = model(**inputs)
        # The engine's processor on a fused tier: fused QK norm + RoPE, dense attention.
        runtime = AttentionRuntime(plan=None, valid_length=rows, padded_length=rows, video_start=0, fused=True)
        previous = install_processors(model, runtime)
        fused_qk = model(**inputs)
        restore_processors(model, previous)
        disable_fused_blocks(model)
        after = model(**inputs)
    assert runtime.dense_calls == model.config.num_layers
    assert torch.equal(after.sample, ref.sample)  # the hooks come off without a trace
    for out in (fused, fused_qk):
        assert (out.sample - ref.sample).abs().max().item() <= 1e-5
        assert (out.audio_sample - ref.audio_sample).abs().max().item() <= 1e-5
    assert not fused_blocks_enabled(model)

"""Interpreter checks of the Triton kernels at small shapes, run in a subprocess by tests/test_kernels.py.

`TRITON_INTERPRET=1` has to be set before triton is imported and changes how every `@triton.jit` in the process
behaves, so these checks live in their own process. Prints one JSON object {check: [ok, detail, seconds]} on the last
line. With check names as arguments (`python -m tests.kernels_interp_checks qk_norm_rope select_tiles`) only those
run.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"
os.environ["H3_KERNELS_INTERPRET"] = "1"

import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import zlib  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kernels import block_sparse_attn as bsa  # noqa: E402
from kernels import tile_select as sel  # noqa: E402
from kernels.norm_modulate import norm_modulate, norm_modulate_reference  # noqa: E402
from kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_reference  # noqa: E402
from kernels.residual_gate import residual_gate, residual_gate_, residual_gate_reference  # noqa: E402

RESULTS: dict[str, list] = {}
SELECTED = set(sys.argv[1:])  # empty: every check


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def check(name):
    def deco(fn):
        if SELECTED and name not in SELECTED:
            return fn
        t0 = time.time()
        # Each check draws its inputs from its own seed: the same inputs whichever checks run, in whatever order.
        torch.manual_seed(zlib.crc32(name.encode()))
        try:
            detail = fn()
            RESULTS[name] = [True, detail, round(time.time() - t0, 2)]
        except Exception as exc:  # noqa: BLE001 - report any failure, keep checking the others
            RESULTS[name] = [False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}"]
        return fn
    return deco


def fresh(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def tables(C, rows=6):
    # adaln_proj layout: one [rows, 6*C] tensor viewed as six [rows, C] chunks (row stride 6*C).
    return fresh(rows, 6 * C).chunk(6, dim=-1)


@check("norm_modulate")
def _():
    out = []
    for dtype, weight, tol in ((torch.float32, True, 1e-6), (torch.bfloat16, True, 1e-2), (torch.float32, False, 1e-6)):
        B, S, C = 2, 19, 80
        x = fresh(B, S, C, dtype=dtype)
        w = fresh(C, dtype=dtype) if weight else None
        shift, scale = tables(C)[:2]
        shift, scale = shift.to(dtype), scale.to(dtype)
        idx = torch.randint(0, 6, (S,))
        y = norm_modulate(x, w, 1e-5, scale, shift, idx)
        ref = norm_modulate_reference(x.double(), None if w is None else w.double(), 1e-5, scale.double(),
                                      shift.double(), idx)
        e = rel(y, ref)
        assert y.dtype == dtype and e < tol, (dtype, e)
        out.append(e)
    return out


@check("residual_gate")
def _():
    B, S, C = 2, 23, 72
    x, h = fresh(B, S, C), fresh(B, S, C)
    gate = tables(C)[2]
    idx = torch.randint(0, 6, (S,))
    ref = residual_gate_reference(x.double(), gate.double(), idx, h.double())
    x2 = x.clone()
    ptr = x2.data_ptr()
    y = residual_gate_(x2, gate, idx, h)
    assert y.data_ptr() == ptr, "not in place"
    e1 = rel(y, ref)
    h2 = h.clone()  # aliasing out=h (what the fused block does with the attention output)
    e2 = rel(residual_gate(x, gate, idx, h2, out=h2), ref)
    assert e1 < 1e-6 and e2 < 1e-6, (e1, e2)
    return [e1, e2]


@check("qk_norm_rope")
def _():
    from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3RotaryPosEmbed, _apply_rotary_emb

    out = []
    from kernels import qk_norm_rope as qr

    saved = dict(qr.CONFIG)
    tilings = (("rows", 32, 1, False), ("token", 2, 1, False), ("token", 4, 2, True), ("token", 1, 1, True))
    cases = [(D, f, v) for D, f in ((32, 4), (128, 16)) for v in tilings]
    for D, freq, (variant, block, t, qk) in cases:  # nano (24 of 32 rotated) and full size (96 of 128), all tilings
        qr.CONFIG.update(variant=variant, BLOCK=block, T=t, QK=qk)
        B, S, H = 2, 9, 3
        rope = MiniMaxH3RotaryPosEmbed(rope_freq_dim=freq)
        cos, sin = rope(torch.randint(0, 50, (S, 3)).double())
        assert cos.shape[-1] == 6 * freq
        qkv = fresh(B, S, 3 * H * D)  # chunks of a fused QKV: strided q and k
        q, k, _ = (t.unflatten(-1, (H, D)) for t in qkv.chunk(3, dim=-1))
        wq, wk = fresh(D), fresh(D)
        qo, ko = qk_norm_rope(q, k, wq, wk, 1e-5, cos, sin)
        norm_q = torch.nn.RMSNorm(D, eps=1e-5, dtype=torch.float64)
        norm_k = torch.nn.RMSNorm(D, eps=1e-5, dtype=torch.float64)
        norm_q.weight.data.copy_(wq)
        norm_k.weight.data.copy_(wk)
        rq = _apply_rotary_emb(norm_q(q.double()), cos.double(), sin.double())
        rk = _apply_rotary_emb(norm_k(k.double()), cos.double(), sin.double())
        e = max(rel(qo, rq), rel(ko, rk))
        assert e < 1e-6 and qo.is_contiguous(), e
        rr = qk_norm_rope_reference(q, k, wq, wk, 1e-5, cos, sin)
        assert rel(rr[0], rq) < 1e-6
        out.append(e)
    qr.CONFIG.clear()
    qr.CONFIG.update(saved)
    return out


def layout(S, video_start, valid_len, H=2, D=32, dtype=torch.float32, poison_padding=True):
    q, k, v = (fresh(1, S, H, D, dtype=dtype) for _ in range(3))
    if poison_padding and valid_len < S:  # padded rows hold garbage that must never leak
        for t in (q, k, v):
            t[:, valid_len:] = float("nan")
    return q, k, v


@check("select_tiles")
def _():
    out = []
    for S, vs, vl, keep in ((300, 20, 270, 0.3), (256, 0, 256, 0.5), (200, 37, 199, 0.1)):
        q, k, _ = layout(S, vs, vl)
        got = sel.select_tiles(q, k, vs, vl, keep, tile=16)
        n = sel.num_video_tiles(vs, vl, 16)
        assert got.shape == (1, 2, n, sel.num_keep_tiles(n, keep)) and got.dtype == torch.long
        # exact against torch's top-k of the Triton score product (its own fp32 rounding)
        qm, km = sel._tile_means_triton(q, k, vs, vl, 16)
        raw = sel._scores_triton(qm, km)
        assert (raw - qm @ km.transpose(-1, -2)).abs().max() < 1e-5
        ref = torch.sort(torch.topk(raw * (1 / math.sqrt(q.shape[-1])), got.shape[-1], -1).indices, -1).values
        assert torch.equal(got, ref), "selection differs from reference"
        # brute force: the kept set is the top-k of mean(q).mean(k)
        qm = torch.stack([q[0, vs + i * 16: min(vs + (i + 1) * 16, vl)].double().mean(0) for i in range(n)], 1)
        km = torch.stack([k[0, vs + i * 16: min(vs + (i + 1) * 16, vl)].double().mean(0) for i in range(n)], 1)
        sc = torch.einsum("hid,hjd->hij", qm, km)
        kth = sc.sort(-1, descending=True).values[..., got.shape[-1] - 1: got.shape[-1]]
        chosen = sc.gather(-1, got[0])
        assert (chosen >= kth - 1e-5).all()
        out.append(list(got.shape))
    return out


@check("topk_radix_select")
def _():
    # one part (1607 -> 2048 lanes, 100, 20, ...) and two parts (583 -> 512 + 128, 640, 700, 40)
    for n, k_ in ((583, 59), (1607, 161), (20, 3), (16, 16), (17, 16), (7, 1), (100, 37), (3, 2), (640, 64),
                  (40, 5), (700, 70)):
        sc = fresh(2, 3, 5, n)
        got = sel._topk_triton(sc, k_)
        ref = torch.sort(torch.topk(sc, k_, dim=-1).indices, -1).values
        assert torch.equal(got, ref), (n, k_)
        scale = 1 / math.sqrt(128)  # the kernel's own scaling rounds as torch's does
        got = sel._topk_triton(sc, k_, scale)
        ref = torch.sort(torch.topk(sc * scale, k_, dim=-1).indices, -1).values
        assert torch.equal(got, ref), (n, k_, "scaled")
    # ties at the threshold (all 32 rounds run, then the tie path) are taken in index order; -0.0 ties +0.0
    tie = torch.zeros(1, 1, 2, 10)
    tie[..., 3] = 1.0
    tie[..., 7] = -1.0
    assert sel._topk_triton(tie, 4).tolist() == [[[[0, 1, 2, 3]] * 2]]
    assert sel._topk_triton(-tie, 5).tolist() == [[[[0, 1, 2, 4, 7]] * 2]]
    # n = 40 is held as 32 + 16 lanes: the tied keys run on into the second part
    tie = torch.zeros(1, 40)
    tie[0, 38], tie[0, 2] = 1.0, -1.0
    assert sel._topk_blocks(40) == (32, 16, True)
    assert sel._topk_triton(tie, 38).tolist() == [[0, 1] + list(range(3, 39))]
    assert sel._topk_triton(tie, 39).tolist() == [[0, 1] + list(range(3, 40))]
    return "exact"


def _dense_valid(q, k, v, valid_len):
    qt, kt, vt = (t[:, :valid_len].transpose(1, 2) for t in (q, k, v))
    return F.scaled_dot_product_attention(qt, kt, vt).transpose(1, 2)


@check("attention_keep1_equals_dense")
def _():
    out = []
    for S, vs, vl in ((320, 23, 300), (256, 0, 256), (192, 64, 150)):
        q, k, v = layout(S, vs, vl)
        o = bsa.block_sparse_attention(q, k, v, video_start=vs, valid_len=vl, keep_ratio=1.0, tile=16)
        e = (o[:, :vl] - _dense_valid(q, k, v, vl)).abs().max().item()
        assert e < 1e-5, e
        assert (o[:, vl:] == 0).all(), "padded query rows not exactly zero"
        out.append(e)
    return out


@check("attention_sparse_vs_reference")
def _():
    out = []
    cases = ((320, 23, 300, 0.25, torch.float32, 1e-5, 2), (384, 50, 384, 0.1, torch.float32, 1e-5, 2),
             (320, 23, 290, 0.3, torch.bfloat16, 2e-2, 2), (320, 23, 300, 0.25, torch.float32, 1e-5, 1),
             (336, 40, 330, 0.2, torch.float32, 1e-5, 1))
    # both kernels: impl 1 with one or two key tiles per step, impl 3 (two loops, K/V through tensor descriptors)
    cases = [c + (1,) for c in cases] + [c[:6] + (1, 3) for c in cases]
    saved = dict(bsa.CONFIG)
    for S, vs, vl, keep, dtype, tol, kv_tiles, impl in cases:
        bsa.CONFIG.update(kv_tiles=kv_tiles, impl=impl)
        q, k, v = layout(S, vs, vl, dtype=dtype)
        ti = sel.select_tiles_reference(q, k, vs, vl, keep, 16)
        o = torch.full_like(q, float("nan"))  # poison: every element must be written
        bsa._launch_attention(q, k, v, o, vs, vl, 16, ti)
        ref = bsa.block_sparse_attention_reference(q.double(), k.double(), v.double(), video_start=vs,
                                                   valid_len=vl, keep_ratio=keep, tile=16, tile_indices=ti)
        assert not torch.isnan(o).any(), "unwritten or NaN output"
        e = rel(o, ref)
        assert e < tol, e
        assert (o[:, vl:] == 0).all()
        out.append(e)
    bsa.CONFIG.update(saved)
    return out


@check("attention_padding_exact")
def _():
    # The same valid rows padded to two bucket sizes give bit-identical valid outputs.
    vs, vl = 30, 200
    q, k, v = layout(vl, vs, vl)
    outs = []
    for S in (208, 256):
        pad = lambda t: torch.cat([t, torch.full((1, S - vl) + t.shape[2:], 1e4)], 1)  # noqa: E731, B023 - used in this iteration
        ti = sel.select_tiles(pad(q), pad(k), vs, vl, 0.3, 16)
        o = bsa.block_sparse_attention(pad(q), pad(k), pad(v), video_start=vs, valid_len=vl, keep_ratio=0.3,
                                       tile=16, tile_indices=ti)
        assert (o[:, vl:] == 0).all()
        outs.append(o[:, :vl])
    assert torch.equal(outs[0], outs[1])
    return "bit-identical"


@check("fused_model_interpreter")
def _():
    from engine.attention import AttentionRuntime, install_processors
    from engine.fused import disable_fused_blocks, enable_fused_blocks
    from tests.nano_inputs import nano_model_and_inputs

    model, inputs = nano_model_and_inputs()
    rows = inputs["position_ids"].shape[0]
    with torch.no_grad():
        ref = model(**inputs)
        enable_fused_blocks(model)
        # The engine's processor on a fused tier (fused QK norm + RoPE, dense attention).
        install_processors(model, AttentionRuntime(plan=None, valid_length=rows, padded_length=rows, video_start=0,
                                                   fused=True))
        got = model(**inputs)
        disable_fused_blocks(model)
    e = max((got.sample - ref.sample).abs().max().item(), (got.audio_sample - ref.audio_sample).abs().max().item())
    assert e < 1e-4, e
    return e


def _same_codes(got, ref, values: torch.Tensor | None = None) -> float:
    """Codes of two quantizations of the same rows: scales equal to fp32 rounding, codes equal.

    Two faults of the interpreter's fp32 -> e4m3 cast (numpy emulation, Triton 3.9) are let through, and counted in
    the detail: it rounds exact ties away from zero (-21 -> -22, torch: -20, to even), one step apart, which bf16
    inputs hit; and it drops the carry when rounding up crosses a power of two (31.5 -> 16 instead of 32): there
    the code is exactly half the reference's power of two. The GPU tests (tests/test_kernels_gpu.py) hold the hardware
    cast to torch's. With `values` (the scaled fp32 values the codes round) every one-step difference must be such a
    tie, or a subnormal code (below 2^-6, steps of 2^-9) that the interpreter truncated toward zero, a third fault;
    without, at most 1% of the codes may differ by one step."""
    assert got.data.dtype == torch.float8_e4m3fn and got.dtype == ref.dtype
    assert torch.allclose(got.scale, ref.scale, rtol=1e-6, atol=0)
    a, b = got.data.float(), ref.data.float()
    lost_carry = (a * 2 == b) & (b != 0) & (torch.log2(b.abs()) % 1 == 0)
    step = (a - b).abs() <= b.abs() / 8 + 2 ** -9
    off = (a != b) & ~lost_carry
    assert (lost_carry | step).all()
    if values is None:
        assert off.float().mean().item() < 1e-2, off.float().mean().item()
    else:
        v = values.float()
        tie = ((v - a).abs() - (v - b).abs()).abs() <= 1e-6 * v.abs()
        truncated = (b.abs() <= 2**-6) & (a == torch.sign(v) * torch.floor(v.abs() / 2**-9) * 2**-9)
        bad = off & ~tie & ~truncated
        assert not bad.any(), f"{int(bad.sum())} codes off by one step: values {v[bad][:4].tolist()}"
    return {"carry_lost": int(lost_carry.sum()), "one_step": int(off.sum()), "codes": a.numel()}


@check("quantize_rows")
def _():
    from kernels.fp8_rows import quantize_rows, quantize_rows_reference

    out = []
    for shape, dtype in (((2, 3, 80), torch.float32), ((3, 300), torch.bfloat16)):
        x = fresh(*shape, dtype=dtype) * 3
        x[0, 0] = 0.0  # an all-zero row keeps a finite scale
        ref = quantize_rows_reference(x)
        out.append(_same_codes(quantize_rows(x), ref, values=x.float() / ref.scale))
    return out


@check("norm_modulate_fp8")
def _():
    from kernels.norm_modulate_fp8 import norm_modulate_fp8, norm_modulate_fp8_reference

    out = []
    for dtype, weight in ((torch.float32, True), (torch.bfloat16, True), (torch.float32, False)):
        B, S, C = 1, 6, 80
        x = fresh(B, S, C, dtype=dtype)
        w = fresh(C, dtype=dtype) if weight else None
        shift, scale = (t.to(dtype) for t in tables(C)[:2])
        idx = torch.randint(0, 6, (S,))
        got = norm_modulate_fp8(x, w, 1e-5, scale, shift, idx)
        assert got.data.shape == (B, S, C) and got.scale.shape == (B, S, 1)
        out.append(_same_codes(got, norm_modulate_fp8_reference(x, w, 1e-5, scale, shift, idx)))
    return out


@check("swiglu_fp8")
def _():
    from kernels.swiglu_fp8 import swiglu_fp8, swiglu_fp8_reference

    out = []
    for dtype in (torch.float32, torch.bfloat16):
        h = fresh(1, 6, 2 * 72, dtype=dtype) * 2
        got = swiglu_fp8(h)
        assert got.data.shape == (1, 6, 72)
        out.append(_same_codes(got, swiglu_fp8_reference(h)))
    return out


if __name__ == "__main__":
    if SELECTED - RESULTS.keys():
        sys.exit(f"unknown checks: {sorted(SELECTED - RESULTS.keys())}")
    print(json.dumps(RESULTS))
    sys.exit(0)

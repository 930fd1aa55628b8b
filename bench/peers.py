"""Peer block-sparse attention libraries on our sparse pattern (issue 17 item 2), next to our kernel and dense cuDNN.

Peers (each imported inside try/except on the GPU; a missing or failing one is recorded, never fatal):
- cuDNN frontend's CuTe DSL block-sparse attention, `cudnn.BSA.block_sparse_attention_forward` (read in the
  nvidia-cudnn-frontend 1.32.0 wheel; its SM90 path is blk64: 64-row query blocks, 64-key blocks, one list of
  key-block ids per (batch, head, query block), `block_sizes` shortening partial key blocks);
- flash-attn-4's forward with `block_sparse_tensors` (read in the 4.0.0b40 wheel; FlexAttention-style: per query
  block a list of full key blocks and a list of partial ones on which `mask_mod` runs; on SM90 the tile is fitted
  to 64 x 64 sparse blocks).

Wheels, sizes and the device commands: bench/results/kernels.md, "Peers (issue 17 item 2)".

Both peers need 64-aligned blocks from row 0, and our layout is not aligned: the video tiles start at
`video_start` (464 or 1200 rows of text + audio sink) and the last one is partial. So the peers run on the *peer
layout*, the same rows with padding inserted:

    [ sink rows 0..video_start | pad to a 64 boundary | video tile 0 | ... | last video tile, padded to 64 ]

Padding keys never count (cuDNN: `block_sizes`; flash-attn-4: its partial blocks carry a `mask_mod` that keeps the
real keys); padding query rows are not read back. On the same q/k/v and the same selected tiles, a peer's output on
the valid rows is therefore the same function as ours: sink queries see every valid key, a video query tile sees
the sink keys and its selected video tiles.

    python -m bench.peers --out $OUT         # writes peers.json under --out

Each peer is timed (bench.kernels.timed) on inputs already in its layout: the relayout copy is not counted, nor is
the one-off conversion of the selection. Records in `attention_runs` have bench.kernels' shape (run, rows, bucket,
ms, flops, effective_TFLOPs) plus keep, max_abs_err (against an fp32 torch reference of the same pattern on sampled
heads and rows) and max_abs_diff_vs_ours (every valid row and head, against our kernel's bf16 output). `flops` is
the pattern's exact useful work, the same number for every sparse run of one size, so effective TFLOP/s compare
directly; the dense row counts 4 S^2 H D.

Then the engine's entry point, `kernels.block_sparse_attn.block_sparse_attention(..., tile_indices=ti,
backend=...)`, end to end on our layout for backend "triton" and "cudnn" (runs "engine block_sparse_attention
backend=triton" / "... backend=cudnn": the cudnn number includes to_peer of q, k, v, the block lists and from_peer
into a `[B, S, H, D]` output), and, alone, the conversions ("peer layout conversion (q, k, v in, out back)") and
the block lists ("peer block lists (block_lists)"); those two records carry no FLOPs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
import traceback

import torch

from kernels.peer_layout import PeerLayout, block_lists, block_sizes, from_peer, peer_layout, to_peer
from kernels.tile_select import num_video_tiles

# --------------------------------------------------------------------------------------------- pure conversions
# The layout and the cuDNN block lists live in kernels/peer_layout.py (the engine's cudnn backend uses them too);
# the flash-attn-4 format, the FLOP count and the sampled reference stay here.


def fa4_block_tensors(tile_indices: torch.Tensor, lay: PeerLayout) -> dict[str, torch.Tensor]:
    """flash-attn-4's BlockSparseTensorsTorch fields for our selection: `block_lists` split into full key blocks
    (every key real: no mask_mod) and partial ones (the padded last sink block and last video tile: mask_mod keeps
    the real keys). Returns full_block_cnt / mask_block_cnt int32 `[B, H, n_blocks]` and full_block_idx int32
    `[B, H, n_blocks, n_blocks]`, mask_block_idx int32 `[B, H, n_blocks, 2]` (compact: at most two partial blocks)."""
    counts, index = block_lists(tile_indices, lay)
    full = (block_sizes(lay) == lay.tile).to(index.device)
    live = torch.arange(index.shape[-1], device=index.device) < counts[..., None]
    is_full = full[index.long()] & live
    is_mask = ~full[index.long()] & live
    # Stable compaction: the kept ids move to the front in their (ascending) order.
    full_idx = torch.gather(index, -1, torch.sort((~is_full).int(), dim=-1, stable=True).indices)
    mask_idx = torch.gather(index, -1, torch.sort((~is_mask).int(), dim=-1, stable=True).indices)[..., :2]
    full_cnt, mask_cnt = is_full.sum(-1).int(), is_mask.sum(-1).int()
    slot = torch.arange(index.shape[-1], device=index.device)
    full_idx = torch.where(slot < full_cnt[..., None], full_idx, 0)
    mask_idx = torch.where(slot[:2] < mask_cnt[..., None], mask_idx, 0)
    return {"full_block_cnt": full_cnt, "full_block_idx": full_idx.int(), "mask_block_cnt": mask_cnt,
            "mask_block_idx": mask_idx.int()}


def pattern_flops(tile_indices: torch.Tensor, video_start: int, valid_len: int, tile: int, head_dim: int) -> int:
    """Exact FLOPs (2 matmuls, 2 FLOPs a multiply-add) of our op for this selection: sink queries x all valid keys,
    each video query row x (sink keys + the real keys of its tile's selected tiles), over every batch and head."""
    B, H, n, _ = tile_indices.shape
    sizes = torch.full((n,), tile, dtype=torch.long)
    if n:
        sizes[-1] = valid_len - video_start - (n - 1) * tile
    keys = video_start + sizes[tile_indices.cpu().long()].sum(-1)  # [B, H, n] keys of each video query tile
    pairs = B * H * video_start * valid_len + (sizes * keys).sum().item()
    return 4 * head_dim * int(pairs)


def sample_rows(video_start: int, valid_len: int, tile: int = 64, n_tiles: int = 6, seed: int = 0) -> torch.Tensor:
    """Query rows to check: every sink row, the rows of the first, the last (partial) and `n_tiles` random video
    tiles. LongTensor, ascending."""
    n = num_video_tiles(video_start, valid_len, tile)
    g = torch.Generator().manual_seed(seed)
    tiles = {0, n - 1, *torch.randint(0, max(n, 1), (n_tiles,), generator=g).tolist()} if n else set()
    rows = [torch.arange(video_start)] + [torch.arange(video_start + t * tile, min(valid_len, video_start + (t + 1)
                                                                                    * tile)) for t in sorted(tiles)]
    return torch.cat(rows)


def sample_reference(q, k, v, *, video_start: int, valid_len: int, tile_indices: torch.Tensor, heads, rows,
                     tile: int = 64) -> torch.Tensor:
    """fp32 output of our op at query `rows` (all < valid_len) and `heads`: q, k, v `[B, S, H, D]` ->
    `[B, len(rows), len(heads), D]`. Softmax over exactly the allowed keys (gathered), scale 1/sqrt(D)."""
    B, D = q.shape[0], q.shape[-1]
    rows = torch.as_tensor(rows, dtype=torch.long, device=q.device)
    vt = torch.where(rows >= video_start, (rows - video_start) // tile, -1)
    out = torch.zeros(B, len(rows), len(heads), D, dtype=torch.float32, device=q.device)
    offs = torch.arange(tile, device=q.device)
    for b in range(B):
        for j, h in enumerate(heads):
            for t in vt.unique().tolist():
                sel = (vt == t).nonzero().flatten()
                if t < 0:
                    keys = torch.arange(valid_len, device=q.device)
                else:
                    cols = (video_start + tile_indices[b, h, t].to(q.device).long()[:, None] * tile + offs).flatten()
                    keys = torch.cat([torch.arange(video_start, device=q.device), cols[cols < valid_len]])
                kh, vh = k[b, keys, h].float(), v[b, keys, h].float()
                p = torch.softmax(q[b, rows[sel], h].float() @ kh.T / math.sqrt(D), dim=-1)
                out[b, sel, j] = p @ vh
    return out


# --------------------------------------------------------------------------------------------- peers (GPU)


def cudnn_bsa_runner(q, k, v, tile_indices, lay: PeerLayout):
    """fn() -> peer-layout output `[B, length, H, D]` via cudnn.BSA (bshd layout, SM90 blk64, variable counts)."""
    from cudnn import BSA

    counts, index = block_lists(tile_indices, lay)
    counts, index, sizes = counts.cuda(), index.cuda(), block_sizes(lay).cuda()
    qp, kp, vp = (to_peer(t, lay) for t in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1])

    def fn():
        return BSA.block_sparse_attention_forward(qp, kp, vp, index, block_sizes=sizes, q2k_block_nums=counts,
                                                  sparse_block_size=lay.tile, layout="bshd",
                                                  softmax_scale=scale)["o_tensor"]
    return fn


def fa4_mask_mod(lay: PeerLayout):
    """flash-attn-4 mask_mod (CuTe DSL) keeping the real keys of the peer layout (run on partial blocks only)."""
    import cutlass
    import cutlass.cute as cute
    from flash_attn.cute import utils

    sink_end, video_base, video_end = lay.video_start, lay.video_base, lay.video_end

    @cute.jit
    def real_key(batch, head, m_idx, n_idx, seqlen_info, aux_tensors):
        a = utils.scalar_to_ssa(sink_end, cutlass.Int32)
        b = utils.scalar_to_ssa(video_base, cutlass.Int32)
        c = utils.scalar_to_ssa(video_end, cutlass.Int32)
        return (n_idx < a) | ((n_idx >= b) & (n_idx < c))

    return real_key


def fa4_runner(q, k, v, tile_indices, lay: PeerLayout):
    """fn() -> peer-layout output `[B, length, H, D]` via flash_attn.cute.flash_attn_func with block sparsity."""
    from flash_attn.cute import flash_attn_func
    from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch

    t = {name: x.cuda() for name, x in fa4_block_tensors(tile_indices, lay).items()}
    bst = BlockSparseTensorsTorch(**t, block_size=(lay.tile, lay.tile))
    qp, kp, vp = (to_peer(x, lay) for x in (q, k, v))
    mask_mod, scale = fa4_mask_mod(lay), 1.0 / math.sqrt(q.shape[-1])

    def fn():
        out = flash_attn_func(qp, kp, vp, softmax_scale=scale, causal=False, mask_mod=mask_mod,
                              block_sparse_tensors=bst)
        return out[0] if isinstance(out, tuple) else out
    return fn


# name -> (run label, runner, configuration as recorded)
PEERS = {"cudnn_bsa": ("cuDNN frontend BSA blk64 (cudnn.BSA)", cudnn_bsa_runner,
                       "sparse_block_size 64, q2k_block_nums (variable counts), block_sizes, kv_splits 1, bshd"),
         "fa4": ("flash-attn-4 block-sparse forward", fa4_runner,
                 "block_size (64, 64), full blocks + partial blocks with mask_mod, bshd")}


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "triton", "nvidia-cudnn-frontend", "flash-attn-4", "nvidia-cutlass-dsl",
                 "nvidia-cutlass-dsl-libs-cu13", "quack-kernels", "apache-tvm-ffi", "nvidia-cudnn-cu13"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


# --------------------------------------------------------------------------------------------- main


def run_size(S: int, keep: float, names: list[str], res: dict, say) -> None:
    """Our kernel, dense cuDNN and each peer at S rows on one set of q/k/v and one selection."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from bench.kernels import D, H, attn_flops, layout, timed
    from kernels import block_sparse_attn as bsa
    from kernels import tile_select as sel

    bucket = -(-S // 64) * 64
    video_start, _ = layout(S)
    lay = peer_layout(video_start, S)
    torch.manual_seed(S)
    q, k, v = (torch.randn(1, bucket, H, D, device="cuda").bfloat16() for _ in range(3))
    ti = sel.select_tiles(q, k, video_start, S, keep)
    flops = pattern_flops(ti, video_start, S, 64, D)
    heads, rows = [0, H // 2, H - 1], sample_rows(video_start, S)
    ref = sample_reference(q, k, v, video_start=video_start, valid_len=S, tile_indices=ti, heads=heads, rows=rows)
    geometry = {"video_start": video_start, "n_video_tiles": ti.shape[2], "k_keep": ti.shape[-1],
                "peer_length": lay.length, "checked_heads": heads, "checked_rows": len(rows)}
    res.setdefault("geometry", {})[S] = geometry

    def err(o):  # o: our layout [1, >= S, H, D]
        return (o[:, rows.cuda()][:, :, heads].float() - ref).abs().max().item()

    def record(run, bucket_, ms, flops_, **extra):
        r = {"run": run, "rows": S, "bucket": bucket_, "ms": ms, "flops": flops_,
             "effective_TFLOPs": None if flops_ is None else flops_ / (ms * 1e-3) / 1e12, **extra}
        res["attention_runs"].append(r)
        say(json.dumps(r))

    def failed(name, label, bucket_, exc):
        say(f"{name} S={S}: FAILED {type(exc).__name__}: {exc}")
        res["errors"][f"{name}_{S}"] = traceback.format_exc()[-4000:]
        res["attention_runs"].append({"run": label, "rows": S, "bucket": bucket_, "ms": None,
                                      "error": f"{type(exc).__name__}: {str(exc)[:500]}"})

    out = torch.empty_like(q)
    bsa._launch_attention(q, k, v, out, video_start, S, 64, ti)
    ours = out[:, :S]
    record("ours block-sparse (kernel only)", bucket,
           timed(lambda: bsa._launch_attention(q, k, v, out, video_start, S, 64, ti)), flops, keep=keep,
           max_abs_err=err(out))

    def ours_with_selection():
        return bsa.block_sparse_attention(q, k, v, video_start=video_start, valid_len=S, keep_ratio=keep)

    record("ours block-sparse (with selection)", bucket, timed(ours_with_selection), flops, keep=keep,
           max_abs_err=err(ours_with_selection()))
    if "dense" in names:
        qd, kd, vd = (t[:, :S].transpose(1, 2).contiguous() for t in (q, k, v))  # [1, H, S, D], unpadded

        def dense():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return torch.nn.functional.scaled_dot_product_attention(qd, kd, vd)

        record("cudnn dense (SDPA)", S, timed(dense, target_ms=1500, warmup=1), attn_flops(S), keep=1.0,
               max_abs_err=None)
        del qd, kd, vd
    for name in names:
        if name not in PEERS:
            continue
        label, make, config = PEERS[name]
        try:
            fn = make(q, k, v, ti, lay)
            t0 = time.time()
            o = fn()
            torch.cuda.synchronize()
            first = time.time() - t0
            mine = from_peer(o, lay)
            record(label, lay.length, timed(fn), flops, keep=keep, max_abs_err=err(mine),
                   max_abs_diff_vs_ours=(mine.float() - ours.float()).abs().max().item(), first_call_s=first,
                   config=config)
            del fn, o, mine
        except Exception as exc:  # noqa: BLE001 - a peer that fails is recorded; the others still run
            failed(name, label, lay.length, exc)
        torch.cuda.empty_cache()
    run_engine(q, k, v, ti, lay, ours, keep, flops, record, failed, err)


def run_engine(q, k, v, ti, lay, ours, keep, flops, record, failed, err) -> None:
    """The engine's entry point end to end on our layout, per backend (issue 17 item 2's switch): the cudnn number
    includes the copies into and out of the peer layout and the block lists; both take the same `tile_indices`,
    so neither includes the selection. Then the conversions alone."""
    from bench.kernels import timed
    from kernels import block_sparse_attn as bsa

    S, bucket, video_start = lay.valid_len, q.shape[1], lay.video_start
    for backend in ("triton", "cudnn"):
        label = f"engine block_sparse_attention backend={backend}"
        try:
            def fn(backend=backend):
                return bsa.block_sparse_attention(q, k, v, video_start=video_start, valid_len=S, keep_ratio=keep,
                                                  tile_indices=ti, backend=backend)
            t0 = time.time()
            o = fn()
            torch.cuda.synchronize()
            first = time.time() - t0
            extra = {} if backend == "triton" else {
                "max_abs_diff_vs_ours": (o[:, :S].float() - ours.float()).abs().max().item()}
            record(label, bucket, timed(fn), flops, keep=keep, max_abs_err=err(o), **extra,
                   padding_rows_zero=bool((o[:, S:] == 0).all()), first_call_s=first)
            del o
        except Exception as exc:  # noqa: BLE001 - a backend that fails is recorded; the run goes on
            failed(f"engine_{backend}", label, bucket, exc)
        torch.cuda.empty_cache()
    label = "peer layout conversion (q, k, v in, out back)"
    try:
        def convert():
            qp, kp, vp = (to_peer(t, lay) for t in (q, k, v))
            return from_peer(qp, lay, seq_len=bucket)  # qp stands in for the output: same shape and dtype
        moved = 2 * 4 * S * q.shape[0] * q.shape[2] * q.shape[3] * q.element_size()  # 4 tensors read + written
        ms = timed(convert)
        record(label, lay.length, ms, None, bytes_moved=moved, GB_per_s=moved / (ms * 1e-3) / 1e9)
    except Exception as exc:  # noqa: BLE001
        failed("peer_conversion", label, lay.length, exc)
    label = "peer block lists (block_lists)"
    try:
        ms = timed(lambda: block_lists(ti, lay))  # what a fresh build costs (the cudnn backend now keeps the buffers)
        record(label, lay.length, ms, None, index_bytes=4 * ti.shape[0] * ti.shape[1] * lay.n_blocks ** 2)
    except Exception as exc:  # noqa: BLE001
        failed("peer_block_lists", label, lay.length, exc)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--sizes", default="37760,104016")
    ap.add_argument("--keep", type=float, default=0.1)
    ap.add_argument("--peers", default="cudnn_bsa,fa4,dense", help="comma list of cudnn_bsa, fa4, dense")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    names = [n for n in args.peers.split(",") if n]
    log: list[str] = []
    res: dict = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
                 "capability": list(torch.cuda.get_device_capability()), "versions": versions(), "imports": {},
                 "command": "python -m bench.peers " + " ".join(sys.argv[1:] if argv is None else argv),
                 "attention_runs": [], "errors": {}, "log": log}

    def say(msg):
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        log.append(line)

    def save():
        with open(os.path.join(args.out, "peers.json"), "w") as f:
            json.dump(res, f, indent=1, default=str)

    for name, module in (("cudnn_bsa", "cudnn.block_sparse_attention"), ("fa4", "flash_attn.cute")):
        try:
            __import__(module)
            res["imports"][name] = "ok"
        except Exception as exc:  # noqa: BLE001 - the import error text is the result for a missing peer
            res["imports"][name] = f"{type(exc).__name__}: {exc}"
            res["errors"][f"import_{name}"] = traceback.format_exc()[-4000:]
            names = [n for n in names if n != name]
        say(f"import {name}: {res['imports'][name]}")
    save()
    for S in (int(s) for s in args.sizes.split(",")):
        try:
            with torch.no_grad():
                run_size(S, args.keep, names, res, say)
        except Exception as exc:  # noqa: BLE001 - one size failing still leaves the other's records
            say(f"S={S}: FAILED {type(exc).__name__}: {exc}")
            res["errors"][f"size_{S}"] = traceback.format_exc()[-4000:]
        save()
        torch.cuda.empty_cache()
    say("done")
    save()


if __name__ == "__main__":
    main()

"""The sparse-attention backend switch (issue 17 item 2) on CPU: kernels/peer_layout.py's slice-copy conversions
against index-based definitions, kernels/bsa_cudnn.py's availability reasons and its plumbing through a stand-in
for cudnn.BSA, and block_sparse_attention's backend choice (GPU path simulated by monkeypatching). The real
cudnn.BSA runs only under the gpu marker."""

from __future__ import annotations

import math
import types

import pytest
import torch

from kernels import block_sparse_attn as bsa
from kernels import bsa_cudnn
from kernels.peer_layout import from_peer, peer_layout, peer_rows, to_peer
from kernels.tile_select import select_tiles_reference

# (video_start, valid_len, tile): sink and last video tile partial / aligned / absent, no video at all
CASES = [(37, 300, 16), (32, 288, 16), (0, 100, 16), (50, 50 + 16 * 5, 16), (17, 20, 16), (40, 163, 32),
         (464, 2000, 64), (30, 30, 16)]


# ------------------------------------------------------------------------------------------- index references


def to_peer_by_index(x, lay):
    """The definition: zeros, then our valid rows scattered to their peer rows."""
    y = torch.zeros(x.shape[0], lay.length, *x.shape[2:], dtype=x.dtype)
    y[:, peer_rows(lay)] = x[:, :lay.valid_len]
    return y


def from_peer_by_index(y, lay, S):
    """The definition: our valid rows gathered from their peer rows, zeros from valid_len to S."""
    out = torch.zeros(y.shape[0], S, *y.shape[2:], dtype=y.dtype)
    out[:, :lay.valid_len] = y[:, peer_rows(lay)]
    return out


@pytest.mark.parametrize("vs,valid_len,tile", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conversions_equal_the_index_definitions(vs, valid_len, tile, dtype):
    lay = peer_layout(vs, valid_len, tile)
    g = torch.Generator().manual_seed(vs + valid_len)
    S = valid_len + 7
    x = torch.randn(2, S, 3, 8, generator=g).to(dtype)
    x[:, valid_len:] = float("nan")  # rows past valid_len are never read
    y = to_peer(x, lay)
    assert y.shape == (2, lay.length, 3, 8) and y.dtype == dtype
    assert torch.equal(y, to_peer_by_index(x, lay))
    garbage = torch.randn(2, lay.length, 3, 8, generator=g).to(dtype)
    garbage[:, ~torch.isin(torch.arange(lay.length), peer_rows(lay))] = float("nan")  # padding rows are not read
    assert torch.equal(from_peer(garbage, lay), garbage[:, peer_rows(lay)])  # default: our valid rows only
    assert torch.equal(from_peer(garbage, lay, seq_len=S), from_peer_by_index(garbage, lay, S))
    out = torch.full((2, S, 3, 8), float("nan"), dtype=dtype)  # preallocated, garbage in the padding rows
    assert from_peer(garbage, lay, out=out) is out
    assert torch.equal(out, from_peer_by_index(garbage, lay, S))
    assert torch.equal(from_peer(to_peer(x, lay), lay), x[:, :valid_len])


def test_conversions_refuse_wrong_shapes():
    lay = peer_layout(37, 300, 16)
    with pytest.raises(ValueError):
        to_peer(torch.zeros(1, 299, 2, 8), lay)
    with pytest.raises(ValueError):
        from_peer(torch.zeros(1, lay.length - 16, 2, 8), lay)
    with pytest.raises(ValueError):
        from_peer(torch.zeros(1, lay.length, 2, 8), lay, out=torch.zeros(1, 299, 2, 8))


# ------------------------------------------------------------------------------------------- availability


def fake_q(**kw):
    base = dict(is_cuda=True, device=torch.device("cuda", 0), dtype=torch.bfloat16, shape=(1, 256, 2, 128))
    return types.SimpleNamespace(**{**base, **kw})


@pytest.fixture
def bsa_importable(monkeypatch):
    monkeypatch.setattr(bsa_cudnn, "_IMPORT", {"module": object()})
    monkeypatch.setattr(bsa_cudnn, "_capability", lambda device: (9, 0))


def test_unavailable_reasons(bsa_importable, monkeypatch):
    assert bsa_cudnn.cudnn_bsa_unavailable(fake_q(), 64) is None
    assert bsa_cudnn.cudnn_bsa_unavailable(fake_q(dtype=torch.float16, shape=(2, 64, 1, 96)), 64) is None
    assert "CUDA" in bsa_cudnn.cudnn_bsa_unavailable(torch.zeros(1, 64, 1, 64, dtype=torch.bfloat16), 64)
    assert "float32" in bsa_cudnn.cudnn_bsa_unavailable(fake_q(dtype=torch.float32), 64)
    assert "head_dim" in bsa_cudnn.cudnn_bsa_unavailable(fake_q(shape=(1, 256, 2, 80)), 64)
    assert "tile is 32" in bsa_cudnn.cudnn_bsa_unavailable(fake_q(), 32)
    monkeypatch.setattr(bsa_cudnn, "_capability", lambda device: (10, 0))
    assert "10.0" in bsa_cudnn.cudnn_bsa_unavailable(fake_q(), 64)
    monkeypatch.setattr(bsa_cudnn, "_IMPORT", {"error": "ModuleNotFoundError: No module named 'cudnn'"})
    reason = bsa_cudnn.cudnn_bsa_unavailable(fake_q(), 64)
    assert "not importable" in reason and "No module named 'cudnn'" in reason


# ------------------------------------------------------------------------------------------- backend choice


def test_resolve_backend(monkeypatch):
    monkeypatch.delenv(bsa.BACKEND_ENV, raising=False)
    assert bsa.resolve_backend() == "auto" == bsa.DEFAULT_BACKEND
    assert bsa.resolve_backend("auto") == "auto"
    monkeypatch.setenv(bsa.BACKEND_ENV, "cudnn")
    assert bsa.resolve_backend() == "cudnn"
    assert bsa.resolve_backend("triton") == "triton"  # an explicit argument wins over the environment
    with pytest.raises(ValueError, match="triton, cudnn, auto"):
        bsa.resolve_backend("flash")
    monkeypatch.setenv(bsa.BACKEND_ENV, "cuDNN")
    with pytest.raises(ValueError, match=bsa.BACKEND_ENV):
        bsa.resolve_backend()


def qkv(S=300, H=2, D=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, S, H, D, generator=g).to(dtype) for _ in range(3))


@pytest.mark.parametrize("backend", ["triton", "cudnn", "auto", None])
def test_cpu_tensors_run_the_reference_whatever_the_backend(backend, monkeypatch):
    monkeypatch.setenv(bsa.BACKEND_ENV, "cudnn")
    q, k, v = qkv()
    got = bsa.block_sparse_attention(q, k, v, video_start=37, valid_len=290, keep_ratio=0.3, tile=16,
                                     backend=backend)
    ref = bsa.block_sparse_attention_reference(q, k, v, video_start=37, valid_len=290, keep_ratio=0.3, tile=16)
    assert torch.equal(got, ref)


def test_bad_backend_name_raises_value_error():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="not one of triton, cudnn, auto"):
        bsa.block_sparse_attention(q, k, v, video_start=37, valid_len=290, keep_ratio=0.3, tile=16, backend="fa4")


@pytest.fixture
def gpu_path(monkeypatch):
    """Pretend these CPU tensors are on the GPU path; both backends become spies that say which one ran."""
    calls = {"triton": 0, "cudnn": 0, "select": 0, "cudnn_ti": None}
    real_select = bsa.select_tiles

    def select(*a, **kw):
        calls["select"] += 1
        return real_select(*a, **kw)

    def launch(q, k, v, out, video_start, valid_len, tile, tile_indices):
        calls["triton"] += 1
        return out.fill_(1.0)

    def cudnn(q, k, v, *, video_start, valid_len, tile_indices, tile=64):
        calls["cudnn"] += 1
        calls["cudnn_ti"] = tile_indices
        return torch.full_like(q, 2.0)

    monkeypatch.delenv(bsa.BACKEND_ENV, raising=False)
    monkeypatch.setattr(bsa, "triton_path", lambda x: True)
    monkeypatch.setattr(bsa, "select_tiles", select)
    monkeypatch.setattr(bsa, "_launch_attention", launch)
    monkeypatch.setattr(bsa_cudnn, "cudnn_block_sparse_attention", cudnn)
    monkeypatch.setattr(bsa_cudnn, "cudnn_bsa_unavailable", lambda q, tile: calls.get("reason"))
    return calls


def run(backend=None, strict=True, **kw):
    q, k, v = qkv(S=320)
    return bsa.block_sparse_attention(q, k, v, video_start=64, valid_len=320, keep_ratio=0.3, tile=64,
                                      backend=backend, strict=strict, **kw)


@pytest.mark.parametrize("backend,reason,ran", [("triton", None, "triton"), ("triton", "no", "triton"),
                                                ("cudnn", None, "cudnn"), ("auto", None, "cudnn"),
                                                ("auto", "cudnn.BSA is not importable", "triton"),
                                                (None, None, "cudnn"), (None, "no", "triton")])
def test_backend_choice_on_the_gpu_path(gpu_path, backend, reason, ran):
    gpu_path["reason"] = reason
    out = run(backend)
    assert out.unique().item() == {"triton": 1.0, "cudnn": 2.0}[ran]
    assert (gpu_path["triton"], gpu_path["cudnn"]) == ((1, 0) if ran == "triton" else (0, 1))
    assert gpu_path["select"] == 1  # our selection, once, for either backend


def test_cudnn_gets_our_selection(gpu_path):
    run("cudnn")
    q, k, _ = qkv(S=320)
    assert torch.equal(gpu_path["cudnn_ti"], select_tiles_reference(q, k, 64, 320, 0.3, 64))
    ti = torch.zeros(1, 2, 4, 2, dtype=torch.long)
    run("cudnn", tile_indices=ti)
    assert gpu_path["cudnn_ti"] is ti and gpu_path["select"] == 1


def test_env_switches_the_default(gpu_path, monkeypatch):
    monkeypatch.setenv(bsa.BACKEND_ENV, "cudnn")
    run()
    assert (gpu_path["triton"], gpu_path["cudnn"]) == (0, 1)
    run("triton")
    assert (gpu_path["triton"], gpu_path["cudnn"]) == (1, 1)
    monkeypatch.setenv(bsa.BACKEND_ENV, "auto")
    gpu_path["reason"] = "compute capability 8.0"
    run()
    assert (gpu_path["triton"], gpu_path["cudnn"]) == (2, 1)


def test_cudnn_unavailable_is_loud_when_strict(gpu_path):
    gpu_path["reason"] = "cudnn.BSA takes head_dim 64, 96 or 128, q has 16"
    with pytest.raises(bsa.KernelUnavailable, match="head_dim 64, 96 or 128, q has 16"):
        run("cudnn")
    assert gpu_path["triton"] == gpu_path["cudnn"] == 0
    assert run("cudnn", strict=False).unique().item() == 1.0  # not strict: our kernel, never dense


def test_cudnn_failure_is_loud_when_strict(gpu_path, monkeypatch):
    def broken(*a, **kw):
        raise RuntimeError("CuTe DSL compile error")

    monkeypatch.setattr(bsa_cudnn, "cudnn_block_sparse_attention", broken)
    with pytest.raises(bsa.KernelUnavailable, match="CuTe DSL compile error"):
        run("cudnn")
    gpu_path["select"] = 0
    assert run("cudnn", strict=False).unique().item() == 1.0
    assert gpu_path["select"] == 1  # the fallback reuses the selection
    # "auto" (the default) has ours as its fallback even when strict: cudnn failed, our kernel ran
    assert run("auto").unique().item() == 1.0 and run().unique().item() == 1.0


def test_planned_backend(gpu_path, monkeypatch):
    """What the engine records: "cudnn" only where the call would run it, "reference" off the GPU path."""
    assert bsa.planned_backend("cpu", torch.bfloat16, 128) == "cudnn"  # the spies: GPU path, cudnn available
    gpu_path["reason"] = "compute capability 8.0"
    assert bsa.planned_backend("cpu", torch.bfloat16, 128) == "triton"
    assert bsa.planned_backend("cpu", torch.bfloat16, 128, backend="cudnn") == "cudnn"
    monkeypatch.setattr(bsa, "triton_path", lambda x: False)
    assert bsa.planned_backend("cpu", torch.bfloat16, 128) == "reference"
    monkeypatch.setenv(bsa.BACKEND_ENV, "flash")  # refused at load even where the reference runs
    with pytest.raises(ValueError, match="H3_SPARSE_BACKEND 'flash' is not one of triton, cudnn, auto"):
        bsa.planned_backend("cpu", torch.bfloat16, 128)


def test_a_cudnn_served_sparse_tier_is_its_own_configuration():
    """Its pixels differ from our kernel's, so its tier config (hence configuration key) does too; dense tiers and
    our kernels keep the configs they always had."""
    from engine.interface import task_tier_config
    from engine.request import GenerationRequest
    from engine.tiers import TierTable

    tiers = TierTable.load()
    request = GenerationRequest(prompt="a red circle moves left to right", tier="sol")
    sol, baseline = tiers.get("sol").to_dict(), tiers.get("baseline").to_dict()
    assert task_tier_config(sol, request, "cudnn") == {**sol, "sparse_kernel": "cudnn"}
    for kernel in ("triton", "reference", None):
        assert task_tier_config(sol, request, kernel) == sol
    assert task_tier_config(baseline, request, "cudnn") == baseline


def test_cudnn_without_cuda_raises_the_real_reason(monkeypatch):
    """No spy on the availability check: on this CUDA-less machine a GPU-path tensor can not run cudnn.BSA."""
    monkeypatch.setattr(bsa, "triton_path", lambda x: True)
    q, k, v = qkv(S=320, D=64, dtype=torch.bfloat16)
    reason = bsa_cudnn.cudnn_bsa_unavailable(q, 64)
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine; the reason would not be about this tensor")
    assert reason is not None
    with pytest.raises(bsa.KernelUnavailable) as info:
        bsa.block_sparse_attention(q, k, v, video_start=64, valid_len=320, keep_ratio=0.3, backend="cudnn")
    assert reason in str(info.value)


# ------------------------------------------------------------------------------------------- cudnn plumbing


class FakeBSA:
    """Stands in for cudnn.BSA: computes what its docs say block_sparse_attention_forward computes (bshd layout,
    per query block the first q2k_block_nums ids of q2k_block_index, the first block_sizes keys of each block), in
    the input dtype, and records the keyword arguments."""

    calls: list = []

    @classmethod
    def block_sparse_attention_forward(cls, q, k, v, index, *, block_sizes, q2k_block_nums, sparse_block_size,
                                       layout, softmax_scale):
        cls.calls.append(dict(length=q.shape[1], sparse_block_size=sparse_block_size, layout=layout,
                              softmax_scale=softmax_scale))
        B, L, H, _ = q.shape
        t = sparse_block_size
        nb = L // t
        assert L % t == 0 and index.dtype == q2k_block_nums.dtype == block_sizes.dtype == torch.int32
        live = (torch.arange(nb) < q2k_block_nums[..., None]).int()
        blocks = torch.zeros(B, H, nb, nb, dtype=torch.int32).scatter_add_(-1, index.long(), live) > 0
        real = (torch.arange(t) < block_sizes[:, None]).flatten()
        mask = blocks.repeat_interleave(t, -2).repeat_interleave(t, -1) & real
        qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
        s = (qh @ kh.transpose(-1, -2) * softmax_scale).masked_fill(~mask, float("-inf"))
        return {"o_tensor": (torch.softmax(s, -1) @ vh).transpose(1, 2), "lse_tensor": None}


@pytest.mark.parametrize("vs,valid_len,S", [(37, 300, 320), (64, 64 + 64 * 4, 64 * 6), (0, 130, 140),
                                            (100, 100, 128)])
def test_cudnn_wrapper_equals_the_reference(vs, valid_len, S, monkeypatch):
    monkeypatch.setattr(bsa_cudnn, "_IMPORT", {"module": FakeBSA})
    FakeBSA.calls = []
    g = torch.Generator().manual_seed(S)
    q, k, v = (torch.randn(2, S, 3, 16, generator=g, dtype=torch.float64) for _ in range(3))
    for x in (q, k, v):
        x[:, valid_len:] = float("nan")  # padding garbage must not leak
    ti = select_tiles_reference(q, k, vs, valid_len, 0.4, 64)
    got = bsa_cudnn.cudnn_block_sparse_attention(q, k, v, video_start=vs, valid_len=valid_len, tile_indices=ti)
    ref = bsa.block_sparse_attention_reference(q, k, v, video_start=vs, valid_len=valid_len, keep_ratio=0.4,
                                               tile_indices=ti)
    assert got.shape == q.shape and (got - ref).abs().max() < 1e-12
    assert (got[:, valid_len:] == 0).all()
    lay = peer_layout(vs, valid_len)
    assert FakeBSA.calls == [dict(length=lay.length, sparse_block_size=64, layout="bshd",
                                  softmax_scale=1 / math.sqrt(16))]
    # and through the engine's entry point, our selection included
    monkeypatch.setattr(bsa, "triton_path", lambda x: True)
    monkeypatch.setattr(bsa_cudnn, "cudnn_bsa_unavailable", lambda q, tile: None)
    out = bsa.block_sparse_attention(q, k, v, video_start=vs, valid_len=valid_len, keep_ratio=0.4, backend="auto")
    assert (out - ref).abs().max() < 1e-12


# ------------------------------------------------------------------------------------------- the real thing


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cudnn_backend_on_the_gpu():
    q0 = torch.zeros(1, 64, 1, 128, device="cuda", dtype=torch.bfloat16)
    reason = bsa_cudnn.cudnn_bsa_unavailable(q0, 64)
    if reason is not None:
        pytest.skip(reason)
    vs, valid_len, S = 464, 464 + 64 * 40 + 17, 464 + 64 * 41 + 30
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, S, 4, 128, device="cuda").bfloat16() for _ in range(3))
    ti = bsa.select_tiles(q, k, vs, valid_len, 0.1)
    kw = dict(video_start=vs, valid_len=valid_len, keep_ratio=0.1, tile_indices=ti)
    ours = bsa.block_sparse_attention(q, k, v, backend="triton", **kw)
    theirs = bsa.block_sparse_attention(q, k, v, backend="cudnn", **kw)
    ref = bsa.block_sparse_attention_reference(q.float(), k.float(), v.float(), **kw)
    assert (theirs.float() - ref).abs().max() < 2e-2
    assert (theirs.float() - ours.float()).abs().max() < 2e-2
    assert (theirs[:, valid_len:] == 0).all()


def test_reused_block_lists_equal_fresh_ones():
    """The cuDNN backend's kept buffers hold, call after call, exactly what block_lists builds afresh: new
    selections on one layout, then another layout, then the first again."""
    from kernels.peer_layout import block_lists, peer_layout

    g = torch.Generator().manual_seed(3)
    for video_start, valid_len in ((100, 1000), (100, 1000), (64, 700), (100, 1000)):
        lay = peer_layout(video_start, valid_len, 64)
        for _ in range(2):
            n = lay.n_video_tiles
            ti = torch.stack([torch.randperm(n, generator=g)[:4] for _ in range(2 * 3 * n)]).view(2, 3, n, 4)
            got, want = bsa_cudnn.block_lists_reused(ti, lay), block_lists(ti, lay)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_cli_refuses_a_bad_backend_name(monkeypatch, capsys):
    """A typo in $H3_SPARSE_BACKEND is an error naming it, exit 2, not a traceback (found when the engine plans its
    kernels: at load, on CPU too)."""
    from engine.__main__ import main

    monkeypatch.setenv(bsa.BACKEND_ENV, "cuDNN")
    assert main(["info"]) == 2
    assert "H3_SPARSE_BACKEND 'cuDNN' is not one of triton, cudnn, auto" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- the registry (issue 41)


def test_no_backend_name_is_spelled_in_the_engine():
    """The engine reads the backends from kernels/sparse_backends.py: no registered backend's name appears in engine/
    as a string literal (nor a selectable one as a word), so a new backend touches kernels/ only."""
    import re
    from pathlib import Path

    from kernels import sparse_backends

    names = list(sparse_backends.registry())
    assert {"triton", "cudnn", "reference"} <= set(names)
    engine_dir = Path(__file__).resolve().parents[1] / "engine"
    found = []
    for path in sorted(engine_dir.rglob("*.py")):
        text = path.read_text()
        for name, backend in sparse_backends.registry().items():
            pattern = rf"[\"']{name}[\"']" + (rf"|\b{name}\b" if backend.selectable else "")
            found += [f"{path.name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group()}"
                      for m in re.finditer(pattern, text)]
    assert not found, found


def test_each_backend_declares_its_probe_memory_and_pixels():
    from kernels import sparse_backends

    for name, backend in sparse_backends.registry().items():
        assert backend.name == name and backend.summary
        assert backend.extra_bytes(1000, 4, 64, 2) >= 0
        assert isinstance(backend.same_pixels, bool)
    cudnn, triton = sparse_backends.get("cudnn"), sparse_backends.get("triton")
    assert not cudnn.same_pixels and triton.same_pixels and sparse_backends.get("reference").same_pixels
    assert sparse_backends.ours() is triton and sparse_backends.off_gpu().name == "reference"
    assert [b.name for b in sparse_backends.auto_order()] == ["cudnn", "triton"]
    assert sparse_backends.choices() == ("triton", "cudnn", "auto") == bsa.BACKENDS
    # the memory plan's former inline figure for cuDNN (engine/footprint.py before issue 41), heads 48 × 128 at bf16
    for rows in (1, 64, 37_760, 104_016):
        blocks = math.ceil(rows / 64) + 1
        assert cudnn.extra_bytes(rows, 48, 128, 2) == 5 * rows * 48 * 128 * 2 + 48 * blocks * blocks * 4
        assert triton.extra_bytes(rows, 48, 128, 2) == 0
    with pytest.raises(ValueError, match="registered: triton, cudnn, reference"):
        sparse_backends.get("flash")
    with pytest.raises(ValueError, match="already registered"):
        sparse_backends.register(cudnn)


@pytest.fixture
def toy_backend(monkeypatch):
    """A backend registered as data only (pixels differ, 1 MB extra, first for auto), whose call returns 3s."""
    from kernels import sparse_backends

    calls = []

    def run(q, k, v, *, video_start, valid_len, tile_indices, tile):
        calls.append(tile_indices)
        return torch.full_like(q, 3.0)

    toy = sparse_backends.SparseBackend("toy", "a test backend", lambda q, tile: None,
                                        lambda rows, heads, head_dim, size: 2**20, same_pixels=False, auto_rank=-1,
                                        run=run)
    monkeypatch.setitem(sparse_backends._REGISTRY, "toy", toy)
    return calls


def test_a_registered_backend_is_chosen_run_recorded_and_planned_for(toy_backend, gpu_path):
    """Adding a backend is one registry entry: a call, "auto", the plan, the clip's config and the memory plan all
    take it from there."""
    from engine.interface import task_tier_config
    from engine.request import GenerationRequest
    from engine.tiers import TierTable
    from kernels import sparse_backends

    assert "toy" in sparse_backends.choices() and bsa.resolve_backend("toy") == "toy"
    assert run("toy").unique().item() == 3.0 and len(toy_backend) == 1
    assert gpu_path["select"] == 1  # our selection, handed to it
    assert run("auto").unique().item() == 3.0  # first by auto_rank, available
    assert run("triton").unique().item() == 1.0
    assert bsa.planned_backend("cpu", torch.bfloat16, 128) == "toy"
    sol = TierTable.load().get("sol").to_dict()
    request = GenerationRequest(prompt="a red circle moves left to right", tier="sol")
    assert task_tier_config(sol, request, "toy") == {**sol, "sparse_kernel": "toy"}


def test_the_memory_plan_adds_the_backends_extra_bytes(toy_backend):
    from engine.components import NANO_PATH
    from engine.footprint import geometry_of, request_cost

    geometry = geometry_of(NANO_PATH, {"canvas_short_edge": 128, "canvas_max_pixels": 128 * 224})
    plain = request_cost(NANO_PATH, geometry, 5.0, 16, dtype=torch.float32)
    toy = request_cost(NANO_PATH, geometry, 5.0, 16, dtype=torch.float32, sparse_kernel="toy")
    ours = request_cost(NANO_PATH, geometry, 5.0, 16, dtype=torch.float32, sparse_kernel="triton")
    assert toy.denoise - plain.denoise == 2**20 and ours.denoise == plain.denoise
    assert (toy.encode, toy.decode, toy.exchange) == (plain.encode, plain.decode, plain.exchange)


def test_the_engine_argument_wins_over_the_environment(gpu_path, monkeypatch):
    from engine.interface import sparse_kernel_of

    config = types.SimpleNamespace(attention_head_dim=128)
    components = types.SimpleNamespace(device="cpu", dtype=torch.bfloat16, transformer=types.SimpleNamespace(
        config=config), geometry=types.SimpleNamespace(sparse_tile=64))
    monkeypatch.setenv(bsa.BACKEND_ENV, "cudnn")
    assert sparse_kernel_of(components) == "cudnn"  # the environment: the fallback
    assert sparse_kernel_of(components, "triton") == "triton"  # the engine argument
    monkeypatch.setenv(bsa.BACKEND_ENV, "flash")  # a bad environment does not matter when the argument names one
    assert sparse_kernel_of(components, "triton") == "triton"


def test_the_engine_passes_its_choice_to_every_sparse_call(nano_engine, monkeypatch):
    """`Engine(sparse_backend=...)` reaches kernels/block_sparse_attn.py on each sparse block (on this CPU it runs
    the reference whatever the choice), and a bad name is refused when the engine is made."""
    from engine.engine import Engine
    from kernels import block_sparse_attn
    from kernels.errors import BackendNameError

    with pytest.raises(BackendNameError, match="'flash' is not one of triton, cudnn, auto"):
        Engine(nano_engine.components, sparse_backend="flash")
    seen = []
    real = block_sparse_attn.block_sparse_attention

    def spy(*args, **kwargs):
        seen.append(kwargs.get("backend"))
        return real(*args, **kwargs)

    monkeypatch.setattr(block_sparse_attn, "block_sparse_attention", spy)
    monkeypatch.setattr(nano_engine, "sparse_backend", "triton")
    nano_engine.latents({"prompt": "a red circle", "tier": "turbo-sparse", "steps": 2, "short_edge": 32,
                         "duration_seconds": 14, "force": True})
    assert seen and set(seen) == {"triton"}


def test_the_server_flag_names_the_engines_backend(monkeypatch):
    import app
    from engine.engine import Engine

    assert app.parse_args([]).sparse_backend is None  # then $H3_SPARSE_BACKEND, else auto
    assert app.parse_args(["--sparse-backend", "triton"]).sparse_backend == "triton"
    with pytest.raises(SystemExit):
        app.parse_args(["--sparse-backend", "flash"])
    loaded = []
    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, **kwargs: loaded.append(kwargs)))
    app.engine_loader(None, None, 1, "cudnn")()
    assert loaded == [{"model_path": None, "tiers_file": None, "sparse_backend": "cudnn"}]

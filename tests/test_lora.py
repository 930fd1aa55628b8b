"""engine.lora against diffusers' own LoRA path on the h3-nano transformer (fp32, CPU).

The reference ("native") output loads the same adapter with diffusers: `MiniMaxH3LoraLoaderMixin.lora_state_dict` (the
converter the pipeline uses, which folds alphas and renames original-checkpoint keys) -> `load_lora_adapter` -> forward
with `attention_kwargs={"scale": s}`. Ours must match it to 1e-5.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from engine.hooks import has_hook
from engine.lora import LORA_HOOK, LoraAdapter, LoraError, LoraReport, inspect_lora, load_lora

diffusers = pytest.importorskip("diffusers")
from diffusers import MiniMaxH3Transformer3DModel  # noqa: E402

from engine.nano_config import NANO_TRANSFORMER  # noqa: E402
from tests import lora_fixtures  # noqa: E402
from tests.lora_fixtures import TINY_TRANSFORMER  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "assets" / "loras"
ASSETS = lora_fixtures.write_fixture_loras(Path(tempfile.mkdtemp(prefix="h3_lora_fixtures_")))  # random, two formats
TOL = 1e-5
RANK = 4
BLOCK_TARGETS = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2")
NANO_LINEARS = 28  # 5 stand-alone + refiner 6 + 2 blocks x 7 + norm_out + 2 heads (see test_total_layers_count)


# ---------------------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------------------


def make_nano() -> MiniMaxH3Transformer3DModel:
    """The tiny config the format tests count layers on (the shipped nano is larger: see the shipped-LoRA test)."""
    torch.manual_seed(0)
    return MiniMaxH3Transformer3DModel(**TINY_TRANSFORMER).eval()


def packed_inputs() -> dict[str, torch.Tensor]:
    """One packed t2va layout `[text | audio | video]`: 3 text rows, 2x2 audio rows, 2 latent frames of 2x2 patches."""
    g = torch.Generator().manual_seed(1)
    n_text, n_audio, n_video = 3, 4, 8
    seq = n_text + n_audio + n_video
    patch_dim = TINY_TRANSFORMER["in_channels"] * math.prod(TINY_TRANSFORMER["patch_size"])
    video_pos = torch.stack(torch.meshgrid(torch.arange(2), torch.arange(2), torch.arange(2), indexing="ij"), -1)
    position_ids = torch.cat(
        [
            torch.stack([torch.arange(n_text)] * 3, -1),  # text on the diagonal
            torch.stack(
                [
                    torch.arange(n_audio) // 2,
                    torch.zeros(n_audio, dtype=torch.long),
                    torch.zeros(n_audio, dtype=torch.long),
                ],
                -1,
            ),
            video_pos.reshape(-1, 3),
        ]
    )
    return dict(
        hidden_states=torch.randn(1, n_video, patch_dim, generator=g),
        audio_hidden_states=torch.randn(1, n_audio, TINY_TRANSFORMER["audio_in_channels"], generator=g),
        encoder_hidden_states=torch.randn(1, n_text, TINY_TRANSFORMER["text_dim"], generator=g),
        timestep=torch.tensor([0.35, 0.8]),  # video/text t, audio t
        timestep_indices=torch.tensor([0] * n_text + [1] * n_audio + [0] * n_video),
        token_tags=torch.tensor([1] * n_text + [2] * n_audio + [0] * n_video),
        position_ids=position_ids,
        video_indices=torch.arange(n_text + n_audio, seq),
        audio_indices=torch.arange(n_text, n_text + n_audio),
        text_indices=torch.arange(n_text),
    )


INPUTS = packed_inputs()


@torch.no_grad()
def run(model: nn.Module, scale: float | None = None) -> torch.Tensor:
    kwargs = {} if scale is None else {"attention_kwargs": {"scale": scale}}
    out = model(**INPUTS, **kwargs)
    return torch.cat([out.sample.flatten(), out.audio_sample.flatten()])


def random_pairs(
    shapes: dict[str, tuple[int, int]], seed: int, rank: int = RANK
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """name -> (A `(rank, in)`, B `(out, rank)`); B is large enough that the update is clearly visible."""
    g = torch.Generator().manual_seed(seed)
    return {
        name: (torch.randn(rank, i, generator=g) / i**0.5, torch.randn(o, rank, generator=g) * 0.1)
        for name, (o, i) in shapes.items()
    }


def block_shapes(model: nn.Module, targets=BLOCK_TARGETS) -> dict[str, tuple[int, int]]:
    names = [f"transformer_blocks.{i}.{t}" for i in range(len(model.transformer_blocks)) for t in targets]
    return {n: (model.get_submodule(n).out_features, model.get_submodule(n).in_features) for n in names}


def peft_sd(pairs, prefix="transformer.") -> dict[str, torch.Tensor]:
    sd = {}
    for name, (a, b) in pairs.items():
        sd[f"{prefix}{name}.lora_A.weight"] = a.contiguous()
        sd[f"{prefix}{name}.lora_B.weight"] = b.contiguous()
    return sd


def save(tmp_path: Path, name: str, sd: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> Path:
    path = tmp_path / name
    save_file({k: v.clone().contiguous() for k, v in sd.items()}, str(path), metadata=metadata)
    return path


def ours(path, scale: float = 1.0, model: nn.Module | None = None, **kw) -> tuple[torch.Tensor, LoraAdapter]:
    model = model or make_nano()
    adapter = load_lora(path, model, scale=scale, **kw)
    with adapter.apply(model):
        out = run(model)
    return out, adapter


def native(path, scale: float = 1.0) -> torch.Tensor:
    """diffusers' own loading of `path` (its converter + peft), at `attention_kwargs={"scale": scale}`."""
    pytest.importorskip("peft")
    from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin

    model = make_nano()
    sd, metadata = MiniMaxH3LoraLoaderMixin.lora_state_dict(str(path), return_lora_metadata=True)
    model.load_lora_adapter(sd, prefix="transformer", metadata=metadata, adapter_name="ref")
    return run(model, scale)


BASE = run(make_nano())


def assert_close(a: torch.Tensor, b: torch.Tensor, tol: float = TOL) -> None:
    err = (a - b).abs().max().item()
    assert err <= tol, f"max abs diff {err:.3g} > {tol}"


def assert_lora_visible(out: torch.Tensor) -> None:
    # Guards every parity check against a vacuous pass where neither side applied anything.
    assert (out - BASE).abs().max().item() > 1e-3


# ---------------------------------------------------------------------------------------------------------------------
# (a) parity with diffusers' native loading, every format
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["transformer.", "base_model.model.", "model.diffusion_model.", ""])
def test_peft_prefixes_match_native(tmp_path, prefix):
    pairs = random_pairs(block_shapes(make_nano()), seed=3)
    meta = {"alpha": "8", "lora_alpha": "8", "rank": str(RANK)}
    reference = native(save(tmp_path, "ref.safetensors", peft_sd(pairs), meta), scale=0.7)
    out, adapter = ours(save(tmp_path, "x.safetensors", peft_sd(pairs, prefix), meta), scale=0.7)
    assert_lora_visible(out)
    assert_close(out, reference)
    r = adapter.report
    assert (r.format, r.matched_layers, r.total_layers, r.rank, r.alpha) == ("peft", 12, NANO_LINEARS, 4, 8.0)
    assert r.effective_scale == pytest.approx(0.7 * 8 / 4)


def test_peft_default_infix_and_diffusers_written_file_match_native(tmp_path):
    """A file written by diffusers' `save_lora_adapter` (alpha only in `lora_adapter_metadata`), and a peft dump."""
    pytest.importorskip("peft")
    from peft import LoraConfig

    model = make_nano()
    model.add_adapter(
        LoraConfig(r=RANK, lora_alpha=2, target_modules=["to_q", "to_v", "ff.net.2"], init_lora_weights=False)
    )
    with torch.no_grad():  # peft's B init is zeros-ish only with init_lora_weights=True; make it clearly visible
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    reference = run(model, scale=1.3)
    model.save_lora_adapter(str(tmp_path))
    written = tmp_path / "pytorch_lora_weights.safetensors"
    out, adapter = ours(written, scale=1.3)
    assert_lora_visible(out)
    assert_close(out, reference)
    assert adapter.report.alpha == 2.0 and adapter.report.effective_scale == pytest.approx(1.3 * 2 / RANK)
    assert adapter.report.matched_layers == 2 * 3 + 3  # 2 blocks + the refiner block, 3 targets each

    dump = {
        k.replace(".lora_A.", ".lora_A.default.").replace(".lora_B.", ".lora_B.default."): v
        for k, v in load_file(str(written)).items()
    }
    out2, adapter2 = ours(save(tmp_path, "dump.safetensors", dump, {"lora_alpha": "2"}), scale=1.3)
    assert adapter2.report.format == "peft"
    assert_close(out2, reference)


@pytest.mark.parametrize("flattened", [True, False])
def test_kohya_with_alpha_matches_native(tmp_path, flattened):
    pairs = random_pairs(block_shapes(make_nano()), seed=4)
    sd = {}
    for name, (a, b) in pairs.items():
        key = "lora_unet_" + name.replace(".", "_") if flattened else f"transformer.{name}"
        sd[f"{key}.lora_down.weight"], sd[f"{key}.lora_up.weight"] = a, b
        sd[f"{key}.alpha"] = torch.tensor(2.0)
    reference = native(save(tmp_path, "ref.safetensors", peft_sd(pairs), {"alpha": "2"}), scale=1.5)
    out, adapter = ours(save(tmp_path, "kohya.safetensors", sd), scale=1.5)
    assert_lora_visible(out)
    assert_close(out, reference)
    assert adapter.report.format == "kohya"
    assert adapter.report.alpha == 2.0 and adapter.report.effective_scale == pytest.approx(1.5 * 2 / RANK)


def test_diffusers_legacy_down_up_matches_native(tmp_path):
    pairs = random_pairs(block_shapes(make_nano()), seed=5)
    sd = {}
    for name, (a, b) in pairs.items():
        if ".attn.to_" in name:  # old attention-processor style: attn.processor.to_q_lora.down.weight
            attn, proj = name.split(".attn.")
            proj = proj.removesuffix(".0")
            stem = f"{attn}.attn.processor.{proj}_lora"
        else:  # LoRACompatibleLinear style: ff.net.2.lora.down.weight
            stem = f"{name}.lora"
        sd[f"{stem}.down.weight"], sd[f"{stem}.up.weight"] = a, b
    reference = native(save(tmp_path, "ref.safetensors", peft_sd(pairs)))
    out, adapter = ours(save(tmp_path, "legacy.safetensors", sd))
    assert_close(out, reference)
    assert adapter.report.format == "diffusers-legacy" and adapter.report.matched_layers == 12


def _original_name_pairs(model, seed):
    """H3 original-checkpoint names (ai-toolkit / musubi / SGLang): fused qkv_proj, mlp.fc1 in [gate; value], ..."""
    g = torch.Generator().manual_seed(seed)
    hidden, inner, ffn = 64, 64, 128
    shapes = {}
    for prefix in ("blocks.0", "blocks.1", "token_refiner.blocks.0"):
        shapes[f"{prefix}.attn.qkv_proj"] = (3 * inner, hidden)
        shapes[f"{prefix}.attn.out_proj"] = (hidden, inner)
        shapes[f"{prefix}.mlp.fc1"] = (2 * ffn, hidden)
        shapes[f"{prefix}.mlp.fc2"] = (hidden, ffn)
    shapes["blocks.1.adaln_proj.linear"] = (6 * hidden * 3, TINY_TRANSFORMER["time_embed_dim"])
    shapes["final_layer.video_out"] = (16, hidden)
    shapes["condition_proj"] = (hidden, TINY_TRANSFORMER["text_dim"])
    return {
        n: (torch.randn(RANK, i, generator=g) / i**0.5, torch.randn(o, RANK, generator=g) * 0.1)
        for n, (o, i) in shapes.items()
    }


def test_h3_original_names_kohya_fused_qkv_and_fc1_match_diffusers_converter(tmp_path):
    """musubi-style `lora_unet_blocks_0_attn_qkv_proj`: fused QKV split, fc1 half swap, alpha, vs diffusers."""
    pairs = _original_name_pairs(make_nano(), seed=6)
    sd = {}
    for name, (a, b) in pairs.items():
        flat = "lora_unet_" + name.replace(".", "_")
        sd[f"{flat}.lora_down.weight"], sd[f"{flat}.lora_up.weight"] = a, b
        sd[f"{flat}.alpha"] = torch.tensor(8.0)
    path = save(tmp_path, "musubi.safetensors", sd)
    out, adapter = ours(path, scale=0.5)
    assert_lora_visible(out)
    assert_close(out, native(path, scale=0.5))
    r = adapter.report
    assert r.format == "kohya/h3-original"
    assert r.matched_layers == 3 * 6 + 3  # q, k, v, out, fc1, fc2 per block; adaln, video_out, condition_proj
    assert r.effective_scale == pytest.approx(0.5 * 8 / RANK)


def test_h3_original_names_peft_prefixed_match_diffusers_converter(tmp_path):
    pairs = _original_name_pairs(make_nano(), seed=7)
    path = save(tmp_path, "aitk.safetensors", peft_sd(pairs, prefix="diffusion_model."))
    out, adapter = ours(path)
    assert_close(out, native(path))
    assert adapter.report.format == "peft/h3-original"


def test_diffsynth_interleaved_qkv_equals_unfused(tmp_path):
    """DiffSynth keeps the raw checkpoint's per-head interleaved QKV; it is de-interleaved with the model's head count.

    (diffusers' converter hard-codes head_dim 128, so it cannot load a nano DiffSynth file; the reference is the same
    update written unfused in diffusers names, itself checked against native loading.)
    """
    model = make_nano()
    heads, head_dim = TINY_TRANSFORMER["num_attention_heads"], TINY_TRANSFORMER["attention_head_dim"]
    pairs = random_pairs(block_shapes(model, ("attn.to_q", "attn.to_k", "attn.to_v")), seed=8)
    sd = {}
    for i in range(2):
        (a, bq), (_, bk), (_, bv) = (pairs[f"transformer_blocks.{i}.attn.to_{p}"] for p in "qkv")
        pairs[f"transformer_blocks.{i}.attn.to_k"] = (a, bk)  # one shared A, as a fused adapter has
        pairs[f"transformer_blocks.{i}.attn.to_v"] = (a, bv)
        per_head = [t.reshape(heads, head_dim, RANK) for t in (bq, bk, bv)]
        interleaved = torch.stack(per_head, dim=1).reshape(3 * heads * head_dim, RANK)  # [h0: q k v, h1: q k v]
        sd[f"blocks.{i}.attn.qkv_proj.lora_A.default.weight"] = a
        sd[f"blocks.{i}.attn.qkv_proj.lora_B.default.weight"] = interleaved
    reference = native(save(tmp_path, "ref.safetensors", peft_sd(pairs)))
    out, adapter = ours(save(tmp_path, "diffsynth.safetensors", sd))
    assert_lora_visible(out)
    assert_close(out, reference)
    assert adapter.report.format == "diffsynth" and adapter.report.matched_layers == 6


def test_sglang_ffn_layout_flag_and_metadata(tmp_path):
    """diffusers' SwiGLU chunks `proj` as [value; gate]; an SGLang-layout file has [gate; value] rows in B."""
    pairs = random_pairs(block_shapes(make_nano(), ("ff.net.0.proj", "attn.to_q")), seed=9)
    swapped = {}
    for name, (a, b) in pairs.items():
        if name.endswith("ff.net.0.proj"):
            value, gate = b.chunk(2)
            b = torch.cat([gate, value])
        swapped[name] = (a, b)
    reference = native(save(tmp_path, "ref.safetensors", peft_sd(pairs)))
    sglang_file = save(tmp_path, "sglang.safetensors", peft_sd(swapped))
    assert_close(ours(sglang_file, layout="sglang")[0], reference)
    assert_close(ours(sglang_file, layout="gate_value")[0], reference)
    tagged = save(tmp_path, "tagged.safetensors", peft_sd(swapped), {"ffn_layout": "sglang"})
    assert_close(ours(tagged)[0], reference)  # auto reads the metadata key
    assert_close(ours(tagged, layout="diffusers")[0], ours(sglang_file)[0])  # explicit flag beats metadata
    assert (ours(sglang_file)[0] - reference).abs().max() > 1e-3  # unswapped is measurably different
    with pytest.raises(LoraError, match="layout"):
        load_lora(sglang_file, make_nano(), layout="gate-first")


# ---------------------------------------------------------------------------------------------------------------------
# (b) scale 0 and removal are exact
# ---------------------------------------------------------------------------------------------------------------------


def test_scale_zero_is_exactly_base():
    model = make_nano()
    adapter = load_lora(ASSETS / "nano-turbo-9.safetensors", model, scale=0.0)
    with adapter.apply(model) as handle:
        assert torch.equal(run(model), BASE)
        handle.set_scale(1.0)
        assert_lora_visible(run(model))
        adapter.set_scale(0.0)
        assert torch.equal(run(model), BASE)
    assert adapter.report.effective_scale == 0.0


def test_remove_restores_bitwise_and_merge_roundtrip():
    model = make_nano()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    adapter = load_lora(ASSETS / "nano-turbo-5.safetensors", model, scale=1.0)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # loading touches nothing
    handle = adapter.apply(model)
    hooked = run(model)
    assert_lora_visible(hooked)
    assert handle.merge() == 12  # fp32: every layer merges
    assert_close(run(model), hooked, 1e-5)
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())
    adapter.set_scale(0.5)  # merged layers re-merge at the new scale
    assert handle.merged_layers == 12
    handle.unmerge()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    half = run(model)
    handle.merge()
    assert_close(run(model), half, 1e-5)
    handle.remove()
    handle.remove()  # idempotent
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert not any(m._forward_hooks or has_hook(m, LORA_HOOK) for m in model.modules())
    assert torch.equal(run(model), BASE)


def test_set_scale_is_linear_in_the_update():
    model = make_nano()
    adapter = load_lora(ASSETS / "nano-turbo-9.safetensors", model)
    with adapter.apply(model):
        # Use one Linear's output directly: the full model is non-linear in the update.
        layer = model.transformer_blocks[0].attn.to_q
        x = torch.randn(5, layer.in_features, generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            one = layer(x) - nn.functional.linear(x, layer.weight)
            adapter.set_scale(2.5)
            two = layer(x) - nn.functional.linear(x, layer.weight)
    assert_close(two, 2.5 * one, 1e-6)
    assert adapter.report.tier_scale == 2.5 and adapter.report.effective_scale == pytest.approx(2.5)


def test_bf16_merge_skipped_when_rounding_loses_the_update(tmp_path):
    """SGLang's rule: a layer whose bf16 merge would lose > half the update stays unmerged (on its hook)."""
    model = nn.Sequential(nn.Linear(8, 8, bias=False)).to(torch.bfloat16)  # its weight is overwritten below
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 8, generator=g) * 0.1, torch.randn(8, 2, generator=g) * 0.1  # a few ulps of a weight near 1
    for big, expect_merged in ((1e4, 0), (1.0, 1)):
        with torch.no_grad():  # not exactly a power of two: the undo's recomputation is exact away from one
            model[0].weight.copy_(big * (1.125 + 0.25 * torch.rand(8, 8, generator=g)))
        path = save(tmp_path, f"m{big}.safetensors", {"0.lora_A.weight": a, "0.lora_B.weight": b})
        adapter = load_lora(path, model)
        original = model[0].weight.clone()
        with adapter.apply(model) as handle:
            x = torch.randn(3, 8, generator=g).to(torch.bfloat16)
            hooked = model(x)
            assert handle.merge() == expect_merged
            if not expect_merged:
                assert torch.equal(model[0].weight, original) and torch.equal(model(x), hooked)
        assert torch.equal(model[0].weight, original)


def test_second_adapter_on_same_model_refused_until_removed():
    model = make_nano()
    nine = load_lora(ASSETS / "nano-turbo-9.safetensors", model)
    five = load_lora(ASSETS / "nano-turbo-5.safetensors", model)
    handle = nine.apply(model)
    with pytest.raises(LoraError, match="remove"):
        five.apply(model)
    handle.remove()
    with five.apply(model):
        assert_lora_visible(run(model))


# ---------------------------------------------------------------------------------------------------------------------
# (c) refusals
# ---------------------------------------------------------------------------------------------------------------------


def test_zero_matching_layers_refused_with_keys(tmp_path):
    g = torch.Generator().manual_seed(0)
    sd = {  # a Flux-style LoRA: nothing here exists in H3
        f"transformer.single_transformer_blocks.{i}.attn.to_q.lora_{ab}.weight": torch.randn(4, 64, generator=g)
        for i in range(3)
        for ab in "AB"
    }
    path = save(tmp_path, "flux.safetensors", sd)
    with pytest.raises(LoraError) as err:
        load_lora(path, make_nano())
    msg = str(err.value)
    assert "6 of 6 keys map to no Linear layer" in msg
    assert "transformer.single_transformer_blocks.0.attn.to_q.lora_A.weight" in msg


def test_one_unmatched_key_refuses_the_whole_file(tmp_path):
    pairs = random_pairs(block_shapes(make_nano()), seed=1)
    sd = peft_sd(pairs)
    sd["transformer.transformer_blocks.7.attn.to_q.lora_A.weight"] = torch.zeros(4, 64)  # block 7 does not exist
    sd["transformer.transformer_blocks.0.attn.norm_q.lora_A.weight"] = torch.zeros(4, 32)  # not a Linear
    with pytest.raises(LoraError) as err:
        load_lora(save(tmp_path, "x.safetensors", sd), make_nano())
    msg = str(err.value)
    assert "2 of 26 keys" in msg and "transformer_blocks.7.attn.to_q" in msg and "norm_q" in msg
    assert "transformer_blocks.0.attn.to_k" not in msg


def test_shape_mismatch_refused(tmp_path):
    sd = {
        "transformer.transformer_blocks.0.attn.to_q.lora_A.weight": torch.zeros(4, 48),  # in_features is 64
        "transformer.transformer_blocks.0.attn.to_q.lora_B.weight": torch.zeros(64, 4),
        "transformer.transformer_blocks.0.ff.net.2.lora_A.weight": torch.zeros(4, 128),
        "transformer.transformer_blocks.0.ff.net.2.lora_B.weight": torch.zeros(64, 8),  # rank 8 vs 4
    }
    with pytest.raises(LoraError) as err:
        load_lora(save(tmp_path, "x.safetensors", sd), make_nano())
    msg = str(err.value)
    assert "shape mismatch" in msg and "(4, 48)" in msg and "expects A (4, 64)" in msg
    assert "ff.net.2.lora_B.weight (64, 8)" in msg


@pytest.mark.parametrize("suffix", [".bin", ".pt", ".ckpt"])
def test_non_safetensors_refused(tmp_path, suffix):
    path = tmp_path / f"lora{suffix}"
    torch.save({"a.lora_A.weight": torch.zeros(1)}, path)
    with pytest.raises(LoraError, match="only .safetensors"):
        load_lora(path, make_nano())
    with pytest.raises(LoraError, match="only .safetensors"):
        inspect_lora(path)


def test_other_refusals(tmp_path):
    model = make_nano()
    a, b = torch.zeros(4, 64), torch.zeros(64, 4)
    cases = {
        "incomplete pair": {"transformer_blocks.0.attn.to_q.lora_A.weight": a},
        "non-finite": {
            "transformer_blocks.0.attn.to_q.lora_A.weight": a + float("nan"),
            "transformer_blocks.0.attn.to_q.lora_B.weight": b,
        },
        "already addressed": {
            "transformer_blocks.0.attn.to_qkv.lora_A.weight": a,
            "transformer_blocks.0.attn.to_qkv.lora_B.weight": torch.zeros(192, 4),
            "transformer_blocks.0.attn.to_k.lora_A.weight": a,
            "transformer_blocks.0.attn.to_k.lora_B.weight": b,
        },
    }
    for message, sd in cases.items():
        with pytest.raises(LoraError, match=message):
            load_lora(save(tmp_path, "x.safetensors", sd), model)
    ok = {"transformer_blocks.0.attn.to_q.lora_A.weight": a, "transformer_blocks.0.attn.to_q.lora_B.weight": b}
    with pytest.raises(LoraError, match="disagrees"):
        load_lora(save(tmp_path, "x.safetensors", ok, {"lora_alpha": "4", "network_alpha": "8"}), model)
    with pytest.raises(LoraError, match="metadata rank 16 matches no layer"):
        load_lora(save(tmp_path, "x.safetensors", ok, {"rank": "16"}), model)
    with pytest.raises(LoraError, match="not found"):
        load_lora(tmp_path / "missing.safetensors", model)
    (tmp_path / "garbage.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(LoraError, match="not a readable safetensors"):
        load_lora(tmp_path / "garbage.safetensors", model)


# ---------------------------------------------------------------------------------------------------------------------
# (d) fused QKV with unequal widths
# ---------------------------------------------------------------------------------------------------------------------


class _UnequalAttention(nn.Module):
    """q/k/v of unequal widths (GQA-like). 8 + 4 + 12 = 24 = 3 x 8: an equal three-way split would be silently wrong."""

    def __init__(self):
        super().__init__()
        self.to_q, self.to_k, self.to_v = nn.Linear(16, 8), nn.Linear(16, 4), nn.Linear(16, 12)
        self.to_out = nn.ModuleList([nn.Linear(24, 16)])

    def forward(self, x):
        return self.to_out[0](torch.cat([self.to_q(x), self.to_k(x), self.to_v(x)], -1))


class _Toy(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([nn.ModuleDict({"attn": _UnequalAttention()}) for _ in range(2)])

    def forward(self, x):
        for block in self.blocks:
            x = x + block["attn"](x)
        return x


@pytest.mark.parametrize("fused_name", ["to_qkv", "qkv_proj"])
def test_fused_qkv_split_by_real_unequal_widths(tmp_path, fused_name):
    g = torch.Generator().manual_seed(0)
    fused, unfused, expected = {}, {}, {}
    for i in range(2):
        a, b = torch.randn(RANK, 16, generator=g), torch.randn(24, RANK, generator=g)
        fused[f"blocks.{i}.attn.{fused_name}.lora_A.weight"] = a
        fused[f"blocks.{i}.attn.{fused_name}.lora_B.weight"] = b
        for proj, rows in zip(("to_q", "to_k", "to_v"), b.split([8, 4, 12]), strict=True):
            unfused[f"blocks.{i}.attn.{proj}.lora_A.weight"] = a
            unfused[f"blocks.{i}.attn.{proj}.lora_B.weight"] = rows
            expected[f"blocks.{i}.attn.{proj}"] = rows @ a
    x = torch.randn(3, 16, generator=g)
    toy = _Toy()
    meta = {"lora_alpha": "2"}
    adapter = load_lora(save(tmp_path, "fused.safetensors", fused, meta), toy, scale=0.5)
    assert adapter.report.matched_layers == 6 and adapter.report.total_layers == 8
    with adapter.apply(toy), torch.no_grad():
        got = toy(x)
    with load_lora(save(tmp_path, "unfused.safetensors", unfused, meta), toy, scale=0.5).apply(toy), torch.no_grad():
        want = toy(x)
    # And from first principles: W + 0.5 * (2 / 4) * B @ A on each projection.
    reference = _Toy()
    with torch.no_grad():
        for name, delta in expected.items():
            reference.get_submodule(name).weight += 0.25 * delta
        manual = reference(x)
    assert torch.allclose(got, want, atol=1e-6) and torch.allclose(got, manual, atol=1e-5)

    bad = dict(fused)
    bad[f"blocks.0.attn.{fused_name}.lora_B.weight"] = torch.randn(30, RANK, generator=g)
    with pytest.raises(LoraError, match=r"expects A \(4, 16\) and B \(24, 4\)"):
        load_lora(save(tmp_path, "bad.safetensors", bad), toy)


def test_unfused_adapter_on_fused_model_routes_to_qkv_slices():
    """After `fuse_qkv_projections()` the processor calls `to_qkv`; the q/k/v updates go to its row slices."""
    unfused = make_nano()
    fused = make_nano()
    fused.fuse_qkv_projections()
    path = ASSETS / "nano-turbo-9.safetensors"
    with load_lora(path, unfused).apply(unfused):
        want = run(unfused)
    adapter = load_lora(path, fused)
    assert adapter.report.total_layers == NANO_LINEARS  # to_qkv is not counted twice
    with adapter.apply(fused) as handle:
        assert_close(run(fused), want, 1e-5)
        assert handle.merge() == 8  # live modules: to_qkv (3 pieces), to_out.0, ff.net.0.proj, ff.net.2 per block
        assert_close(run(fused), want, 1e-5)
    assert torch.equal(run(fused), run(make_nano()))


# ---------------------------------------------------------------------------------------------------------------------
# scale from alpha / rank, reports, assets
# ---------------------------------------------------------------------------------------------------------------------


def test_effective_scale_honours_alpha_over_rank(tmp_path):
    """The lesson: an alpha-less load of an alpha=4, rank=64 adapter runs 16x too strong — the report must show it."""
    rank = 64
    pairs = random_pairs(block_shapes(make_nano(), ("attn.to_q", "ff.net.2")), seed=11, rank=rank)
    with_alpha = save(tmp_path, "a.safetensors", peft_sd(pairs), {"lora_alpha": "4", "rank": str(rank)})
    without = save(tmp_path, "b.safetensors", peft_sd(pairs))
    out_alpha, a = ours(with_alpha)
    out_none, b = ours(without, scale=1 / 16)
    assert (a.report.alpha, a.report.rank, a.report.effective_scale) == (4.0, rank, pytest.approx(1 / 16))
    assert b.report.alpha is None and b.report.effective_scale == pytest.approx(1 / 16)
    assert load_lora(without, make_nano()).report.effective_scale == 1.0  # the 16x-too-strong default, visible
    assert_close(out_alpha, out_none, 1e-6)
    assert_close(out_alpha, native(save(tmp_path, "c.safetensors", peft_sd(pairs), {"alpha": "4"})))


def test_generated_assets_report_and_inspect(tmp_path):
    expected = {"nano-turbo-9": ("peft", 4.0, 9, 24), "nano-turbo-5": ("kohya", 2.0, 5, 36)}
    model = make_nano()
    for stem, (fmt, alpha, steps, keys) in expected.items():
        path = ASSETS / f"{stem}.safetensors"
        info = inspect_lora(path)
        assert (info["format"], info["alpha"], info["steps"], info["num_keys"], info["rank"]) == (
            fmt,
            alpha,
            steps,
            keys,
            4,
        )
        assert info["untrained"] is True and info["metadata"]["h3_untrained"] == "true"
        report = load_lora(path, model, scale=0.8).report
        assert isinstance(report, LoraReport)
        assert (report.format, report.matched_layers, report.total_layers, report.rank) == (fmt, 12, NANO_LINEARS, 4)
        assert report.alpha == alpha and report.effective_scale == pytest.approx(0.8 * alpha / 4)
        assert report.untrained and report.metadata["h3_steps"] == str(steps)
        d = report.to_dict()
        assert json.loads(json.dumps(d)) == d and d["tier_scale"] == 0.8
        with pytest.raises(FrozenInstanceError):
            report.rank = 8  # type: ignore[misc]


def test_generated_assets_are_reproducible_and_sane(tmp_path):
    again = lora_fixtures.write_fixture_loras(tmp_path)
    for stem in lora_fixtures.LORAS:
        assert (again / f"{stem}.safetensors").read_bytes() == (ASSETS / f"{stem}.safetensors").read_bytes()
    # "Small magnitudes": the turbo output moves, but by a few % of the base output.
    for stem in lora_fixtures.LORAS:
        out, _ = ours(ASSETS / f"{stem}.safetensors")
        change = ((out - BASE).norm() / BASE.norm()).item()
        assert 1e-4 < change < 0.1, (stem, change)


def test_shipped_trained_loras_load_fully_onto_the_shipped_nano():
    """assets/loras: distilled PEFT adapters, rank 8, every one of their layers found on the shipped config."""
    model = MiniMaxH3Transformer3DModel(**NANO_TRANSFORMER).eval()
    blocks = NANO_TRANSFORMER["num_layers"]
    for steps in (9, 5):
        path = SHIPPED / f"nano-turbo-{steps}.safetensors"
        info = inspect_lora(path)
        assert (info["format"], info["rank"], info["steps"], info["untrained"]) == ("peft", 8, steps, False)
        report = load_lora(path, model).report
        # q, k, v, out, both FFN linears and the AdaLN projection of every block
        assert report.matched_layers == 7 * blocks and not report.untrained


def test_total_layers_count():
    model = make_nano()
    assert sum(isinstance(m, nn.Linear) for m in model.modules()) == NANO_LINEARS


def test_mixed_precision_model_computes_in_each_layers_dtype():
    """H3 ships bf16 blocks with fp32 patch/time/output projections; each update runs in its layer's dtype."""
    model = make_nano().to(torch.bfloat16)
    for name in MiniMaxH3Transformer3DModel._keep_in_fp32_modules:
        model.get_submodule(name).float()
    adapter = load_lora(ASSETS / "nano-turbo-9.safetensors", model)
    with adapter.apply(model) as handle:
        pieces = {id(layer.module): layer.pieces[0] for layer in handle._layers}
        assert {p.down.dtype for p in pieces.values()} == {torch.bfloat16}
        out = run(model).float()
    fp32_model = make_nano()
    with load_lora(ASSETS / "nano-turbo-9.safetensors", fp32_model).apply(fp32_model):
        reference = run(fp32_model)
    assert torch.isfinite(out).all()
    assert (out - reference).abs().max() < 0.05 * reference.abs().max()

"""Reading a LoRA file and mapping its keys onto the model's `nn.Linear`s (engine/lora.py applies the result).

Supported key layouts (any of them may carry the `transformer.`, `base_model.model.`, `model.diffusion_model.` or
`diffusion_model.` prefix):

- `peft`: `<module>.lora_A.weight` / `<module>.lora_B.weight` (also peft's `.lora_A.default.weight`); alpha from the
  metadata, including diffusers' `lora_adapter_metadata`.
- `kohya`: `lora_unet_<module_with_underscores>.lora_down.weight` / `.lora_up.weight` / `.alpha` (flattened names are
  matched against the model's real module names, never split on `_`), or dotted `<module>.lora_down.weight`.
- `diffusers-legacy`: `<module>.lora.down.weight` / `.lora.up.weight` and `<attn>.processor.to_q_lora.down.weight`.
- `diffsynth`: H3 original-checkpoint names with peft's `.default.` infix; its fused QKV rows are interleaved per head
  and are de-interleaved with the model's own head count.
- `<style>/h3-original`: any style above over the H3 original-checkpoint names that ai-toolkit, musubi-tuner and SGLang
  use (`blocks.N.attn.qkv_proj`, `attn.out_proj`, `mlp.fc1`, `mlp.fc2`, `token_refiner.blocks.N`, `final_layer.*`, ...),
  the same table diffusers' converter uses.

Fused QKV: a single `to_qkv` / `qkv_proj` pair is split into `to_q`, `to_k`, `to_v` by the *real* `out_features` of the
model's modules (never assumed equal). A is shared, B's rows are cut at those widths. If the model itself has fused
projections (`fuse_qkv_projections()`), the pieces are routed back onto `to_qkv`'s row slices at `apply()` time.

FFN layout: diffusers' SwiGLU does `hidden, gate = proj(x).chunk(2, dim=-1)`, i.e. the fused `proj` rows are
`[value; gate]` (layout `"diffusers"`). The original H3 checkpoint and SGLang use `[gate; value]` (layout `"sglang"`).
Only B's rows move (a permutation of outputs), A is untouched. Resolution order: the `layout=` argument when not
`"auto"`, else the file metadata key `ffn_layout` (or `h3_ffn_layout`; values `diffusers`/`value_gate`/`sglang`/
`gate_value`), else by naming: original `mlp.fc1` names are `[gate; value]`, diffusers `ff.net.0.proj` names are
`[value; gate]`.

Scale: effective delta = tier_scale x (alpha / rank) x B @ A (`alpha / sqrt(rank)` for rsLoRA files). alpha comes from,
in order: a per-layer `.alpha` tensor; diffusers' `lora_adapter_metadata` JSON (`alpha_pattern`, then `lora_alpha`); the
flat safetensors metadata keys `lora_alpha` / `network_alpha` / `alpha` / `ss_network_alpha`. **When no alpha is found,
alpha = rank, i.e. a factor of 1.0** (diffusers' convention for alpha-less files); the report then has `alpha=None`,
so a caller can flag it. rank is always read from the tensors; a metadata `rank` / `r` / `ss_network_dim` that matches
no layer's rank is refused.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

# Prefixes that trainers put in front of the model's own module names. Tried only when the bare name misses.
_PREFIXES = ("base_model.model.", "model.diffusion_model.", "diffusion_model.", "transformer.")
# kohya / musubi flatten the dotted module path with `_` under one of these.
_FLAT_PREFIXES = ("lora_unet_", "lora_transformer_")
_LAYOUTS = {"diffusers": "diffusers", "value_gate": "diffusers", "sglang": "sglang", "gate_value": "sglang"}
_LAYOUT_METADATA_KEYS = ("ffn_layout", "h3_ffn_layout")
_ALPHA_METADATA_KEYS = ("lora_alpha", "network_alpha", "alpha", "ss_network_alpha")
_RANK_METADATA_KEYS = ("rank", "r", "ss_network_dim")
_GATED_FFN_CLASSES = ("SwiGLU", "GEGLU")
_MAX_KEYS_IN_ERROR = 20

# (key suffix, role, key style). Longest / most specific first.
_SUFFIXES = (
    (".lora_A.default.weight", "down", "peft-default"),
    (".lora_B.default.weight", "up", "peft-default"),
    (".lora_A.weight", "down", "peft"),
    (".lora_B.weight", "up", "peft"),
    (".lora_down.weight", "down", "kohya"),
    (".lora_up.weight", "up", "kohya"),
    (".lora.down.weight", "down", "diffusers-legacy"),
    (".lora.up.weight", "up", "diffusers-legacy"),
    (".alpha", "alpha", None),
)
# diffusers' old attention-processor LoRA: `attn.processor.to_q_lora.down.weight` -> `attn.to_q`.
_LEGACY_PROCESSOR = re.compile(
    r"^(?P<attn>.*)\.processor\.(?P<proj>to_q|to_k|to_v|to_out)_lora\.(?P<role>down|up)\.weight$"
)

# MiniMax-H3 original-checkpoint names (ai-toolkit, musubi, DiffSynth, SGLang) as aliases of the diffusers names,
# written diffusers -> original so the alias vocabulary is generated from the model's real modules.
_H3_ORIGINAL_ALIASES = (
    (r"transformer_blocks\.(\d+)\.attn\.to_qkv", r"blocks.\1.attn.qkv_proj"),
    (r"transformer_blocks\.(\d+)\.attn\.to_out\.0", r"blocks.\1.attn.out_proj"),
    (r"transformer_blocks\.(\d+)\.ff\.net\.0\.proj", r"blocks.\1.mlp.fc1"),
    (r"transformer_blocks\.(\d+)\.ff\.net\.2", r"blocks.\1.mlp.fc2"),
    (r"transformer_blocks\.(\d+)\.adaln_proj\.linear", r"blocks.\1.adaln_proj.linear"),
    (r"token_refiner\.refiner_blocks\.(\d+)\.attn\.to_qkv", r"token_refiner.blocks.\1.attn.qkv_proj"),
    (r"token_refiner\.refiner_blocks\.(\d+)\.attn\.to_out\.0", r"token_refiner.blocks.\1.attn.out_proj"),
    (r"token_refiner\.refiner_blocks\.(\d+)\.ff\.net\.0\.proj", r"token_refiner.blocks.\1.mlp.fc1"),
    (r"token_refiner\.refiner_blocks\.(\d+)\.ff\.net\.2", r"token_refiner.blocks.\1.mlp.fc2"),
    (r"proj_in", "video_patch_proj"),
    (r"audio_proj_in", "audio_patch_proj"),
    (r"context_embedder", "condition_proj"),
    (r"time_embedder\.linear_1", "time_embedder.proj_in"),
    (r"time_embedder\.linear_2", "time_embedder.proj_out"),
    (r"norm_out\.linear", "final_layer.adaln_proj.linear"),
    (r"proj_out", "final_layer.video_out"),
    (r"audio_proj_out", "final_layer.audio_out"),
)


class LoraError(ValueError):
    """A LoRA file that cannot be applied as asked: unknown keys, shape mismatches, 0 matches, wrong file type."""


# --------------------------------------------------------------------------------------------------------------------
# Public data types
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoraReport:
    """What a LoRA file is and how it maps onto a model.

    Attributes:
        path: The file.
        format: Detected key layout, e.g. `"peft"`, `"kohya"`, `"kohya/h3-original"`, `"diffsynth"` (module docstring).
        matched_layers: Model `nn.Linear` layers that receive a delta (a fused-QKV pair counts as 3).
        total_layers: LoRA-targetable `nn.Linear` layers in the model (fused `to_qkv` duplicates not counted twice).
        rank: The rank (the largest one for mixed-rank files).
        alpha: The alpha of that layer, or `None` when the file gives none (then alpha = rank, a factor of 1.0).
        effective_scale: `tier_scale x alpha / rank` of the strongest layer, the factor B @ A is multiplied by.
        tier_scale: The explicit per-tier multiplier (`set_scale`).
        untrained: The file's metadata says `h3_untrained == "true"` (a random test adapter).
        metadata: The file's safetensors `__metadata__`.
    """

    path: str
    format: str
    matched_layers: int
    total_layers: int
    rank: int
    alpha: float | None
    effective_scale: float
    tier_scale: float
    untrained: bool
    metadata: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class LayerDelta:
    """One low-rank update `factor x B @ A` for one logical `nn.Linear` of the model.

    `down` (A) is `(rank, in_features)`, `up` (B) is `(out_features, rank)`, both as stored in the file (after the
    fused-QKV split, DiffSynth de-interleave and FFN half swap). `keys` are the file keys it came from.
    """

    module: str
    down: torch.Tensor
    up: torch.Tensor
    alpha: float | None
    factor: float
    keys: tuple[str, ...]

    @property
    def rank(self) -> int:
        return self.down.shape[0]


@dataclass(frozen=True)
class _Target:
    """A name an adapter key can address: one Linear, or a fused q/k/v triple split by the modules' widths."""

    modules: tuple[str, ...]
    fused: bool = False
    original_name: bool = False  # addressed through an H3 original-checkpoint alias


# --------------------------------------------------------------------------------------------------------------------
# File reading and key parsing
# --------------------------------------------------------------------------------------------------------------------


def check_path(path: str | Path) -> Path:
    path = Path(path)
    if path.suffix.lower() != ".safetensors":
        raise LoraError(
            f"{path}: only .safetensors LoRA files are accepted (got '{path.suffix or 'no extension'}'). Pickled "
            ".bin/.pt/.ckpt files can run arbitrary code on load; convert them with safetensors first."
        )
    if not path.is_file():
        raise LoraError(f"{path}: LoRA file not found.")
    return path


def read_header(path: Path) -> tuple[list[str], dict[str, str]]:
    """Key names and `__metadata__` without reading any tensor."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return list(f.keys()), dict(f.metadata() or {})
    except Exception as e:  # safetensors raises its own SafetensorError, or OSError on garbage files
        raise LoraError(f"{path}: not a readable safetensors file ({e}).") from e


def split_key(key: str) -> tuple[str, str, str | None] | None:
    """`key` -> (module path as written, role in {"down","up","alpha"}, key style) or None when unrecognised."""
    m = _LEGACY_PROCESSOR.match(key)
    if m:
        proj = "to_out.0" if m["proj"] == "to_out" else m["proj"]
        return f"{m['attn']}.{proj}", m["role"], "diffusers-legacy"
    for suffix, role, style in _SUFFIXES:
        if key.endswith(suffix):
            return key[: -len(suffix)], role, style
    return None


def _strip_prefixes(name: str) -> Iterator[tuple[str, bool]]:
    """Yield the candidate module names for `name`: as written, then with known prefixes peeled off one at a time.

    The bool says whether the candidate is a kohya-flattened (`_`-joined) name.
    """
    yield name, False
    while True:
        for prefix in _PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix) :]
                yield name, False
                break
        else:
            break
    for prefix in _FLAT_PREFIXES:
        if name.startswith(prefix):
            yield name[len(prefix) :], True


_ORIGINAL_NAME = re.compile(
    r"(^|\.|lora_unet_)((token_refiner[._])?blocks[._]\d+[._]|final_layer[._]|video_patch_proj|audio_patch_proj|condition_proj)"
)


def detect_format(keys: list[str], original: bool | None = None) -> str:
    """A format string from key names (module docstring table).

    `original` says whether the keys use H3's original-checkpoint names; guessed from the names when None (no model).
    """
    styles = set()
    for key in keys:
        parsed = split_key(key)
        if parsed and parsed[2]:
            styles.add(parsed[2])
    if original is None:
        original = any(_ORIGINAL_NAME.search(k) for k in keys)
    if "peft-default" in styles and original:
        return "diffsynth"
    styles = {"peft" if s == "peft-default" else s for s in styles}
    if not styles:
        return "unknown"
    style = styles.pop() if len(styles) == 1 else "mixed"
    return f"{style}/h3-original" if original else style


# --------------------------------------------------------------------------------------------------------------------
# The model's vocabulary of addressable names
# --------------------------------------------------------------------------------------------------------------------


_PEFT_INTERNALS = {"lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector"}


def _logical(name: str) -> str:
    """A peft-wrapped layer's real Linear is `<name>.base_layer`; adapters address it as `<name>`."""
    return name.removesuffix(".base_layer")


def _is_linear_like(module: nn.Module | None) -> bool:
    return isinstance(module, nn.Linear) or isinstance(getattr(module, "base_layer", None), nn.Linear)


def find_linear(model: nn.Module, name: str) -> nn.Linear:
    """The `nn.Linear` a logical name denotes (unwrapping a peft layer's `base_layer`)."""
    try:
        module = model.get_submodule(name)
    except AttributeError as e:
        raise LoraError(f"{name}: no such module in this model") from e
    module = getattr(module, "base_layer", module) if not isinstance(module, nn.Linear) else module
    if not isinstance(module, nn.Linear):
        raise LoraError(f"{name}: is {type(module).__name__}, not nn.Linear")
    return module


def _is_fused_alias(model: nn.Module, name: str) -> bool:
    """`attn.to_qkv` made by `fuse_qkv_projections()` sits next to the real to_q/to_k/to_v; count those once."""
    parent, _, leaf = _logical(name).rpartition(".")
    if leaf not in ("to_qkv", "to_kv", "to_added_qkv"):
        return False
    owner = model.get_submodule(parent) if parent else model
    return all(_is_linear_like(getattr(owner, p, None)) for p in ("to_q", "to_k", "to_v"))


def linear_layers(model: nn.Module) -> dict[str, str]:
    """The model's LoRA-targetable Linear layers: logical name -> real module path.

    The two differ only for a layer already wrapped by peft (e.g. after diffusers' `load_lora_adapter`), whose own
    `lora_A` / `lora_B` Linears are not targets.
    """
    layers = {}
    for name, module in model.named_modules():
        if not name or not isinstance(module, nn.Linear) or _PEFT_INTERNALS & set(name.split(".")):
            continue
        if not _is_fused_alias(model, name):
            layers[_logical(name)] = name
    return layers


def _build_vocabulary(model: nn.Module) -> tuple[dict[str, _Target], dict[str, str]]:
    """Every name an adapter key may use for this model -> `_Target`, plus kohya flat name -> dotted name."""
    linears = linear_layers(model)
    vocab: dict[str, _Target] = {n: _Target((n,)) for n in linears}
    for name in list(linears):
        parent, _, leaf = name.rpartition(".")
        if leaf != "to_q":
            continue
        triple = tuple(f"{parent}.{p}" if parent else p for p in ("to_q", "to_k", "to_v"))
        if all(t in linears for t in triple):
            fused = _Target(triple, fused=True)
            for fused_leaf in ("to_qkv", "qkv_proj"):
                vocab.setdefault(f"{parent}.{fused_leaf}" if parent else fused_leaf, fused)
    for name, target in list(vocab.items()):
        for pattern, original in _H3_ORIGINAL_ALIASES:
            if re.fullmatch(pattern, name):
                alias = re.sub(pattern, original, name)
                vocab.setdefault(alias, dataclasses.replace(target, original_name=True))
    flat: dict[str, str] = {}
    for name in vocab:
        flat.setdefault(name.replace(".", "_"), name)
    return vocab, flat


def _resolve(name: str, vocab: dict[str, _Target], flat: dict[str, str]) -> tuple[str, _Target] | None:
    for candidate, flattened in _strip_prefixes(name):
        if flattened:
            candidate = flat.get(candidate, "")
        if candidate in vocab:
            return candidate, vocab[candidate]
    return None


# --------------------------------------------------------------------------------------------------------------------
# Alpha / rank metadata
# --------------------------------------------------------------------------------------------------------------------


def _peft_config(metadata: dict[str, str]) -> dict[str, Any]:
    """diffusers' `lora_adapter_metadata` (a LoraConfig as JSON, possibly packed under `transformer.`)."""
    raw = metadata.get("lora_adapter_metadata")
    if not raw:
        return {}
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise LoraError(f"`lora_adapter_metadata` is not valid JSON: {e}") from e
    prefixed = {k.removeprefix("transformer."): v for k, v in config.items() if k.startswith("transformer.")}
    return prefixed or config


def _float_meta(metadata: dict[str, str], keys: tuple[str, ...], what: str) -> float | None:
    """The one value the given metadata keys agree on, or None. Disagreeing keys are refused, not guessed."""
    values = {}
    for key in keys:
        if key in metadata and str(metadata[key]).strip().lower() not in ("", "none", "null"):
            try:
                values[key] = float(metadata[key])
            except ValueError as e:
                raise LoraError(f"metadata {key}={metadata[key]!r} is not a number ({what}).") from e
    if len(set(values.values())) > 1:
        raise LoraError(f"metadata disagrees on the {what}: {values}.")
    return next(iter(values.values()), None)


def _pattern_matches(pattern: str, name: str) -> bool:
    # peft's rule (`get_pattern_key`): a pattern matches a dotted suffix; diffusers writes `^`-anchored full names.
    if pattern.startswith("^"):
        return re.fullmatch(pattern[1:], name) is not None
    return re.fullmatch(rf"(?:.*\.)?(?:{pattern})", name) is not None


@dataclass(frozen=True)
class _AlphaRules:
    """Where each layer's alpha comes from, in priority order (module docstring)."""

    tensors: dict[str, float]  # canonical module name -> per-layer `.alpha`
    pattern: dict[str, float]  # peft alpha_pattern
    network: float | None  # one alpha for the whole file
    rslora: bool

    def alpha(self, module: str) -> float | None:
        if module in self.tensors:
            return self.tensors[module]
        for pattern, value in self.pattern.items():
            if _pattern_matches(pattern, module):
                return float(value)
        return self.network

    def factor(self, alpha: float | None, rank: int) -> float:
        if alpha is None:
            return 1.0  # alpha = rank: diffusers' (and most trainers') convention for alpha-less files
        return alpha / math.sqrt(rank) if self.rslora else alpha / rank


def alpha_rules(metadata: dict[str, str], tensors: dict[str, float]) -> tuple[_AlphaRules, float | None]:
    """Alpha rules from the metadata, and the metadata's declared rank (or None)."""
    config = _peft_config(metadata)
    if config.get("use_dora"):
        raise LoraError("DoRA adapters (`use_dora`) are not supported.")
    flat_alpha = _float_meta(metadata, _ALPHA_METADATA_KEYS, "alpha")
    config_alpha = config.get("lora_alpha")
    if flat_alpha is not None and config_alpha is not None and float(config_alpha) != flat_alpha:
        raise LoraError(f"metadata alpha {flat_alpha} disagrees with lora_adapter_metadata lora_alpha {config_alpha}.")
    network = float(config_alpha) if config_alpha is not None else flat_alpha
    rslora = bool(config.get("use_rslora")) or str(metadata.get("use_rslora", "")).lower() == "true"
    rank = _float_meta(metadata, _RANK_METADATA_KEYS, "rank")
    if rank is None and config.get("r") is not None:
        rank = float(config["r"])
    rules = _AlphaRules(
        tensors=tensors, pattern=dict(config.get("alpha_pattern") or {}), network=network, rslora=rslora
    )
    return rules, rank


# --------------------------------------------------------------------------------------------------------------------
# Mapping a state dict onto the model
# --------------------------------------------------------------------------------------------------------------------


def _ffn_layout(layout: str, metadata: dict[str, str]) -> str | None:
    """The FFN layout forced by the caller or the file, or None to decide per key by its naming."""
    if layout != "auto":
        if layout not in _LAYOUTS:
            raise LoraError(f"layout={layout!r}: expected 'auto' or one of {sorted(_LAYOUTS)}.")
        return _LAYOUTS[layout]
    for key in _LAYOUT_METADATA_KEYS:
        if key in metadata:
            value = metadata[key].strip().lower()
            if value not in _LAYOUTS:
                raise LoraError(f"metadata {key}={metadata[key]!r}: expected one of {sorted(_LAYOUTS)}.")
            return _LAYOUTS[value]
    return None


def _is_gated_ffn(model: nn.Module, module: str) -> bool:
    parent = module.rpartition(".")[0]
    return bool(parent) and type(model.get_submodule(parent)).__name__ in _GATED_FFN_CLASSES


def _deinterleave_heads(up: torch.Tensor, model: nn.Module, triple: tuple[str, ...], key: str) -> torch.Tensor:
    """DiffSynth fused QKV rows `[h0: q k v, h1: q k v, ...]` -> `[q_all; k_all; v_all]` (needs equal widths)."""
    widths = [find_linear(model, m).out_features for m in triple]
    attn = model.get_submodule(triple[0].rpartition(".")[0])
    heads = getattr(attn, "heads", None)
    if len(set(widths)) != 1 or not heads or widths[0] % heads or up.shape[0] != sum(widths):
        raise LoraError(
            f"{key}: cannot de-interleave a per-head fused QKV update of {up.shape[0]} rows for q/k/v widths {widths} "
            f"and {heads} heads."
        )
    head_dim = widths[0] // heads
    grouped = up.reshape(heads, 3, head_dim, up.shape[1])
    return grouped.transpose(0, 1).reshape(sum(widths), up.shape[1])


@dataclass
class _Mapping:
    deltas: list[LayerDelta]
    format: str


def map_state_dict(
    state_dict: dict[str, torch.Tensor], metadata: dict[str, str], model: nn.Module, layout: str
) -> _Mapping:
    """Parse, resolve and validate every key. Raises one `LoraError` that lists every problem found."""
    forced_layout = _ffn_layout(layout, metadata)
    vocab, flat = _build_vocabulary(model)

    unmatched: list[str] = []
    problems: list[str] = []
    original = False
    groups: dict[str, dict[str, tuple[str, torch.Tensor]]] = {}  # canonical name -> role -> (key, tensor)
    for key, tensor in state_dict.items():
        parsed = split_key(key)
        resolved = _resolve(parsed[0], vocab, flat) if parsed else None
        if resolved is None:
            unmatched.append(key)
            continue
        canonical, target = resolved
        original |= target.original_name
        roles = groups.setdefault(canonical, {})
        if parsed[1] in roles:
            problems.append(f"{key}: duplicate of {roles[parsed[1]][0]}")
            continue
        roles[parsed[1]] = (key, tensor)

    tensor_alphas: dict[str, float] = {}
    for canonical, roles in groups.items():
        if "down" not in roles or "up" not in roles:
            present = ", ".join(k for k, _ in roles.values())
            problems.append(f"{present}: incomplete pair (needs both down/A and up/B)")
        if "alpha" in roles:
            tensor_alphas[canonical] = float(roles["alpha"][1].float().reshape(-1)[0])
    rules, meta_rank = alpha_rules(metadata, tensor_alphas)
    fmt = detect_format(list(state_dict), original)
    diffsynth = fmt == "diffsynth"  # fused QKV rows are interleaved per head

    deltas: list[LayerDelta] = []
    addressed: dict[str, str] = {}
    for canonical, roles in groups.items():
        if "down" not in roles or "up" not in roles:
            continue
        (down_key, down), (up_key, up) = roles["down"], roles["up"]
        target = vocab[canonical]
        keys = tuple(k for k, _ in roles.values())
        if down.ndim != 2 or up.ndim != 2 or down.shape[0] != up.shape[1]:
            problems.append(f"{down_key} {tuple(down.shape)} / {up_key} {tuple(up.shape)}: not a 2-D rank-r pair")
            continue
        if not (torch.isfinite(down).all() and torch.isfinite(up).all()):
            problems.append(f"{down_key} / {up_key}: non-finite values")
            continue
        layers = [find_linear(model, m) for m in target.modules]
        widths = [layer.out_features for layer in layers]
        expected_up, expected_down = (sum(widths), down.shape[0]), (down.shape[0], layers[0].in_features)
        if tuple(up.shape) != expected_up or tuple(down.shape) != expected_down:
            problems.append(
                f"{down_key} {tuple(down.shape)} / {up_key} {tuple(up.shape)}: shape mismatch, "
                f"{canonical} expects A {expected_down} and B {expected_up}"
            )
            continue
        if target.fused and diffsynth:
            up = _deinterleave_heads(up, model, target.modules, up_key)
        # One logical Linear per piece; a fused QKV B is cut at the modules' real widths.
        for module, piece in zip(target.modules, up.split(widths, dim=0), strict=True):
            if module in addressed:
                problems.append(f"{up_key}: {module} is already addressed by {addressed[module]}")
                continue
            addressed[module] = up_key
            if _is_gated_ffn(model, module):
                file_layout = forced_layout or ("sglang" if target.original_name else "diffusers")
                if file_layout == "sglang":
                    gate, value = piece.chunk(2, dim=0)  # [gate; value] -> diffusers' [value; gate]
                    piece = torch.cat([value, gate], dim=0)
            alpha = rules.alpha(module) if canonical not in tensor_alphas else tensor_alphas[canonical]
            factor = rules.factor(alpha, down.shape[0])
            deltas.append(LayerDelta(module, down, piece.contiguous(), alpha, factor, keys))

    if meta_rank is not None and deltas and int(meta_rank) not in {d.rank for d in deltas}:
        problems.append(
            f"metadata rank {meta_rank:g} matches no layer (tensor ranks {sorted({d.rank for d in deltas})})"
        )
    if unmatched or problems:
        raise LoraError(_error_message(unmatched, problems, len(state_dict)))
    if not deltas:
        raise LoraError(
            f"the adapter matched 0 of {len(linear_layers(model))} layers (file has {len(state_dict)} keys)"
        )
    return _Mapping(deltas=deltas, format=fmt)


def _error_message(unmatched: list[str], problems: list[str], num_keys: int) -> str:
    lines = []
    if unmatched:
        shown = "\n  ".join(unmatched[:_MAX_KEYS_IN_ERROR])
        more = f"\n  ... and {len(unmatched) - _MAX_KEYS_IN_ERROR} more" if len(unmatched) > _MAX_KEYS_IN_ERROR else ""
        lines.append(f"{len(unmatched)} of {num_keys} keys map to no Linear layer of the model:\n  {shown}{more}")
    if problems:
        shown = "\n  ".join(problems[:_MAX_KEYS_IN_ERROR])
        more = f"\n  ... and {len(problems) - _MAX_KEYS_IN_ERROR} more" if len(problems) > _MAX_KEYS_IN_ERROR else ""
        lines.append(f"{len(problems)} invalid entries:\n  {shown}{more}")
    return "LoRA refused: " + "\n".join(lines)

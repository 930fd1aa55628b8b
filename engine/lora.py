"""A strict, removable LoRA loader for the MiniMax-H3 transformer (and any `nn.Module` built from `nn.Linear`s).

Why not just `transformer.load_lora_adapter(...)`? Three production lessons (see h3-facts §7): a fused-QKV LoRA crashed
because the split assumed equal q/k/v widths, a 5-step LoRA silently matched 0 of 266 layers, and an alpha-less LoRA ran
~16x too strong with no scale knob. This module therefore:

- parses every common layout into one internal form (`LayerDelta`: one A/B pair per target `nn.Linear`; the key
  layouts, the fused-QKV split, the FFN order and the alpha/rank rules are engine/lora_keys.py's),
- refuses (`LoraError`) any key that maps to nothing, any shape mismatch, and adapters that match 0 layers,
- reports what matched, the alpha/rank it used and the resulting effective scale (`LoraReport`),
- applies the adapter through hooks on its Linears (engine/hooks.py), so one process can switch baseline <-> turbo
  per request; `merge()` then folds it into the weights (the engine does, per request, for tiers whose
  `LoraSpec.merge` is on: a block then costs a dense one), and `LoraHandle.remove()` restores the exact base model
  (bitwise, through engine/weight_undo.py).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.hooks import ModelHook, add_hook, remove_hook
from engine.lora_keys import (
    LayerDelta,
    LoraError,
    LoraReport,
    alpha_rules,
    check_path,
    detect_format,
    find_linear,
    linear_layers,
    map_state_dict,
    read_header,
    split_key,
)
from engine.weight_undo import WeightRestoreError, WeightUndo, exact_matmul

logger = logging.getLogger(__name__)

__all__ = ["LoraAdapter", "LoraError", "LoraHandle", "LoraReport", "inspect_lora", "load_lora"]

LORA_HOOK = "h3_lora"

# --------------------------------------------------------------------------------------------------------------------
# Applying: hooks on the Linears, optional merge
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class _Piece:
    """A delta placed on a live Linear: rows `rows` of its output get `scale x factor x (x @ A.T) @ B.T`."""

    source: LayerDelta
    rows: slice | None  # None = all output rows
    down: torch.Tensor | None = None  # (rank, in_features), in the layer's dtype and on its device
    up: torch.Tensor | None = None  # (rows, rank), likewise

    def sync(self, weight: torch.Tensor) -> None:
        """(Re)cast A and B from the file's tensors to the layer's dtype/device, e.g. after `model.to("cuda")`."""
        if self.down is None or self.down.device != weight.device or self.down.dtype != weight.dtype:
            self.down = self.source.down.to(device=weight.device, dtype=weight.dtype)
            self.up = self.source.up.to(device=weight.device, dtype=weight.dtype)


@dataclass
class _LiveLayer:
    module: nn.Linear
    pieces: list[_Piece]
    undo: WeightUndo | None = None  # set while merged: restores the base weight exactly
    merged_scale: float | None = None  # the tier scale merged (the restore recomputes that delta)


# Models with an active handle, so two adapters never stack by accident (a per-request switch must remove first).
# Values are weak too: a handle refers to its model, and a strong value would keep the key alive forever.
_ACTIVE: weakref.WeakKeyDictionary[nn.Module, weakref.ref[LoraHandle]] = weakref.WeakKeyDictionary()


def _active_handle(model: nn.Module) -> LoraHandle | None:
    ref = _ACTIVE.get(model)
    handle = ref() if ref is not None else None
    return handle if handle is not None and handle.active else None


class LoraHandle:
    """An adapter applied to a model, unmerged, through hooks on its Linears. Use `remove()` or a `with` block.

    `remove()` leaves the model bitwise identical to before `apply()` (hooks removed, merged weights restored exactly
    through their `WeightUndo`). At scale 0 the hooks return the base output untouched, so the base model is
    reproduced exactly too.
    """

    def __init__(self, adapter: LoraAdapter, model: nn.Module, layers: list[_LiveLayer]):
        self.adapter = adapter
        self.model = model
        self._layers = layers
        self._removed = False
        for layer in layers:
            add_hook(layer.module, _LoraHook(self, layer), LORA_HOOK)

    def _with_delta(self, layer: _LiveLayer, x: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        """The layer's output `output` for input `x` plus this adapter's update (unchanged at scale 0 or merged)."""
        scale = self.adapter.tier_scale
        if scale == 0.0 or layer.undo is not None:
            return output  # scale 0 or merged: the base output is already right
        out = output
        for piece in layer.pieces:
            piece.sync(layer.module.weight)
            # (..., in) @ A.T -> (..., rank) @ B.T -> (..., rows); computed in the layer's dtype like peft does.
            delta = nn.functional.linear(nn.functional.linear(x.to(piece.down.dtype), piece.down), piece.up)
            delta = delta * (scale * piece.source.factor)
            if piece.rows is None:
                out = out + delta.to(out.dtype)
            else:
                out = out.clone() if out is output else out
                out[..., piece.rows] += delta.to(out.dtype)
        return out

    @property
    def active(self) -> bool:
        return not self._removed

    @property
    def merged_layers(self) -> int:
        return sum(layer.undo is not None for layer in self._layers)

    @property
    def undo_bytes(self) -> int:
        """Bytes of the merged layers' restore records (what engine/memory.py plans as the merge's undo)."""
        return sum(layer.undo.nbytes for layer in self._layers if layer.undo is not None)

    def set_scale(self, scale: float) -> None:
        """Same as `adapter.set_scale`: every handle of the adapter follows (merged layers are re-merged)."""
        self.adapter.set_scale(scale)

    @torch.no_grad()
    def merge(self, max_rounding_loss: float = 0.5) -> int:
        """Fold the update into the weights for speed; returns the number of layers merged.

        A layer is skipped (stays on its hook) when the weight dtype's rounding would lose more than `max_rounding_loss`
        of the update (SGLang's rule for bf16: `|realised - wanted| > 0.5 |wanted|`), or when its undo would need
        more than `weight_undo.PATCH_FRACTION` of its elements (the bound engine/memory.py plans for). Each merged
        layer keeps a `WeightUndo` (engine/weight_undo.py: the delta is recomputed to restore, and only the elements
        rounding lost are stored), so `unmerge()` / `remove()` restore the base weights bit for bit.
        """
        self._check_active()
        scale = self.adapter.tier_scale
        merged = 0
        for layer in self._layers:
            if layer.undo is not None:
                merged += 1
                continue
            weight = layer.module.weight
            wanted = self._delta(layer, scale)
            work = weight.to(torch.float32, copy=True).add_(wanted)
            new = work.to(weight.dtype, copy=True)
            lost = work.copy_(new).sub_(weight).sub_(wanted).norm()  # |realised - wanted|
            del work
            wanted_norm = wanted.norm()
            if wanted_norm == 0 or lost > max_rounding_loss * wanted_norm:
                continue
            undo = WeightUndo.record(weight, new, wanted)
            if undo is None:
                continue
            layer.undo, layer.merged_scale = undo, scale
            weight.copy_(new)
            merged += 1
        return merged

    @staticmethod
    def _delta(layer: _LiveLayer, scale: float) -> torch.Tensor:
        """The layer's whole update `scale x factor x B @ A` in float32 on its device: computed the same way, bit for
        bit, by `merge` and by `unmerge` (full-precision matmuls, from the file's tensors)."""
        weight = layer.module.weight
        with exact_matmul():
            wanted = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
            for piece in layer.pieces:
                rows = slice(None) if piece.rows is None else piece.rows
                # From the file's tensors in fp32, so a bf16 layer's merge is rounded once, at the end.
                up, down = piece.source.up.to(weight.device).float(), piece.source.down.to(weight.device).float()
                wanted[rows] += (scale * piece.source.factor) * (up @ down)
        return wanted

    @torch.no_grad()
    def unmerge(self) -> None:
        """Restore the exact original weights of merged layers; the hooks take over again. A layer whose restore
        fails its check (`WeightRestoreError`) is left merged and the error is raised after the others."""
        failed = None
        for layer in self._layers:
            if layer.undo is not None:
                try:
                    layer.undo.apply(layer.module.weight, self._delta(layer, layer.merged_scale))
                except WeightRestoreError as error:
                    failed = error
                    continue
                layer.undo = layer.merged_scale = None
        if failed is not None:
            raise failed

    def remove(self) -> None:
        """Unmerge and remove every hook: the model is bitwise the base model again. Idempotent."""
        if self._removed:
            return
        self.unmerge()
        for layer in self._layers:
            remove_hook(layer.module, LORA_HOOK)
        self._removed = True
        if _active_handle(self.model) is None:
            _ACTIVE.pop(self.model, None)
        self.adapter._handles.discard(self)

    def _check_active(self) -> None:
        if self._removed:
            raise LoraError("this LoRA handle was removed; apply the adapter again.")

    def __enter__(self) -> LoraHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


class _LoraHook(ModelHook):
    """One Linear's share of an applied adapter (engine/hooks.py): its output plus the low-rank update."""

    def __init__(self, handle: LoraHandle, layer: _LiveLayer):
        super().__init__()
        self.handle, self.layer = handle, layer

    def new_forward(self, module: nn.Linear, *args, **kwargs) -> torch.Tensor:
        output = self.fn_ref.original_forward(*args, **kwargs)
        return self.handle._with_delta(self.layer, args[0] if args else kwargs["input"], output)


class LoraAdapter:
    """A parsed, validated LoRA: `report`, `apply(model)`, `set_scale(s)`. Made by `load_lora`; holds no model."""

    def __init__(self, report: LoraReport, deltas: list[LayerDelta]):
        self.report = report
        self.deltas = deltas
        self._handles: weakref.WeakSet[LoraHandle] = weakref.WeakSet()

    @property
    def tier_scale(self) -> float:
        return self.report.tier_scale

    def set_scale(self, scale: float) -> None:
        """Set the explicit per-tier multiplier; live handles follow at their next forward (merged ones re-merge)."""
        scale = float(scale)
        if not math.isfinite(scale):
            raise LoraError(f"LoRA scale must be finite, got {scale}.")
        strongest = _strongest(self.deltas)
        self.report = dataclasses.replace(self.report, tier_scale=scale, effective_scale=scale * strongest.factor)
        for handle in list(self._handles):
            if handle.merged_layers:
                handle.unmerge()
                handle.merge()

    def apply(self, model: nn.Module) -> LoraHandle:
        """Hook the adapter into `model` (unmerged). Returns a `LoraHandle`; `handle.remove()` undoes it exactly."""
        if _active_handle(model) is not None:
            raise LoraError("another LoRA handle is active on this model; remove() it before applying a new one.")
        by_module: dict[int, _LiveLayer] = {}
        for delta in self.deltas:
            module, rows = _live_target(model, delta.module)
            out_features = module.out_features if rows is None else rows.stop - rows.start
            if (out_features, module.in_features) != (delta.up.shape[0], delta.down.shape[1]):
                raise LoraError(
                    f"{delta.module}: this model's layer is {(out_features, module.in_features)}, the adapter was "
                    f"mapped for {(delta.up.shape[0], delta.down.shape[1])}; load it against this model."
                )
            piece = _Piece(source=delta, rows=rows)
            piece.sync(module.weight)
            by_module.setdefault(id(module), _LiveLayer(module, [])).pieces.append(piece)
        handle = LoraHandle(self, model, list(by_module.values()))
        _ACTIVE[model] = weakref.ref(handle)
        self._handles.add(handle)
        return handle

    def __repr__(self) -> str:
        r = self.report
        return (
            f"LoraAdapter({r.path!r}, format={r.format}, matched {r.matched_layers}/{r.total_layers}, rank={r.rank}, "
            f"alpha={r.alpha}, effective_scale={r.effective_scale:g})"
        )


def _live_target(model: nn.Module, name: str) -> tuple[nn.Linear, slice | None]:
    """The Linear that computes `name` right now: itself, or a row slice of `to_qkv` after `fuse_qkv_projections()`."""
    module = find_linear(model, name)
    parent_name, _, leaf = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    if leaf in ("to_q", "to_k", "to_v") and getattr(parent, "fused_projections", False):
        fused = getattr(parent, "to_qkv", None)
        if isinstance(fused, nn.Linear):
            widths = [find_linear(parent, p).out_features for p in ("to_q", "to_k", "to_v")]
            start = sum(widths[: ("to_q", "to_k", "to_v").index(leaf)])
            return fused, slice(start, start + module.out_features)
    return module, None


def _strongest(deltas: list[LayerDelta]) -> LayerDelta:
    return max(deltas, key=lambda d: (abs(d.factor), d.rank))


# --------------------------------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------------------------------


def load_lora(path: str | Path, model: nn.Module, scale: float = 1.0, layout: str = "auto") -> LoraAdapter:
    """Parse a LoRA safetensors file, map it onto `model` and validate it. Does not modify the model.

    Args:
        path: A `.safetensors` file (anything else is refused).
        model: The model the adapter is meant for; only its module names and Linear shapes are read.
        scale: The explicit per-tier multiplier, on top of alpha / rank.
        layout: FFN gate order of the file: `"auto"` (metadata, then naming), `"diffusers"` (`[value; gate]`) or
            `"sglang"` (`[gate; value]`).

    Raises:
        LoraError: non-safetensors file; keys that map to no Linear layer; shape mismatches; 0 matched layers.
    """
    from safetensors.torch import load_file

    path = check_path(path)
    _, metadata = read_header(path)
    state_dict = load_file(str(path))
    mapping = map_state_dict(state_dict, metadata, model, layout)
    strongest = _strongest(mapping.deltas)
    if strongest.alpha is None:
        logger.warning("%s: no alpha in the file; using alpha = rank (factor 1.0).", path)
    report = LoraReport(
        path=str(path),
        format=mapping.format,
        matched_layers=len(mapping.deltas),
        total_layers=len(linear_layers(model)),
        rank=strongest.rank,
        alpha=strongest.alpha,
        effective_scale=float(scale) * strongest.factor,
        tier_scale=float(scale),
        untrained=metadata.get("h3_untrained", "").strip().lower() == "true",
        metadata=metadata,
    )
    adapter = LoraAdapter(report, mapping.deltas)
    adapter.set_scale(scale)  # validates the scale
    logger.info("%r", adapter)
    return adapter


def inspect_lora(path: str | Path) -> dict[str, Any]:
    """Cheap look at a LoRA file without a model (reads the header and the tiny `.alpha` scalars only).

    Returns:
        dict with `path`, `format`, `num_keys`, `num_layers` (A/B pairs), `rank` (largest), `alpha` (metadata or
        `.alpha` tensors; None if absent), `untrained`, `steps` (`h3_steps` or None) and `metadata`.
    """
    from safetensors import safe_open

    path = check_path(path)
    keys, metadata = read_header(path)
    ranks, alphas = set(), set()
    with safe_open(str(path), framework="pt") as f:
        for key in keys:
            parsed = split_key(key)
            if parsed and parsed[1] == "down":
                ranks.add(f.get_slice(key).get_shape()[0])
            elif parsed and parsed[1] == "alpha":
                alphas.add(float(f.get_tensor(key).float().reshape(-1)[0]))
    try:
        rules, _ = alpha_rules(metadata, {})
        meta_alpha = rules.network
    except LoraError:
        meta_alpha = None
    alpha = max(alphas) if alphas else meta_alpha
    return {
        "path": str(path),
        "format": detect_format(keys),
        "num_keys": len(keys),
        "num_layers": sum(1 for k in keys if (p := split_key(k)) and p[1] == "down"),
        "rank": max(ranks) if ranks else None,
        "alpha": alpha,
        "untrained": metadata.get("h3_untrained", "").strip().lower() == "true",
        "steps": int(metadata["h3_steps"]) if metadata.get("h3_steps", "").isdigit() else None,
        "metadata": metadata,
    }

"""What a checkpoint costs in memory, computed from its configs without reading a weight.

- Weights: every component is built on the meta device from its `config.json` with its real class
  (diffusers' MiniMax-H3 modules, transformers' Qwen3-VL through `engine.conditioner`) and its parameters are
  counted at the dtype they are served in (bf16, the transformer's `_keep_in_fp32_modules` in fp32).
- Activations: the real forward runs once under `FakeTensorMode` (shapes only, no memory, no arithmetic) while a
  dispatch mode adds up the bytes of the tensors alive at once (`LivePeak`). The transformer is run with one block
  at two packed lengths and fitted as `fixed + per_row · rows`: with no autograd graph the blocks run one after
  another, so the peak is one block's, whatever the depth. For the released config this gives 180.4 KB per row;
  the whole 50-block model under the same tracker gives a 79.20 GiB peak at 104,016 rows, against the 79.4 GiB
  `torch.cuda.max_memory_allocated` measured on the H200 (bench/results/step_bench.md). These figures are
  computed, not measured.

Fake tensors live on the CPU here, where attention dispatches to a flash-style kernel (linear in rows), like
cuDNN/flash on the GPU.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

GiB = 2**30
# Two packed lengths for the linear fit: long enough that per-row terms dominate, short enough to stay fast.
FIT_ROWS = (4096, 8192)


CLASS_OF = {"transformer": "MiniMaxH3Transformer3DModel", "vae": "AutoencoderKLMiniMaxH3",
            "audio_vae": "AutoencoderKLMiniMaxH3Audio"}


def _config(root: str | Path, folder: str) -> dict:
    """The component's config with the class's defaults filled in, so a checkpoint that spells out every value and
    one that leaves defaults out map to the same cached figures."""
    import inspect

    import diffusers

    config = json.loads((Path(root) / folder / "config.json").read_text())
    defaults = {name: parameter.default for name, parameter in
                inspect.signature(getattr(diffusers, CLASS_OF[folder]).__init__).parameters.items()
                if parameter.default is not inspect.Parameter.empty}
    merged = {**defaults, **{k: v for k, v in config.items() if not k.startswith("_")}}
    return json.loads(json.dumps(merged))  # tuples as lists, as config.json has them


class _FigureCache:
    """Computed figures by (what, config, shape, dtype): the shipped file first (the released configs, so a server
    or a test does not spend minutes in fake-tensor runs), then a per-user file, then compute and store."""

    SHIPPED = Path(__file__).with_name("footprint_figures.json")

    def __init__(self):
        self.user = Path(os.environ.get("H3_FOOTPRINT_CACHE", Path.home() / ".cache" / "h3-studio" / "footprint.json"))

    @staticmethod
    def _key(key) -> str:
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]

    def _read(self, path: Path) -> dict:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return {}

    def get(self, key):
        name = self._key(key)
        for path in (self.SHIPPED, self.user):
            entry = self._read(path).get(name)
            if entry is not None:
                return entry["value"]
        return None

    def put(self, key, value, path: Path | None = None):
        path = path or self.user
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            data = self._read(path)
            data[self._key(key)] = {"what": key[0], "value": value}
            path.write_text(json.dumps(data, indent=1, sort_keys=True))
        except OSError:
            pass  # a read-only home only costs a recomputation next time
        return value


_CACHE = _FigureCache()


@dataclass(frozen=True)
class ComponentSizes:
    """Bytes of each component as served. `transformer_unit` is the largest block (what FSDP gathers at once);
    `conditioner` is the pruned Qwen3-VL (layers 0..50, no head, no vision tower), `conditioner_unit` one of its
    decoder layers, `conditioner_full` the checkpoint as stored, `vision` its vision tower."""

    transformer: int
    transformer_unit: int
    conditioner: int
    conditioner_unit: int
    conditioner_full: int
    vision: int
    vae: int
    audio_vae: int
    # Technique name -> bytes a single-process engine keeps from load while a tier uses it (`resident_bytes` of
    # engine/techniques/: fp8's e4m3 copies of the block linears and their fp32 row scales).
    copies: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        sizes = {name: value for name, value in self.__dict__.items() if name != "copies"}
        sizes.update({f"{name}_copies": value for name, value in self.copies.items()})
        return {name: round(value / GiB, 3) for name, value in sizes.items()}


class LivePeak(TorchDispatchMode):
    """The largest number of bytes held at once by tensors created inside this mode (fake or real).

    `existing` (weights, inputs) are not counted, nor are views of them (`Linear` transposes its weight).
    """

    def __init__(self, existing=()):
        super().__init__()
        self.current = self.peak = 0
        self._seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        for tensor in existing:
            self._seen[tensor.untyped_storage()] = 0

    def _release(self, nbytes: int) -> None:
        self.current -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                if storage in self._seen:
                    continue  # a view of a tensor already counted
                self._seen[storage] = nbytes = storage.nbytes()
                self.current += nbytes
                weakref.finalize(storage, self._release, nbytes)
                self.peak = max(self.peak, self.current)
        return out


def _bytes(module: torch.nn.Module, dtype: torch.dtype, fp32_modules=()) -> int:
    """Parameter bytes with every parameter at `dtype`, except those under `fp32_modules` (float32)."""
    total = 0
    for name, parameter in module.named_parameters():
        keep = any(name == m or name.startswith(m + ".") for m in fp32_modules)
        total += parameter.numel() * (4 if keep else torch.empty(0, dtype=dtype).element_size())
    return total


def _diffusers_on_meta(class_name: str, folder: Path):
    import diffusers

    cls = getattr(diffusers, class_name)
    with torch.device("meta"):
        return cls.from_config(cls.load_config(folder))


def component_sizes(root: str | Path, dtype: torch.dtype = torch.bfloat16, techniques=()) -> ComponentSizes:
    """Sizes of the checkpoint at `root` from its configs alone (no weights needed), with what each of
    `techniques` (engine.techniques' registry, as engine/placement.py passes it) keeps from load."""
    from transformers import Qwen3VLForConditionalGeneration

    from engine.conditioner import PrunedQwen3VL, conditioner_config

    root = Path(root)
    transformer = _diffusers_on_meta("MiniMaxH3Transformer3DModel", root / "transformer")
    fp32 = tuple(getattr(transformer, "_keep_in_fp32_modules", None) or ())
    vae = _diffusers_on_meta("AutoencoderKLMiniMaxH3", root / "vae")
    audio_vae = _diffusers_on_meta("AutoencoderKLMiniMaxH3Audio", root / "audio_vae")
    with torch.device("meta"):
        pruned = PrunedQwen3VL(conditioner_config(root / "text_encoder"))
        full = Qwen3VLForConditionalGeneration(conditioner_config(root / "text_encoder", layer=10**6))
    return ComponentSizes(
        transformer=_bytes(transformer, dtype, fp32),
        transformer_unit=max(_bytes(block, dtype) for block in transformer.transformer_blocks),
        conditioner=_bytes(pruned, dtype),
        conditioner_unit=max(_bytes(layer, dtype) for layer in pruned.model.language_model.layers),
        conditioner_full=_bytes(full, dtype),
        vision=_bytes(full.model.visual, dtype),
        vae=_bytes(vae, dtype),
        audio_vae=_bytes(audio_vae, dtype),
        copies={technique.name: held for technique in techniques if (held := technique.resident_bytes(transformer))},
    )


@dataclass(frozen=True)
class MergeCost:
    """What merging a LoRA into the transformer for one request holds on the GPU (engine/lora.py `merge`):
    `undo`, the restore records of every target weight at their bound (engine/weight_undo.py `budget_bytes`), held
    from the merge to the restore, i.e. through the denoise; `workspace`, the transient of merging or restoring the
    largest target. `targets` is how the target modules were found: "file" (the adapter's keys and shapes map onto
    this model), "per block" (its module names do but not its shapes, e.g. the nano's adapter named for the released
    model: the same modules in every block) or "every linear" (nothing maps: the upper bound)."""

    undo: int
    workspace: int
    layers: int
    target_elements: int
    targets: str

    def to_dict(self) -> dict:
        return {"undo_GiB": round(self.undo / GiB, 3), "workspace_GiB": round(self.workspace / GiB, 3),
                "layers": self.layers, "target_elements": self.target_elements, "targets": self.targets}


def lora_targets(transformer: torch.nn.Module, path: str | Path) -> tuple[list[str], str]:
    """The Linears (module names) a merge of the LoRA file at `path` rewrites in `transformer` (meta is fine),
    read from the file's header and shapes only, and how they were found (`MergeCost.targets`)."""
    import re

    from safetensors import safe_open

    from engine.lora_keys import _build_vocabulary, _resolve, find_linear, linear_layers, split_key

    vocab, flat = _build_vocabulary(transformer)
    named, shapes_fit = set(), True
    try:
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                parsed = split_key(key)
                resolved = _resolve(parsed[0], vocab, flat) if parsed and parsed[1] != "alpha" else None
                if parsed is None or (resolved is None and parsed[1] != "alpha"):
                    shapes_fit = False
                    continue
                if resolved is None:
                    continue
                modules = resolved[1].modules
                named.update(modules)
                shape = f.get_slice(key).get_shape()
                layers = [find_linear(transformer, m) for m in modules]
                if parsed[1] == "down" and (len(shape) != 2 or shape[1] != layers[0].in_features):
                    shapes_fit = False
                if parsed[1] == "up" and (len(shape) != 2 or shape[0] != sum(x.out_features for x in layers)):
                    shapes_fit = False
    except Exception:  # noqa: BLE001  an unreadable file: the tier is unavailable anyway; plan for the worst
        named, shapes_fit = set(), False
    if named and shapes_fit:
        return sorted(named), "file"
    if named:
        kinds = {re.sub(r"^(transformer_blocks)\.\d+\.", r"\1.*.", name) for name in named}
        every = [name for name in linear_layers(transformer)
                 if re.sub(r"^(transformer_blocks)\.\d+\.", r"\1.*.", name) in kinds]
        return every, "per block"
    return list(linear_layers(transformer)), "every linear"


def merge_cost(root: str | Path, path: str | Path, dtype: torch.dtype = torch.bfloat16,
               transformer: torch.nn.Module | None = None) -> MergeCost:
    """The GPU memory of merging the LoRA at `path` into the checkpoint at `root` served in `dtype` (configs and
    the file's header only): computed from its target weights' sizes, not measured."""
    from engine.lora_keys import find_linear
    from engine.weight_undo import budget_bytes, workspace_bytes

    if transformer is None:
        transformer = _diffusers_on_meta("MiniMaxH3Transformer3DModel", Path(root) / "transformer")
    names, how = lora_targets(transformer, path)
    fp32 = tuple(getattr(transformer, "_keep_in_fp32_modules", None) or ())
    undo = workspace = elements = 0
    for name in names:
        weight = find_linear(transformer, name).weight
        served = torch.float32 if any(name == m or name.startswith(m + ".") for m in fp32) else dtype
        undo += budget_bytes(weight.numel(), served, tuple(weight.shape))
        workspace = max(workspace, workspace_bytes(weight.numel(), served))
        elements += weight.numel()
    return MergeCost(undo, workspace, len(names), elements, how)


@dataclass(frozen=True)
class RowCost:
    """Activation bytes of one transformer forward: `fixed + per_row · rows` (computed under fake tensors)."""

    fixed: float
    per_row: float

    def at(self, rows: int) -> int:
        return int(self.fixed + self.per_row * rows)


def _transformer_forward_peak(config: dict, rows: int, dtype: torch.dtype) -> int:
    """Peak live activation bytes of one forward of a 1-block transformer of `config` over `rows` packed rows."""
    import diffusers
    from torch._subclasses.fake_tensor import FakeTensorMode

    cls = diffusers.MiniMaxH3Transformer3DModel
    config = {**config, "num_layers": 1}
    text_rows, audio_rows = 64, 2 * 16
    video_rows = rows - text_rows - audio_rows
    patch = config["in_channels"] * int(torch.tensor(config["patch_size"]).prod())
    with FakeTensorMode(allow_non_fake_inputs=True):
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            model = cls.from_config(config)
        finally:
            torch.set_default_dtype(previous)
        for name in getattr(model, "_keep_in_fp32_modules", None) or ():
            module = getattr(model, name, None)
            for parameter in module.parameters() if module is not None else ():
                parameter.data = parameter.data.float()
        order = torch.arange(rows)
        inputs = dict(
            hidden_states=torch.randn(1, video_rows, patch), audio_hidden_states=torch.randn(1, audio_rows,
                                                                                            config["audio_in_channels"]),
            encoder_hidden_states=torch.randn(1, text_rows, config["text_dim"], dtype=dtype),
            timestep=torch.tensor([0.5, 0.8]), timestep_indices=torch.zeros(rows, dtype=torch.long),
            token_tags=torch.zeros(rows, dtype=torch.long), position_ids=torch.zeros(rows, 3),
            text_indices=order[:text_rows], audio_indices=order[text_rows:text_rows + audio_rows],
            video_indices=order[text_rows + audio_rows:],
        )
        tracker = LivePeak([*model.parameters(), *model.buffers(), *inputs.values()])
        with tracker, torch.no_grad():
            model(**inputs, return_dict=False)
    return tracker.peak


def transformer_row_cost(root: str | Path, dtype: torch.dtype = torch.bfloat16) -> RowCost:
    """The transformer's activation cost per packed row for the checkpoint at `root` (cached per config)."""
    config = _config(root, "transformer")
    key = ("transformer_rows", config, str(dtype))
    cached = _CACHE.get(key)
    if cached is None:
        (r0, p0), (r1, p1) = ((rows, _transformer_forward_peak(config, rows, dtype)) for rows in FIT_ROWS)
        per_row = (p1 - p0) / (r1 - r0)
        cached = _CACHE.put(key, [p0 - per_row * r0, per_row])
    return RowCost(*cached)


def _vae_decode_peak(config: dict, latent_shape: tuple[int, int, int], dtype: torch.dtype,
                     tile_batch: int) -> tuple[int, int]:
    """(peak live bytes, output pixels) of one video VAE decode of `latent_shape` (frames, height, width), the
    engine's way (engine/video_decode.py, `tile_batch` tiles per decoder call)."""
    import diffusers
    from torch._subclasses.fake_tensor import FakeTensorMode

    from engine.video_decode import decode_latents

    with FakeTensorMode(allow_non_fake_inputs=True):
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            vae = diffusers.AutoencoderKLMiniMaxH3.from_config(config)
        finally:
            torch.set_default_dtype(previous)
        latents = torch.randn(1, config["latent_channels"], *latent_shape, dtype=dtype)
        tracker = LivePeak([*vae.parameters(), *vae.buffers(), latents])
        with tracker, torch.no_grad():
            video = decode_latents(vae, latents, tile_batch=tile_batch)
        return tracker.peak, video.shape[2] * video.shape[3] * video.shape[4]


def vae_decode_cost(root: str | Path, latent_hw: tuple[int, int], dtype: torch.dtype = torch.bfloat16,
                    tile_batch: int | None = None) -> RowCost:
    """The video VAE decode's peak at a `latent_hw` canvas as `fixed + per_pixel · output pixels` (`.at(pixels)`).

    Decoded at the real canvas for 12 and 37 (5 s) latent frames: tiles bound the decoder's working set in space
    and the output grows with the frames, so the peak is linear in the frame count beyond the first windows (at 7
    frames, one window, it is not: the old 7/12 fit put a 5 s decode at 1.65 GiB where the run gives 2.43).
    """
    from engine.video_decode import CUDA_TILE_BATCH

    tile_batch = CUDA_TILE_BATCH if tile_batch is None else tile_batch  # the plan is for a GPU's decode
    config = _config(root, "vae")
    key = ("vae_decode", config, list(latent_hw), str(dtype), tile_batch)
    cached = _CACHE.get(key)
    if cached is None:
        (p0, n0), (p1, n1) = (_vae_decode_peak(config, (frames, *latent_hw), dtype, tile_batch) for frames in (12, 37))
        per_pixel = (p1 - p0) / (n1 - n0)
        cached = _CACHE.put(key, [p0 - per_pixel * n0, per_pixel])
    return RowCost(*cached)


def request_cost(root: str | Path, geometry, duration_seconds: float, text_tokens: int,
                 aspect_ratio: str = "16:9", short_edge: int | None = None, dtype: torch.dtype = torch.bfloat16,
                 sparse_kernel: str | None = None, tile_batch: int | None = None,
                 decode_fit_short_edge: int | None = None):
    """The activation estimate of one request (computed), as `engine.memory.RequestCost`.

    - denoise: the transformer forward at the packed length (`transformer_row_cost`) plus the loop's float32
      latents (rows, noise prediction, scheduler output, previous: 4 copies of the video and audio rows);
    - exchange: Ulysses' q/k/v all-to-all, sent and received (2 · 3 · rows · heads · head_dim values);
    - encode: the conditioner keeps every hidden state up to the one read ((layers + 1) · tokens · width) plus one
      layer's MLP (3 · tokens · intermediate);
    - decode: the video VAE (`vae_decode_cost`) plus the engine's float32 copies of the frames (2 · 3 · pixels);
    - `sparse_kernel`: the block-sparse backend the engine runs (kernels/sparse_backends.py); its `extra_bytes`
      at this packed length (what its call holds beside our kernel's, e.g. a peer layout's copies and block lists)
      are added to denoise;
    - `tile_batch`: the decode's tiles per call (default a GPU's; a CPU decodes one at a time);
    `decode_fit_short_edge`: take the decode's per-pixel fit at this short edge's canvas for every size (the CPU
    guard: a fake-tensor fit per new size costs a minute, and the peak per pixel barely moves with the size).
    """
    from engine.conditioner import conditioner_config
    from engine.layout import token_counts
    from engine.memory import RequestCost

    size = torch.empty(0, dtype=dtype).element_size()
    counts = token_counts(geometry, duration_seconds, aspect_ratio, short_edge, text_tokens)
    rows = counts["total_with_text"]
    transformer = json.loads((Path(root) / "transformer" / "config.json").read_text())
    inner = transformer["num_attention_heads"] * transformer["attention_head_dim"]
    patch = transformer["in_channels"] * math.prod(transformer["patch_size"])
    loop = 4 * 4 * (counts["video_rows"] * patch + counts["audio_rows"] * transformer["audio_in_channels"])
    text = conditioner_config(Path(root) / "text_encoder").text_config
    encode = ((text.num_hidden_layers + 1) * text_tokens * text.hidden_size
              + 3 * text_tokens * text.intermediate_size) * size
    pixels = counts["frames"] * counts["width"] * counts["height"]
    # The decode fit is taken at the model's 16:9 canvas and applied per pixel to every aspect (same area cap).
    fit_canvas = token_counts(geometry, duration_seconds, "16:9", decode_fit_short_edge or short_edge, 0)
    latent_hw = (fit_canvas["height"] // geometry.spatial_ratio, fit_canvas["width"] // geometry.spatial_ratio)
    backend = 0
    if sparse_kernel:
        from kernels import sparse_backends

        backend = sparse_backends.get(sparse_kernel).extra_bytes(rows, transformer["num_attention_heads"],
                                                                  transformer["attention_head_dim"], size)
    return RequestCost(
        label=f"{duration_seconds:g} s", rows=rows, encode=encode,
        denoise=transformer_row_cost(root, dtype).at(rows) + loop + backend,
        decode=vae_decode_cost(root, latent_hw, dtype, tile_batch).at(pixels) + 2 * 3 * pixels * 4,
        exchange=2 * 3 * rows * inner * size,
    )


SOL_ERROR_CHUNK = 4096  # engine/attention.py `relative_error`'s rows per float32 chunk


def sol_gate_bytes(rows: int, heads: int, head_dim: int, size: int) -> int:
    """What the Sol-Attn gate holds beside one sparse attention call while a trajectory is recorded
    (engine/attention.py): the dense reference's output (rows x heads x head_dim at the activation dtype) and its
    softmax statistics (the flash-style kernel's float32 log-sum-exp, heads x rows: no rows x rows scores), and
    `relative_error`'s float32 copies of both outputs and their difference for one chunk of rows. Every sparse call
    of a request runs at the same packed length, so this is the largest call's too."""
    chunk = min(rows, SOL_ERROR_CHUNK)
    return rows * heads * head_dim * size + heads * rows * 4 + 3 * chunk * heads * head_dim * 4


def request_gate_bytes(root: str | Path, cost, dtype: torch.dtype = torch.bfloat16) -> int:
    """`sol_gate_bytes` at a RequestCost's packed length for the transformer at `root`."""
    transformer = json.loads((Path(root) / "transformer" / "config.json").read_text())
    return sol_gate_bytes(cost.rows, transformer["num_attention_heads"], transformer["attention_head_dim"],
                          torch.empty(0, dtype=dtype).element_size())


def geometry_of(root: str | Path, pipeline_config: dict):
    """`engine.layout.ModelGeometry` from the configs alone (what `Components.geometry` gives once loaded)."""
    from engine.layout import ModelGeometry

    vae, transformer = _config(root, "vae"), _config(root, "transformer")
    return ModelGeometry(
        spatial_ratio=math.prod(vae["spatial_downsample_factors"]), frames_per_chunk=vae["clip_length"],
        latents_per_chunk=math.ceil(vae["clip_length"] / math.prod(vae["temporal_downsample_factors"])),
        patch_size=tuple(transformer["patch_size"]), video_latent_channels=vae["latent_channels"],
        audio_latent_channels=transformer["audio_in_channels"],
        audio_sample_rate=_config(root, "audio_vae")["sampling_rate"],
        canvas_short_edge=pipeline_config["canvas_short_edge"], canvas_max_pixels=pipeline_config["canvas_max_pixels"])


def main(argv: list[str] | None = None) -> int:
    """`python -m engine.footprint ROOT [--ship]`: print ROOT's sizes and computed activation figures for 5 s and
    14.375 s (what the techniques keep from load, e.g. fp8 copies: `python -m engine info --memory-only`); `--ship`
    stores the figures in engine/footprint_figures.json (the released configs' copy)."""
    import argparse

    from engine.components import DEFAULT_PIPELINE_CONFIG

    parser = argparse.ArgumentParser(prog="python -m engine.footprint")
    parser.add_argument("root")
    parser.add_argument("--ship", action="store_true")
    args = parser.parse_args(argv)
    if args.ship:
        _CACHE.user = _FigureCache.SHIPPED
    geometry = geometry_of(args.root, DEFAULT_PIPELINE_CONFIG)
    out = {"sizes_GiB": component_sizes(args.root).to_dict(), "requests": {}}
    for seconds in (5.0, 14.375):
        cost = request_cost(args.root, geometry, seconds, text_tokens=512)
        out["requests"][cost.label] = {k: (round(v / GiB, 3) if k not in ("label", "rows", "tier") else v)
                                       for k, v in cost.__dict__.items()}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

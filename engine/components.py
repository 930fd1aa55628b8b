"""Load MiniMax-H3 components: a checkpoint folder in diffusers' modular layout, or the embedded h3-nano.

Both paths load the same diffusers / transformers classes from local safetensors only; nothing touches a hub.
A missing or broken component is reported together with every other problem found, in one `ModelLoadError`.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.errors import ModelLoadError, RequestError
from engine.layout import ModelGeometry
from engine.prompt_guide import PromptGuide
from engine.tiles import DEFAULT_SPARSE_TILE, check_model_tile

NANO_PATH = Path(__file__).resolve().parent.parent / "assets" / "nano"
DEFAULT_PIPELINE_CONFIG = {"canvas_short_edge": 768, "canvas_max_pixels": 768 * 1344}
# The short edge a ref2va image reference is encoded at, relative to the canvas short edge (2048 / 768 for the
# released checkpoint). A checkpoint that sets a canvas but no reference edge (the nano: 128) gets the same ratio,
# so a reference is not encoded at 2048 pixels beside a 128-pixel video.
REFERENCE_EDGE_RATIO = 2048 / 768
# Hash whole files below this size; above it (a 62 GB checkpoint) hash the safetensors headers, sizes and samples.
FULL_HASH_LIMIT = 256 * 1024**2


@dataclass(frozen=True)
class ComponentSpec:
    folder: str
    kind: str  # "model" (safetensors weights), "scheduler", "tokenizer"
    class_name: str


COMPONENTS = (
    ComponentSpec("transformer", "model", "MiniMaxH3Transformer3DModel"),
    ComponentSpec("vae", "model", "AutoencoderKLMiniMaxH3"),
    ComponentSpec("audio_vae", "model", "AutoencoderKLMiniMaxH3Audio"),
    ComponentSpec("text_encoder", "model", "Qwen3VLForConditionalGeneration"),
    ComponentSpec("scheduler", "scheduler", "MiniMaxH3Scheduler"),
    ComponentSpec("audio_scheduler", "scheduler", "MiniMaxH3Scheduler"),
    ComponentSpec("tokenizer", "tokenizer", "Qwen2TokenizerFast"),
)


@dataclass
class Components:
    """Everything the stages need. `model_id` identifies the exact weights (a hash), `name` is for people."""

    transformer: torch.nn.Module
    vae: torch.nn.Module
    audio_vae: torch.nn.Module
    text_encoder: torch.nn.Module
    scheduler: object
    audio_scheduler: object
    tokenizer: object
    pipeline_config: dict
    name: str
    model_id: str
    path: str
    untrained: bool
    device: torch.device
    dtype: torch.dtype
    # ref2va's checkpoint partition (`transformer_ref/`); None when the checkpoint has none (see engine/tasks.py)
    transformer_ref: torch.nn.Module | None = None
    processor: object = None  # Qwen3-VL's image processing for keyframes and references, built on first use
    prompt_guide: PromptGuide | None = None  # the words the model was trained on (engine/prompt_guide.py), if known

    @property
    def geometry(self) -> ModelGeometry:
        return ModelGeometry(
            spatial_ratio=self.vae.spatial_compression_ratio,
            frames_per_chunk=self.vae.config.clip_length,
            latents_per_chunk=self.vae.tokens_chunk_size,
            patch_size=tuple(self.transformer.config.patch_size),
            video_latent_channels=self.vae.config.latent_channels,
            audio_latent_channels=self.audio_vae.config.latent_channels,
            audio_sample_rate=self.audio_vae.config.sampling_rate,
            canvas_short_edge=self.pipeline_config["canvas_short_edge"],
            canvas_max_pixels=self.pipeline_config["canvas_max_pixels"],
            sparse_tile=self.pipeline_config.get("sparse_tile", DEFAULT_SPARSE_TILE),
        )

    def parameter_counts(self) -> dict[str, int]:
        return {
            name: sum(p.numel() for p in getattr(self, name).parameters())
            for name in ("transformer", "vae", "audio_vae", "text_encoder")
        }


def _weight_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def check_checkpoint(path: Path) -> list[str]:
    """Every problem that would stop `load_components`, without loading any weights."""
    if not path.is_dir():
        return [f"{path} is not a directory"]
    problems = []
    for spec in COMPONENTS:
        folder = path / spec.folder
        if not folder.is_dir():
            problems.append(f"{spec.folder}/: missing ({spec.class_name})")
            continue
        if spec.kind == "model":
            if not (folder / "config.json").is_file():
                problems.append(f"{spec.folder}/config.json: missing")
            if not _weight_files(folder):
                unsafe = [p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt")]
                detail = f" (found {', '.join(unsafe)}; only safetensors are loaded)" if unsafe else ""
                problems.append(f"{spec.folder}/: no .safetensors weights{detail}")
        elif spec.kind == "scheduler" and not (folder / "scheduler_config.json").is_file():
            problems.append(f"{spec.folder}/scheduler_config.json: missing")
        elif spec.kind == "tokenizer" and not (folder / "tokenizer.json").is_file():
            problems.append(f"{spec.folder}/tokenizer.json: missing")
    for config in path.glob("*/config.json"):
        try:
            json.loads(config.read_text())
        except (OSError, json.JSONDecodeError) as error:
            problems.append(f"{config.relative_to(path)}: not valid JSON ({error})")
    return problems


def model_id_for(path: Path) -> str:
    """A short hash of the weights and configs, so clips from different weights never compare as the same model."""
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in (".safetensors", ".json"))
    total = sum(p.stat().st_size for p in files)
    for file in files:
        digest.update(str(file.relative_to(path)).encode())
        digest.update(str(file.stat().st_size).encode())
        with file.open("rb") as handle:
            if total <= FULL_HASH_LIMIT or file.suffix == ".json":
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
            else:
                # safetensors header (names, shapes, offsets) plus the first and last MiB of data.
                header_len = int.from_bytes(handle.read(8), "little")
                digest.update(handle.read(min(header_len, 100 << 20)))
                digest.update(handle.read(1 << 20))
                handle.seek(max(0, file.stat().st_size - (1 << 20)))
                digest.update(handle.read())
    return digest.hexdigest()[:16]


def _load_one(spec: ComponentSpec, folder: Path, dtype: torch.dtype, device: torch.device):
    import diffusers
    import transformers

    if spec.kind == "tokenizer":
        return transformers.Qwen2TokenizerFast.from_pretrained(folder, local_files_only=True)
    if spec.kind == "scheduler":
        return diffusers.MiniMaxH3Scheduler.from_pretrained(folder, local_files_only=True)
    if spec.folder == "text_encoder":  # only what H3 runs: layers 0..50, no LM head, vision on first image
        from engine.conditioner import load_conditioner

        return load_conditioner(folder, dtype, device)
    cls = getattr(diffusers, spec.class_name, None) or getattr(transformers, spec.class_name)
    model = cls.from_pretrained(folder, torch_dtype=dtype, use_safetensors=True, local_files_only=True)
    return model.to(device).eval().requires_grad_(False)


def quiet_libraries() -> None:
    """Keep library progress bars and deprecation chatter out of CLI output and server logs."""
    import warnings

    import diffusers
    import transformers

    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message=".*weight_norm.*", category=FutureWarning)


def load_components(path: str | os.PathLike | None = None, device: str | None = None,
                    dtype: torch.dtype | None = None, placement: dict[str, str | None] | None = None) -> Components:
    """Load a checkpoint folder, or the embedded h3-nano when `path` is None.

    Defaults: CUDA + bfloat16 when a GPU is present, else CPU + float32. Raises `ModelLoadError` listing every
    missing or broken component. `placement` overrides the device of a component folder; `None` there skips
    loading it (parallel workers: the transformer is loaded on the CPU and sharded onto the GPU by FSDP, and only
    rank 0 holds the text encoder).
    """
    quiet_libraries()
    root = Path(path) if path is not None else NANO_PATH
    device_obj = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = dtype or (torch.bfloat16 if device_obj.type == "cuda" else torch.float32)
    problems = check_checkpoint(root)
    if problems:
        raise ModelLoadError(str(root), problems)
    studio_file = root / "h3_studio.json"
    studio = json.loads(studio_file.read_text()) if studio_file.is_file() else {}
    prompt_guide = PromptGuide.load(root, studio.get("name", root.name))  # a broken guide stops here, before weights
    pipeline_config = {**DEFAULT_PIPELINE_CONFIG, **studio.get("pipeline", {})}
    if "sparse_tile" in pipeline_config:  # before any weights load
        try:
            check_model_tile(pipeline_config["sparse_tile"])
        except RequestError as error:
            raise ModelLoadError(str(root), [f"h3_studio.json: {error}"]) from None

    loaded, problems = {}, []
    placement = placement or {}
    for spec in COMPONENTS:
        target = placement.get(spec.folder, device_obj)
        if target is None:
            loaded[spec.folder] = None
            continue
        try:
            loaded[spec.folder] = _load_one(spec, root / spec.folder, dtype, torch.device(target))
        except Exception as error:  # noqa: BLE001 - every failure is collected and reported together
            problems.append(f"{spec.folder}/: failed to load {spec.class_name}: {type(error).__name__}: {error}")
    if problems:
        raise ModelLoadError(str(root), problems)

    if "reference_image_short_edge" not in pipeline_config:
        multiple = 32
        edge = pipeline_config["canvas_short_edge"] * REFERENCE_EDGE_RATIO
        pipeline_config["reference_image_short_edge"] = max(multiple, round(edge / multiple) * multiple)
    transformer_ref = None
    ref_folder = root / "transformer_ref"
    if ref_folder.is_dir() and placement.get("transformer", device_obj) is not None:
        spec = ComponentSpec("transformer_ref", "model", "MiniMaxH3Transformer3DModel")
        try:
            transformer_ref = _load_one(spec, ref_folder, dtype, torch.device(placement.get("transformer", device_obj)))
        except Exception as error:  # noqa: BLE001 - reported like every other component
            raise ModelLoadError(str(root),
                                 [f"transformer_ref/: failed to load: {type(error).__name__}: {error}"]) from error
    text_layers = loaded["text_encoder"].config.text_config.num_hidden_layers if loaded["text_encoder"] else None
    if text_layers is not None and text_layers <= 50:
        raise ModelLoadError(str(root),
                             [f"text_encoder/: has {text_layers} decoder layers; H3 reads hidden_states[50]"])
    return Components(
        **loaded,
        pipeline_config=pipeline_config,
        name=studio.get("name", root.name),
        model_id=model_id_for(root),
        path=str(root),
        untrained=bool(studio.get("untrained", False)),
        device=device_obj,
        dtype=dtype,
        transformer_ref=transformer_ref,
        prompt_guide=prompt_guide,
    )

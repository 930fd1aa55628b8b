"""How long a request will hold the engine, estimated before it queues: a measured cost model per device kind.

    seconds = steps · (overhead_s + FLOP per step / flop_per_s) + decode_s_per_pixel · output pixels

FLOP per step is the transformer's forward at the request's packed length S, from the checkpoint's config (the
formula of bench/results/step_bench.md): 2·S·layers·(4·hidden·inner + 3·hidden·ffn) for the projections and the
SwiGLU FFN, plus 4·S²·inner·layers for attention, so a larger canvas or a longer clip costs what it really costs
(attention grows with the square of the length). `overhead_s` is what a step costs beyond that (Python, small
kernels): most of a nano step on a CPU, nothing measurable at full size on a GPU.

The figures per device kind (cost_figures.json) are measured, each with its date, command and raw file:
- cpu: the h3-nano's step times at four canvases on the 2-core machine this project runs on, fitted by least
  squares (bench/cost_bench.py); another CPU is faster or slower by its own factor;
- cuda: the full-size step on one H200 (bench/results/step_bench.md: 548-562 TFLOP/s dense) and its batched VAE
  decode (bench/results/vae_decode_bench_h200.json); a sequence-parallel group of N GPUs divides the steps by N.
The estimate is what the studio compares with its --max-job-seconds before a job is queued; nothing here runs
the model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

FIGURES_FILE = Path(__file__).with_name("cost_figures.json")


@dataclass(frozen=True)
class DeviceCost:
    """One device kind's measured figures (see the module docstring)."""

    kind: str  # "cpu" | "cuda"
    overhead_s: float  # per denoising step, beyond its FLOP
    flop_per_s: float  # the transformer's achieved rate
    decode_s_per_pixel: float  # video VAE decode + audio + mux, per output pixel (frames · width · height)
    source: str  # where the figures come from (date, command, raw file)
    # what block-sparse attention costs in dense attention FLOP: above 1 on the CPU, where it is the torch reference
    # (dense fp32 scores plus an S x S mask, a cost that grows with the square of the length like attention's);
    # 1 on the GPU, where the kernel is faster than dense (counting it dense errs long)
    sparse_attention_factor: float = 1.0

    @classmethod
    def load(cls, kind: str, path: Path = FIGURES_FILE) -> DeviceCost:
        figures = json.loads(Path(path).read_text())[kind]
        return cls(kind, float(figures["overhead_s"]), float(figures["flop_per_s"]),
                   float(figures["decode_s_per_pixel"]), figures["source"],
                   float(figures.get("sparse_attention_factor", 1.0)))


@dataclass(frozen=True)
class TransformerShape:
    """The transformer config's numbers the FLOP count needs."""

    layers: int
    hidden: int
    inner: int  # heads · head_dim
    ffn: int

    @classmethod
    def of(cls, config: dict) -> TransformerShape:
        return cls(config["num_layers"], config["hidden_size"],
                   config["num_attention_heads"] * config["attention_head_dim"], config["ffn_dim"])

    def step_flop(self, rows: int, attention_factor: float = 1.0) -> float:
        """FLOP of one forward over `rows` packed rows (projections, FFN, attention; norms and AdaLN left out);
        `attention_factor` scales the attention's share (a sparse step's cost in dense FLOP)."""
        linear = 2.0 * rows * self.layers * (4 * self.hidden * self.inner + 3 * self.hidden * self.ffn)
        return linear + attention_factor * 4.0 * rows * rows * self.inner * self.layers


@dataclass(frozen=True)
class Estimate:
    """A request's estimated engine time and what drives it."""

    seconds: float
    steps: int
    rows: int
    step_s: float
    decode_s: float
    width: int
    height: int
    frames: int
    device: DeviceCost
    sparse_steps: int = 0

    def describe(self) -> str:
        factor = self.device.sparse_attention_factor
        sparse = (f" ({self.sparse_steps} of them block-sparse: attention × {factor:g} on this device)"
                  if self.sparse_steps and factor != 1.0 else "")
        return (f"{self.steps} steps × {self.step_s:.3g} s at {self.rows:,} packed rows ({self.width}×{self.height}, "
                f"{self.frames} frames){sparse} + {self.decode_s:.3g} s decoding ≈ {self.seconds:,.0f} s")

    def to_dict(self) -> dict:
        return {"seconds": round(self.seconds, 3), "steps": self.steps, "rows": self.rows,
                "step_s": round(self.step_s, 6), "decode_s": round(self.decode_s, 3), "width": self.width,
                "height": self.height, "frames": self.frames, "sparse_steps": self.sparse_steps,
                "figures": self.device.kind}


@dataclass(frozen=True)
class CostModel:
    """The estimate of one model on one device kind; `world`: the GPUs a sequence-parallel group splits steps over."""

    shape: TransformerShape
    device: DeviceCost
    world: int = 1

    def estimate(self, steps: int, rows: int, width: int, height: int, frames: int,
                 sparse_steps: int = 0) -> Estimate:
        """`sparse_steps` of the `steps` run block-sparse attention (at the device's sparse_attention_factor)."""
        def one_step(attention_factor: float) -> float:
            flop = self.shape.step_flop(rows, attention_factor)
            return (self.device.overhead_s + flop / self.device.flop_per_s) / self.world

        step_s = one_step(1.0)
        decode_s = self.device.decode_s_per_pixel * width * height * frames
        denoise_s = (steps - sparse_steps) * step_s + sparse_steps * one_step(self.device.sparse_attention_factor)
        return Estimate(denoise_s + decode_s, steps, rows, step_s, decode_s, width, height, frames, self.device,
                        sparse_steps)




def cost_model(transformer_config: dict, device_type: str, world: int = 1) -> CostModel:
    """The cost model of a transformer (its config) on a device type ("cuda" or anything else: the CPU figures)."""
    device = DeviceCost.load("cuda" if device_type == "cuda" else "cpu")
    return CostModel(TransformerShape.of(transformer_config), device, world)


__all__ = ["CostModel", "DeviceCost", "Estimate", "TransformerShape", "cost_model"]

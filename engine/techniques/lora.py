"""The LoRA technique: a tier's `lora` field ([tier.lora] path, scale, merge). A turbo tier's distilled adapter
is applied for one request on hooks and, where the tier merges it, folded into the weights and restored bit for
bit afterwards. The adapter machinery (formats, key mapping, the exact restore) is engine/lora.py's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from engine.errors import RequestError
from engine.techniques.base import Applied, Knob, Run, Technique

# Relative LoRA paths resolve under ASSETS / "loras" (a test points it at another copy of the assets).
ASSETS = Path(__file__).resolve().parent.parent.parent / "assets"


@dataclass(frozen=True)
class LoraSpec:
    path: str  # relative paths resolve against assets/loras
    scale: float = 1.0
    # Fold the update into the weights for each request (a block then costs a dense one; the base weights are
    # restored exactly afterwards, engine/weight_undo.py). False: unmerged hooks, one extra low-rank pair per Linear.
    merge: bool = True

    def resolved(self) -> Path:
        path = Path(self.path)
        return path if path.is_absolute() else ASSETS / "loras" / path


class Lora(Technique):
    name = "lora"
    field = "lora"
    spec = LoraSpec
    knobs = (
        Knob("lora.scale", "float", 1.0, "strength of the adapter's update (1 = as trained)", low=0.0, high=2.0,
             technique="lora"),
        Knob("lora.merge", "bool", True, "fold the update into the weights per request (else hooks, slower)",
             technique="lora"),
    )
    remove_failure = "a merged LoRA's base weights could not be restored bit for bit"

    def __init__(self):
        self._adapters: dict[tuple[str, float, int], object] = {}  # one per file, scale and transformer it hooks

    @classmethod
    def label(cls, spec: LoraSpec) -> str:
        return f"LoRA ×{spec.scale:g}" + (" merged" if spec.merge else "")

    @classmethod
    def check(cls, tier, where: str) -> None:
        if tier.lora.scale < 0:
            raise RequestError("tier.lora.scale", f"{where}: scale must be ≥ 0")

    @classmethod
    def unavailable(cls, tier, steps: int) -> str | None:
        if not tier.lora.resolved().is_file():
            return f"LoRA file missing: {tier.lora.resolved()}"
        return None

    @classmethod
    def request_memory(cls, spec: LoraSpec, root, transformer, dtype):
        """A merging tier holds the restore records of every target weight through the denoise
        (engine/footprint.py `merge_cost`, from the adapter's header)."""
        if not spec.merge:
            return None
        from engine.footprint import merge_cost

        return merge_cost(root, spec.resolved(), dtype, transformer)

    def install(self, run: Run) -> Applied:
        spec = run.plan.tier.lora
        adapter = self._adapter(spec, run.transformer)
        handle = adapter.apply(run.transformer)
        report = adapter.report.to_dict()
        report["merged_layers"] = 0
        # FSDP shards (DTensors, sequence-parallel ranks) stay on the hooks.
        return _Applied(handle, report, merge=spec.merge and run.parallel is None)

    def _adapter(self, spec: LoraSpec, transformer):
        from engine.lora import load_lora

        path = str(spec.resolved())
        key = (path, spec.scale, id(transformer))  # ref2va hooks its own partition (transformer_ref)
        if key not in self._adapters:
            self._adapters[key] = load_lora(Path(path), transformer, scale=spec.scale)
        return self._adapters[key]


class _Applied(Applied):
    def __init__(self, handle, report: dict, merge: bool):
        super().__init__()
        self.handle, self._report, self.merge = handle, report, merge

    def activate(self) -> None:
        """Fold the update into the weights for this request, so a block costs what a dense one does; the base
        weights come back bit for bit in `remove` (also after a merge that failed half-way)."""
        if self.merge:
            start = time.perf_counter()
            self._report["merged_layers"] = self.handle.merge()
            self._report["merge_s"] = time.perf_counter() - start
            self._report["undo_bytes"] = self.handle.undo_bytes

    def remove(self) -> None:
        start = time.perf_counter()
        self.handle.remove()  # a failure (WeightRestoreError, out of memory) stops the engine serving
        if self._report["merged_layers"]:
            self._report["restore_s"] = time.perf_counter() - start

    def report(self) -> dict:
        return self._report

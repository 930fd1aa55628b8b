"""compare_clips: every quality measure of a baseline/candidate pair, and the summary the CLI and studio show.

Data path: check (or, with align, reconcile) the pair -> one full-resolution pass per frame pair (PSNR, SSIM,
sharpness, abs-diff, analysis planes) -> per-clip motion (flow-warping error, speed) -> temporal consistency
(candidate against baseline, with the baseline's flow) -> ghost detector -> FLIP maps -> LPIPS -> audio -> gates
-> subject track (subject.py: the baseline's subject, measured in the candidate) -> gates (applied when the summary
is built from the per-frame series, so changing `gates` needs no recomputation).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from itertools import repeat
from typing import Any

import cv2
import numpy as np

from .analysis import analysis_factor, stack_planes
from .audio import AudioComparison, compare_audio
from .clipio import ClipData
from .errors import QualityError
from .flip_metric import flip_available, flip_frame
from .gates import GateInputs, Gates, evaluate, ghost_flags, worst_frame
from .ghost import GhostParams, GhostResult, detect_ghosts
from .lpips_metric import LpipsScorer, load_lpips
from .metrics import BaselineMotionCache, frame_pass, jitter_ratio, motion, per_frame_jitter
from .subject import SubjectTrack, track_subject
from .temporal import temporal_consistency, temporal_errors
from .windows import runs


@dataclass
class Comparison:
    """Everything measured for one pair. Per-frame arrays are (T,); T is the compared frame count.

    absdiff: uint8 (T, H, W), max over channels of |candidate - baseline| at full resolution.
    ghost.heatmaps: float32 (T, h, w) in [0, 1] on the analysis grid (h = H / factor); `ghost_heatmap(i)` gives
    one at full resolution. lpips is None (with lpips_reason) when LPIPS could not run.
    flip: float32 (T,) mean FLIP error per frame, flip_maps: float32 (T, h, w) in [0, 1] on the analysis grid
    (`flip_map(i)` gives one at full resolution); both None (with flip_reason) when FLIP did not run.
    temporal_error: float32 (T,) flow-warped frame-to-frame error against the baseline (temporal.py), 0 at t = 0.
    """

    baseline: ClipData
    candidate: ClipData
    psnr: np.ndarray
    ssim: np.ndarray
    sharpness_base: np.ndarray
    sharpness_cand: np.ndarray
    warp_error_base: np.ndarray
    warp_error_cand: np.ndarray
    absdiff: np.ndarray
    ghost: GhostResult
    factor: int
    temporal_error: np.ndarray | None = None
    flip: np.ndarray | None = None
    flip_maps: np.ndarray | None = None
    flip_reason: str | None = None
    lpips: np.ndarray | None = None
    lpips_reason: str | None = None
    audio: AudioComparison | None = None
    audio_reason: str | None = None
    gates: Gates = field(default_factory=Gates)
    notes: list[str] = field(default_factory=list)
    subject: SubjectTrack | None = None

    @property
    def frames(self) -> int:
        return len(self.psnr)

    def ghost_heatmap(self, index: int) -> np.ndarray:
        """float32 (H, W) in [0, 1]: frame `index`'s ghost heatmap at full resolution."""
        width, height = self.baseline.size
        return cv2.resize(self.ghost.heatmaps[index], (width, height), interpolation=cv2.INTER_LINEAR)

    def flip_map(self, index: int) -> np.ndarray:
        """float32 (H, W) in [0, 1]: frame `index`'s FLIP error map at full resolution (FLIP must have run)."""
        if self.flip_maps is None:
            raise QualityError(f"no FLIP maps: {self.flip_reason}")
        width, height = self.baseline.size
        return cv2.resize(self.flip_maps[index], (width, height), interpolation=cv2.INTER_LINEAR)

    @property
    def flip_mean(self) -> float | None:
        return None if self.flip is None else float(self.flip.mean())

    @property
    def temporal_consistency(self) -> float | None:
        return None if self.temporal_error is None else temporal_consistency(self.temporal_error)

    @property
    def sharpness_ratio(self) -> float:
        return float((self.sharpness_cand.mean() + 1e-6) / (self.sharpness_base.mean() + 1e-6))

    @property
    def temporal_jitter_ratio(self) -> float | None:
        return jitter_ratio(self.warp_error_base, self.warp_error_cand)

    @property
    def lpips_delta(self) -> float | None:
        return None if self.lpips is None else float(self.lpips.mean())

    @property
    def subject_flip(self) -> np.ndarray | None:
        """float64 (T,): mean FLIP inside the baseline subject's box; None without FLIP or subject."""
        if self.subject is None or self.flip_maps is None:
            return None
        return self.subject.region_mean(self.flip_maps)

    def _heat_near_subject(self, frames: np.ndarray):
        """(t, heat, near) for each of `frames` where the subject is measured: the ghost heatmap on the subject's
        grid and the region within the subject search radius of the baseline's subject."""
        track = self.subject
        h, w = track.masks.shape[1:]
        radius = max(1, int(round(track.params.search * min(h, w))))
        kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * radius + 1, 2 * radius + 1))
        for t in frames:
            if not track.measured[t]:
                continue
            heat = self.ghost.heatmaps[t]
            if heat.shape != (h, w):
                heat = cv2.resize(heat, (w, h), interpolation=cv2.INTER_LINEAR)
            yield t, heat, cv2.dilate(track.masks[t].astype(np.uint8), kernel).astype(bool)

    @cached_property
    def ghost_near_subject(self) -> np.ndarray:
        """float32 (T,): the ghost score where the detector's evidence lies near the baseline's subject (within the
        subject search radius), 0 elsewhere: ghosting is a copy of a moving subject, and evidence far from it (a
        textured background's false matches) is not one. Frames without a subject keep their score."""
        scores = self.ghost.scores.astype(np.float32).copy()
        if self.subject is None:
            return scores
        for t, heat, near in self._heat_near_subject(np.flatnonzero(scores > 0)):
            total = float(heat.sum())
            if total <= 0 or float(heat[near].sum()) < 0.5 * total:
                scores[t] = 0.0
        return scores

    @cached_property
    def ghost_subject_share(self) -> np.ndarray:
        """float64 (T,): the detector's evidence near the subject as a share of the baseline subject's area; NaN
        where no subject is measured. The gates ask a frame's copy to cover some of the subject: on clean nano pairs
        the detector fires on small bumps of an outline that wobbles between runs (2-13 % of the subject)."""
        return self._ghost_share(anywhere=False)

    def _ghost_share(self, anywhere: bool) -> np.ndarray:
        share = np.full(self.frames, np.nan)
        if self.subject is None:
            return share
        for t, heat, near in self._heat_near_subject(range(self.frames)):
            evidence = heat > 0 if anywhere else (heat > 0) & near
            share[t] = np.count_nonzero(evidence) / max(1, int(self.subject.masks[t].sum()))
        return share

    @property
    def worst_frame(self) -> int:
        """The frame to look at first: the first failed gate's worst frame, else the lowest-SSIM frame."""
        table, _, _ = evaluate(self._gate_inputs(), self.gates)
        return worst_frame(table, int(np.argmin(self.ssim)))[0]

    def summary(self) -> dict[str, Any]:
        """The JSON summary (see the CLI): headline numbers, gates, suggested verdict and per-frame rows. The
        summary, the per-frame rows and the gates read the same series, so they name the same frames."""
        inputs = self._gate_inputs()
        table, verdict, reasons = evaluate(inputs, self.gates)
        worst, worst_by = worst_frame(table, int(np.argmin(self.ssim)))
        ghost = inputs.series["ghost_score"]
        peak = int(np.argmax(ghost))
        jitter = self.temporal_jitter_ratio
        return {
            "frames": self.frames,
            "ghosting": table["ghosting"]["value"] >= table["ghosting"]["limit"],  # flagged, failing or not
            "ghost_score": round(float(ghost[peak]), 4),
            "ghost_peak_frame": peak,
            "worst_frame": worst,
            "worst_by": worst_by,
            **self._subject_summary(table),
            "psnr_mean": round(float(self.psnr.mean()), 3),
            "ssim_mean": round(float(self.ssim.mean()), 5),
            "lpips_delta": None if self.lpips_delta is None else round(self.lpips_delta, 5),
            "sharpness_ratio": round(self.sharpness_ratio, 4),
            "temporal_jitter_ratio": None if jitter is None else round(jitter, 4),
            "temporal_consistency": _round(self.temporal_consistency, 4),
            "flip": _round(self.flip_mean, 5),
            "flip_reason": self.flip_reason,
            "audio": None if self.audio is None else self.audio.to_dict(),
            "per_frame": self._per_frame(),
            "gates": table,
            "suggested_verdict": verdict,
            "suggestion_reasons": reasons,
            "lpips_reason": self.lpips_reason,
        }

    def _subject_summary(self, table: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """The subject figures a reviewer reads, as the gates measured them (worst windows)."""
        return {
            "subject_lost_frames": None if self.subject is None or not self.subject.measured.any()
            else [list(span) for span in runs(self.subject.lost)],
            "subject_present": table["subject_present"]["value"],
            "subject_displacement_px": table["subject_moved"]["value"],
            "subject_fragments": table["subject_fragments"]["value"],
            "subject_colour_delta": table["subject_colour"]["value"],
            "subject_patch": table["subject_patch"]["value"],
            "subject_flip": table["subject_flip"]["value"],
        }

    def _series(self) -> dict[str, np.ndarray]:
        if self.gates.ghost_near_subject:
            score, share = self.ghost_near_subject, self.ghost_subject_share
        else:
            score, share = self.ghost.scores, self._ghost_share(anywhere=True)
        series: dict[str, np.ndarray] = {"ghost_score": score.astype(np.float64),
                                         "ghost_lag": np.where(score > 0, self.ghost.lags, 0).astype(np.float64),
                                         "ghost_subject_share": share}
        if self.flip is not None:
            series["flip"] = self.flip.astype(np.float64)
        if self.subject is not None:
            track = self.subject
            series.update(subject_present=track.present, subject_displacement_px=track.displacement_px,
                          subject_size_px=np.sqrt(track.base_area),
                          subject_fragments=np.maximum(track.fragments - track.base_fragments, 0),
                          subject_colour_delta=track.colour_delta, subject_patch=track.patch)
            flip = self.subject_flip
            if flip is not None:
                series["subject_flip"] = flip
        return series

    def _gate_inputs(self) -> GateInputs:
        return GateInputs(
            lpips_delta=None if self.lpips_delta is None else round(self.lpips_delta, 5),
            lpips_reason=self.lpips_reason,
            sharpness_ratio=round(self.sharpness_ratio, 4),
            temporal_jitter_ratio=None if self.temporal_jitter_ratio is None else round(self.temporal_jitter_ratio,
                                                                                          4),
            ghost_threshold=self.ghost.params.frame_threshold,
            audio_desync_ms=None if self.audio is None or self.audio.desync_ms is None
            else round(self.audio.desync_ms, 1),
            audio_reason=self.audio_reason or (self.audio and self.audio.desync_reason),
            psnr_mean=round(float(self.psnr.mean()), 3),
            flip_mean=_round(self.flip_mean, 5),
            flip_reason=self.flip_reason,
            temporal_consistency=_round(self.temporal_consistency, 4),
            series=self._series(),
            subject_lost_below=self.subject.params.lost_below if self.subject is not None else 0.25,
            subject_reason=None if self.subject is None else (
                None if self.subject.measured.any() else "no subject stands out in the baseline"),
        )

    def _per_frame(self) -> list[dict[str, Any]]:
        jitter = per_frame_jitter(self.warp_error_base, self.warp_error_cand)
        g = self.ghost
        near = self.ghost_near_subject
        subject = self._series()
        flagged = ghost_flags(subject, g.params.frame_threshold, self.gates)
        rows = []
        for i in range(self.frames):
            rows.append({
                "index": i,
                "psnr": round(float(self.psnr[i]), 3),
                "ssim": round(float(self.ssim[i]), 5),
                "lpips": None if self.lpips is None else round(float(self.lpips[i]), 5),
                "sharpness_ratio": round(float((self.sharpness_cand[i] + 1e-6) / (self.sharpness_base[i] + 1e-6)), 4),
                "jitter_ratio": round(float(jitter[i]), 4),
                "temporal_error": None if self.temporal_error is None else round(float(self.temporal_error[i]), 4),
                "flip": None if self.flip is None else round(float(self.flip[i]), 5),
                "ghost_score": round(float(g.scores[i]), 4),
                "ghost_lag": int(g.lags[i]),
                "ghost_displacement_px": round(float(g.displacement[i]) * self.factor, 1),
                "ghost": bool(flagged[i]),
                "ghost_away_from_subject": bool(g.scores[i] >= g.params.frame_threshold and near[i] == 0),
                **{key: _finite(subject[key][i], 3) for key in SUBJECT_SERIES if key in subject},
                "subject_lost": bool(self.subject is not None and self.subject.lost[i]),
            })
        return rows


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


SUBJECT_SERIES = ("subject_present", "subject_displacement_px", "subject_fragments", "subject_colour_delta",
                  "subject_patch", "subject_flip")


def _finite(value: float, digits: int) -> float | None:
    return round(float(value), digits) if np.isfinite(value) else None


def reconcile(baseline: ClipData, candidate: ClipData, align: bool) -> tuple[ClipData, ClipData, list[str]]:
    """Check that the pair can be compared frame by frame. With align: cut to the shorter clip and resize the
    candidate to the baseline's size. Without: a QualityError naming the mismatch. Returns the pair and notes."""
    notes: list[str] = []
    nb, nc = len(baseline.frames), len(candidate.frames)
    if nb != nc:
        if not align:
            raise QualityError(f"frame count mismatch: baseline has {nb} frames, candidate has {nc}; "
                               f"pass --align to compare the first {min(nb, nc)}")
        n = min(nb, nc)
        notes.append(f"aligned: compared the first {n} frames (baseline {nb}, candidate {nc})")
        baseline = ClipData(baseline.frames[:n], baseline.fps, baseline.audio, baseline.sample_rate)
        candidate = ClipData(candidate.frames[:n], candidate.fps, candidate.audio, candidate.sample_rate)
    if baseline.size != candidate.size:
        (wb, hb), (wc, hc) = baseline.size, candidate.size
        if not align:
            raise QualityError(f"frame size mismatch: baseline is {wb}x{hb}, candidate is {wc}x{hc}; "
                               f"pass --align to resize the candidate to {wb}x{hb}")
        shrink = wc * hc > wb * hb
        frames = np.stack([cv2.resize(f, (wb, hb), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
                           for f in candidate.frames])
        notes.append(f"aligned: resized the candidate from {wc}x{hc} to {wb}x{hb}")
        candidate = ClipData(frames, candidate.fps, candidate.audio, candidate.sample_rate)
    if abs(baseline.fps - candidate.fps) > 0.01:
        notes.append(f"frame rates differ (baseline {baseline.fps:g}, candidate {candidate.fps:g} fps); "
                     f"frames are compared by index")
    return baseline, candidate, notes


def _audio(baseline: ClipData, candidate: ClipData) -> tuple[AudioComparison | None, str | None]:
    missing = [name for name, clip in (("baseline", baseline), ("candidate", candidate)) if clip.audio is None]
    if missing:
        return None, ("neither clip has an audio track" if len(missing) == 2
                      else f"the {missing[0]} has no audio track")
    return compare_audio(baseline.audio, baseline.sample_rate, candidate.audio, candidate.sample_rate), None


def compare_clips(baseline: ClipData, candidate: ClipData, gates: Gates | None = None, align: bool = False,
                  lpips: bool = True, *, flip: bool = True, ghost_params: GhostParams | None = None,
                  lpips_scorer: LpipsScorer | None = None, lpips_weights: str | None = None,
                  workers: int = 2, baseline_motion: BaselineMotionCache | None = None) -> Comparison:
    """Compare a candidate clip with its baseline (same seed, same prompt). See Comparison.summary() for output.

    lpips=False skips LPIPS (lpips_delta null, reason "not requested"); lpips_scorer overrides the default model;
    lpips_weights is the AlexNet backbone checkpoint (default: the torch hub cache's, see lpips_net.py).
    flip=False skips FLIP the same way (flip null, flip_reason "FLIP not requested").
    baseline_motion reuses the baseline's flow from an earlier comparison with the same baseline (same report).
    Raises QualityError for mismatched frame counts or sizes unless align=True.
    """
    baseline, candidate, notes = reconcile(baseline, candidate, align)
    width, height = baseline.size
    factor = analysis_factor(width, height)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        per_frame = list(pool.map(frame_pass, baseline.frames, candidate.frames, repeat(factor)))
        base_planes = stack_planes([m.base_planes for m in per_frame], factor)
        cand_planes = stack_planes([m.cand_planes for m in per_frame], factor)
        # Two clips, two independent flow passes: one thread each. The baseline's flows are kept for the
        # temporal-consistency measure.
        if baseline_motion is None:
            base_motion, cand_motion = pool.map(motion, (base_planes, cand_planes), repeat(None), (True, False))
        else:
            pending = pool.submit(motion, cand_planes)
            base_motion, cand_motion = baseline_motion.get(base_planes), pending.result()
        flip_reason = flip_available() if flip else "FLIP not requested"
        flip_pairs = (list(pool.map(flip_frame, baseline.frames, candidate.frames, repeat(factor)))
                      if flip_reason is None else None)
    temporal = temporal_errors(base_planes.y, cand_planes.y, base_motion.flows)
    ghost = detect_ghosts(base_planes, cand_planes, base_motion.speed,
                          ghost_params or GhostParams(workers=workers))
    scores, reason = None, "LPIPS not requested"
    if lpips:
        scorer, reason = (lpips_scorer, None) if lpips_scorer is not None else load_lpips(lpips_weights)
        if scorer is not None:
            scores = scorer.distances(baseline.frames, candidate.frames)
    audio, audio_reason = _audio(baseline, candidate)
    subject = track_subject(baseline.frames, candidate.frames, factor)
    return Comparison(
        baseline=baseline, candidate=candidate,
        psnr=np.array([m.psnr for m in per_frame], np.float64),
        ssim=np.array([m.ssim for m in per_frame], np.float64),
        sharpness_base=np.array([m.sharpness_base for m in per_frame], np.float64),
        sharpness_cand=np.array([m.sharpness_cand for m in per_frame], np.float64),
        warp_error_base=base_motion.warp_error, warp_error_cand=cand_motion.warp_error,
        temporal_error=temporal,
        flip=None if flip_pairs is None else np.array([m for _, m in flip_pairs], np.float32),
        flip_maps=None if flip_pairs is None else np.stack([e for e, _ in flip_pairs]),
        flip_reason=flip_reason,
        absdiff=np.stack([m.absdiff for m in per_frame]),
        ghost=ghost, factor=factor,
        lpips=scores, lpips_reason=None if scores is not None else reason,
        audio=audio, audio_reason=audio_reason,
        gates=gates or Gates(), notes=notes, subject=subject,
    )

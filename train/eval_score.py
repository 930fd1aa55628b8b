"""Score the clips of an evaluation set (train.evaluate makes them): per item, per group, per named shape.

Rows per item kind are described in train/evaluate.py. Eye labels (`eye_labels` file: item id -> what a person saw
in its frame strip: circle, square, triangle or blob) give a second confusion matrix: the classifier against the
eye on the nano's own output, where no ground truth exists.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np

from train.eval_sets import Item, keyframe_for
from train.metrics import nearest_background, ssim, track
from train.shape_classifier import SHAPE_NAMES, UNKNOWN, confusion

FL2VA_WITHIN_PX = 16.0  # half a transformer token (32 px), as train.verify_nano
COMPOSITION = ("colour_motion", "shape_motion", "shape_background")
BASELINE_GROUPS = ("legacy", *COMPOSITION, "seen_content")
EYE_LABELS = ("circle", "square", "triangle", "blob")


def wilson(hits: int, total: int, z: float = 1.96) -> list[float]:
    """95% Wilson score interval of a proportion: a small set's figure is a range, and is reported as one."""
    if total == 0:
        return [float("nan"), float("nan")]
    p = hits / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * np.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return [round(max(0.0, centre - half), 3), round(min(1.0, centre + half), 3)]


def count(rows: list[dict], key: str) -> dict:
    hits = sum(bool(r[key]) for r in rows)
    return {"right": hits, "of": len(rows), "share": round(hits / len(rows), 3) if rows else None,
            "ci95": wilson(hits, len(rows))}


def baseline_row(item: Item, frames: np.ndarray) -> dict:
    tr = track(frames)
    return {"id": item.id, "group": item.group, "prompt": item.prompt, "seed": item.seed, "pair": item.pair,
            "expected": list(item.content), "colour": tr.colour, "motion": tr.motion, "shape": tr.shape,
            "background": nearest_background(frames),
            "colour_ok": tr.colour == item.colour, "motion_ok": tr.motion == item.motion,
            "followed": tr.colour == item.colour and tr.motion == item.motion,
            "shape_ok": tr.shape == item.shape, "shape_unknown": tr.shape == UNKNOWN,
            "background_ok": nearest_background(frames) == item.background,
            "shape_reading": tr.shape_reading.to_dict() if tr.shape_reading else None,
            "fill_ratio_shape": tr.fill_ratio_shape, "fill_ratio_ok": tr.fill_ratio_shape == item.shape}


def turbo_row(item: Item, frames: np.ndarray, base: np.ndarray) -> dict:
    """Closeness of a turbo clip to its same-seed baseline: whole-frame SSIM beside the subject's own measures."""
    from quality.subject import track_subject

    subject = track_subject(base, frames, factor=1)
    measured = subject.measured
    tr = track(frames)
    return {"id": item.id, "of": item.of, "prompt": item.prompt, "seed": item.seed,
            "followed": tr.colour == item.colour and tr.motion == item.motion,
            "ssim_whole": round(ssim(base, frames), 4),
            "subject_frames": int(measured.sum()),
            "subject_ssim": round(float(np.nanmean(subject.ssim)), 4) if measured.any() else None,
            "subject_present_median": round(float(np.nanmedian(subject.present)), 3) if measured.any() else None,
            "subject_lost_frames": int(subject.lost.sum()),
            "subject_displacement_px_median": (round(float(np.nanmedian(subject.displacement_px)), 2)
                                               if np.isfinite(subject.displacement_px).any() else None),
            "subject_overlap_median": round(float(np.nanmedian(subject.overlap)), 3) if measured.any() else None,
            "subject_colour_delta_median": (round(float(np.nanmedian(subject.colour_delta)), 2)
                                            if np.isfinite(subject.colour_delta).any() else None)}


def fl2va_row(item: Item, frames: np.ndarray) -> dict:
    tr = track(frames)
    x, y = tr.xs[0], tr.ys[0]
    offset = float(np.hypot(x - item.keyframe_xy[0], y - item.keyframe_xy[1])) if np.isfinite(x) else None
    return {"id": item.id, "prompt": item.prompt, "seed": item.seed, "keyframe_xy": list(item.keyframe_xy),
            "frame0_xy": None if offset is None else [round(float(x), 1), round(float(y), 1)],
            "offset_px": None if offset is None else round(offset, 1),
            "within": offset is not None and offset <= FL2VA_WITHIN_PX,
            "colour_ok": tr.colour == item.colour, "motion_ok": tr.motion == item.motion}


def save_strip(path: Path, frames: np.ndarray, first: np.ndarray | None = None, every: int = 20) -> None:
    """A small JPEG: frames 0, every, 2·every, ... at half size in one row (the keyframe first when given)."""
    from PIL import Image

    picked = ([first] if first is not None else []) + list(frames[::every])
    row = np.concatenate([np.pad(f[::2, ::2], ((0, 0), (0, 2), (0, 0)), constant_values=255) for f in picked], axis=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(row).save(path, quality=80)


def load_eye_labels(path: Path) -> dict[str, str]:
    labels = tomllib.loads(path.read_text()).get("labels", {})
    for item_id, label in labels.items():
        if label not in EYE_LABELS:
            raise ValueError(f"{path.name}: labels.{item_id}: {label!r} is not one of {EYE_LABELS}")
    return labels


def score(items: list[Item], cache: Path, strips: Path | None = None, eye_labels: Path | None = None) -> dict:
    by_id = {i.id: i for i in items}

    def frames(item: Item) -> np.ndarray:
        return np.load(cache / f"{item.key}.npz")["frames"]

    rows = {"baseline": [], "turbo": [], "fl2va": []}
    for item in items:
        clip = frames(item)
        if item.group == "turbo":
            rows["turbo"].append(turbo_row(item, clip, frames(by_id[item.of])))
        elif item.group == "fl2va":
            rows["fl2va"].append(fl2va_row(item, clip))
        else:
            rows["baseline"].append(baseline_row(item, clip))
        if strips is not None:
            first = None
            if item.group == "fl2va":
                first = keyframe_for(item)[0]
            save_strip(strips / f"{item.id}.jpg", clip, first)
    base = rows["baseline"]
    summary: dict = {"groups": {}}
    for group in BASELINE_GROUPS:
        members = [r for r in base if r["group"] == group]
        if members:
            summary["groups"][group] = {"followed (colour and direction)": count(members, "followed"),
                                        "shape": count(members, "shape_ok"),
                                        "background": count(members, "background_ok")}
            if group in COMPOSITION:
                summary["groups"][group]["pairs"] = sorted({r["pair"] for r in members})
    summary["shape_by_class"] = {
        shape: {"right": count([r for r in base if r["expected"][1] == shape], "shape_ok"),
                "fill_ratio_right": count([r for r in base if r["expected"][1] == shape], "fill_ratio_ok")}
        for shape in SHAPE_NAMES}
    summary["shape_confusion"] = confusion([r["expected"][1] for r in base], [r["shape"] for r in base])
    summary["fill_ratio_confusion"] = confusion([r["expected"][1] for r in base],
                                                [r["fill_ratio_shape"] or UNKNOWN for r in base])
    if rows["turbo"]:
        turbo = rows["turbo"]

        def mean(key: str) -> float | None:
            values = [r[key] for r in turbo if r[key] is not None]
            return round(float(np.mean(values)), 4) if values else None

        summary["turbo"] = {"clips": len(turbo), "followed": count(turbo, "followed"),
                            "ssim_whole_mean": mean("ssim_whole"), "subject_ssim_mean": mean("subject_ssim"),
                            "subject_present_median_mean": mean("subject_present_median"),
                            "subject_displacement_px_median_mean": mean("subject_displacement_px_median"),
                            "subject_overlap_median_mean": mean("subject_overlap_median"),
                            "clips_with_lost_subject_frames": sum(r["subject_lost_frames"] > 0 for r in turbo)}
    if rows["fl2va"]:
        offsets = [r["offset_px"] for r in rows["fl2va"] if r["offset_px"] is not None]
        summary["fl2va"] = {f"within_{FL2VA_WITHIN_PX:g}px": count(rows["fl2va"], "within"),
                            "colour": count(rows["fl2va"], "colour_ok"),
                            "median_offset_px": round(float(np.median(offsets)), 1) if offsets else None}
    if eye_labels is not None and eye_labels.exists():
        labels = load_eye_labels(eye_labels)
        seen = [r for r in base if r["id"] in labels]
        table = {eye: {col: 0 for col in (*SHAPE_NAMES, UNKNOWN)} for eye in EYE_LABELS}
        for r in seen:
            table[labels[r["id"]]][r["shape"]] += 1
        summary["classifier_vs_eye"] = {
            "labels_file": eye_labels.name, "clips": len(seen), "confusion (rows: eye, columns: classifier)": table,
            "eye_vs_asked": confusion([r["expected"][1] for r in seen],
                                      [labels[r["id"]] if labels[r["id"]] != "blob" else UNKNOWN for r in seen])}
    return {"summary": summary, "rows": rows}

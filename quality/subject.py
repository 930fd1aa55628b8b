"""Where the subject is: find what stands out in each baseline frame and measure the candidate there.

Whole-frame means are ruled by the background: a subject covering 3 % of the frame can vanish and move SSIM or
FLIP by almost nothing. This module finds the subject in the baseline and asks, per frame, what a reviewer asks:
is it still there, in the same place, the same size and colour, in one piece?

Finding it (per frame, on the analysis grid). A pixel stands out when its colour is far from the colours that fill
the rest of the frame: histogram contrast (Cheng et al., "Global contrast based salient region detection", 2011).
Colours are quantized in CIELAB after a light blur (so a fine texture reads as its average); each colour's
saliency is the area-weighted mean distance to every other colour. A background, plain or textured, is made of
frequent colours and scores low; a subject's colour is rare and scores high. Nothing here depends on where a pixel
is, so a camera that pans or zooms moves the subject and its background together and changes nothing. The subject
is the pixels whose saliency exceeds the frame's typical (median) saliency by `margin`, cleaned of specks; a
frame whose baseline has no such region of `min_area` has no subject and is not measured.

Measuring the candidate. The candidate frame is segmented the same way, on its own colours. Within `search`
(a share of the short side) of the baseline's subject, the candidate pixels that stand out and lie within
`colour_tolerance` (CIELAB distance) of one of the baseline subject's own colours are the subject as the candidate
drew it. Per frame:
  - present: that area over the baseline subject's area (1 = all there; 0 = gone); lost when under `lost_below`;
  - displacement_px: distance between the two centroids, full-resolution pixels;
  - size_ratio, overlap: the area ratio, and the intersection over union of the two masks once their centroids are
    put on each other (a subject that shrank, grew or changed shape has low overlap wherever it is);
  - fragments / base_fragments: connected pieces of `min_piece` of the subject's area or more;
  - colour_delta: CIELAB distance between the subject's mean colours (over all standing-out candidate pixels in the
    search region, so a subject that changed colour is measured, not just lost);
  - patch: the share of the subject's interior covered by its largest blotch of another colour. The candidate is
    shifted onto the baseline subject (the centroid of its pixels that stand out near it onto the baseline's) and
    compared with it pixel by pixel inside the subject (eroded by a pixel, so an outline that wobbles is not a
    blotch), where both draw the subject (a pixel the candidate left to the background is `present`'s and
    `overlap`'s). "Another colour" is another hue: the CIE hue difference ΔH (CIELAB units, chroma-weighted, so a
    grey's noisy hue counts for little and a lighter or darker shade of the same colour not at all; the nano's
    subjects are shaded blotchily and differently from run to run). A slight tint of the whole subject (the median
    hue shift, up to `patch_tint_deg`) is taken off first; pixels still over `patch_tolerance` apart are
    off-colour, and the largest connected piece of them is the patch. A mean colour hardly moves when a fifth of
    the subject turns purple; this does (0 for an identical candidate). A subject recoloured as a whole is
    colour_delta's;
  - ssim: SSIM of the luma inside the baseline subject's box (grown by `box_margin`), so the background cannot
    dilute it; the FLIP restricted to the subject comes from `region_mean` over the FLIP maps.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np


@dataclass(frozen=True)
class SubjectParams:
    blur_sigma: float = 1.5  # analysis pixels: fine texture reads as its mean colour
    bins: tuple[int, int, int] = (12, 16, 16)  # CIELAB quantization: L in 0-100, a and b in -128-127
    margin: float = 18.0  # CIELAB units above the frame's median saliency for a pixel to stand out
    max_share: float = 0.35  # a "subject" larger than this share of the frame is background, not a subject
    min_area: float = 0.0015  # share of the frame: smaller regions are specks, not a subject
    min_piece: float = 0.08  # share of the baseline subject's area for a candidate piece to count as a fragment
    search: float = 0.25  # share of the short side around the baseline subject where the candidate's is looked for
    colour_tolerance: float = 30.0  # CIELAB distance from the baseline subject's colour for a pixel to match
    lost_below: float = 0.25  # present share under which the subject counts as lost in a frame
    box_margin: float = 0.5  # the subject box grows by this share of its size on each side for the subject SSIM
    # Chosen on the calibration part of issue 35's corpus (bench/subject_patch_strips.py, BENCHMARKS.md):
    patch_tolerance: float = 6.0  # CIE ΔH (CIELAB units) for a pixel to be off-colour, once the tint is taken off
    patch_tint_deg: float = 3.0  # a hue shift of the whole subject up to this is a tint, not a patch


@dataclass
class SubjectTrack:
    """Per-frame subject measurements, float64 (T,) each; NaN where the baseline frame has no subject."""

    base_area: np.ndarray  # full-resolution pixels
    present: np.ndarray
    displacement_px: np.ndarray
    size_ratio: np.ndarray
    overlap: np.ndarray
    fragments: np.ndarray
    base_fragments: np.ndarray
    colour_delta: np.ndarray
    patch: np.ndarray  # share of the subject's interior in its largest blotch of another colour
    ssim: np.ndarray
    masks: np.ndarray  # bool (T, h, w): the baseline subject on the analysis grid
    params: SubjectParams

    @property
    def measured(self) -> np.ndarray:
        """bool (T,): frames whose baseline has a subject."""
        return np.isfinite(self.present)

    @property
    def lost(self) -> np.ndarray:
        """bool (T,): frames where the baseline has a subject and the candidate has (almost) none of it."""
        return self.measured & (np.nan_to_num(self.present, nan=1.0) < self.params.lost_below)

    def region_mean(self, maps: np.ndarray) -> np.ndarray:
        """float64 (T,): mean of per-frame maps (T, h, w) on the analysis grid over the baseline subject, grown by
        the box margin; NaN where there is no subject."""
        out = np.full(len(maps), np.nan)
        for t in np.flatnonzero(self.measured):
            region = _grown(self.masks[t], self.params.box_margin)
            if maps[t].shape != region.shape:
                region = cv2.resize(region.astype(np.uint8), maps[t].shape[::-1],
                                    interpolation=cv2.INTER_NEAREST).astype(bool)
            out[t] = float(maps[t][region].mean()) if region.any() else np.nan
        return out


def to_lab(frame: np.ndarray, factor: int, sigma: float) -> np.ndarray:
    """uint8 RGB (H, W, 3) -> float32 CIELAB (h, w, 3) on the analysis grid, lightly blurred."""
    height, width = frame.shape[:2]
    small = cv2.resize(frame, (width // factor, height // factor), interpolation=cv2.INTER_AREA) if factor > 1 \
        else frame
    rgb = small.astype(np.float32) / 255.0
    if sigma > 0:
        rgb = cv2.GaussianBlur(rgb, (0, 0), sigma)
    return cv2.cvtColor(rgb, cv2.COLOR_RGB2LAB)


def saliency(lab: np.ndarray, params: SubjectParams) -> np.ndarray:
    """float32 (h, w): each pixel's colour's area-weighted mean CIELAB distance to the frame's other colours."""
    nl, na, nb = params.bins
    li = np.clip((lab[..., 0] * (nl / 100.0)).astype(np.int32), 0, nl - 1)
    ai = np.clip(((lab[..., 1] + 128.0) * (na / 256.0)).astype(np.int32), 0, na - 1)
    bi = np.clip(((lab[..., 2] + 128.0) * (nb / 256.0)).astype(np.int32), 0, nb - 1)
    code = (li * na + ai) * nb + bi
    codes, inverse, counts = np.unique(code.ravel(), return_inverse=True, return_counts=True)
    flat = lab.reshape(-1, 3).astype(np.float64)
    means = np.stack([np.bincount(inverse, flat[:, c], len(codes)) for c in range(3)], axis=1) / counts[:, None]
    weights = counts / counts.sum()
    distance = np.linalg.norm(means[:, None, :] - means[None, :, :], axis=-1)
    per_colour = distance @ weights
    return per_colour[inverse].reshape(code.shape).astype(np.float32)


def standout(lab: np.ndarray, params: SubjectParams) -> np.ndarray:
    """bool (h, w): pixels that stand out from the frame's typical colours, specks removed."""
    sal = saliency(lab, params)
    mask = sal > float(np.median(sal)) + params.margin
    if mask.mean() > params.max_share:
        return np.zeros_like(mask)
    mask = cv2.morphologyEx(mask.astype(np.uint8), cv2.MORPH_OPEN, np.ones((2, 2), np.uint8)).astype(bool)
    return mask


def _pieces(mask: np.ndarray, min_pixels: float) -> tuple[int, np.ndarray]:
    """(count of 8-connected pieces of at least min_pixels, the mask of those pieces)."""
    count, labels, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
    keep = [i for i in range(1, count) if stats[i, cv2.CC_STAT_AREA] >= min_pixels]
    return len(keep), np.isin(labels, keep)


def _grown(mask: np.ndarray, share: float) -> np.ndarray:
    """The mask's bounding box grown by `share` of its size on each side (bool, same shape)."""
    ys, xs = np.nonzero(mask)
    out = np.zeros_like(mask)
    if len(ys) == 0:
        return out
    h, w = mask.shape
    dy, dx = int(np.ceil((ys.max() - ys.min() + 1) * share)), int(np.ceil((xs.max() - xs.min() + 1) * share))
    out[max(0, ys.min() - dy):min(h, ys.max() + dy + 1), max(0, xs.min() - dx):min(w, xs.max() + dx + 1)] = True
    return out


def _centroid(mask: np.ndarray) -> np.ndarray:
    ys, xs = np.nonzero(mask)
    return np.array([xs.mean(), ys.mean()])


def _aligned_overlap(a: np.ndarray, b: np.ndarray) -> float:
    """IoU of two masks after shifting b's centroid onto a's (shape and size, wherever each is)."""
    shift = _centroid(a) - _centroid(b)
    moved = cv2.warpAffine(b.astype(np.uint8), np.float32([[1, 0, shift[0]], [0, 1, shift[1]]]), b.shape[::-1],
                           flags=cv2.INTER_NEAREST).astype(bool)
    union = np.logical_or(a, moved).sum()
    return float(np.logical_and(a, moved).sum() / union) if union else 0.0


def _near_palette(lab: np.ndarray, where: np.ndarray, palette: np.ndarray, tolerance: float,
                  most: int = 256) -> np.ndarray:
    """bool (h, w): pixels in `where` within `tolerance` of some colour of `palette` (N, 3), the baseline subject's
    own colours (at most `most` of them, evenly taken). A subject of several colours (a textured sprite, a face)
    matches colour by colour; its mean colour might be none of them."""
    step = max(1, len(palette) // most)
    colours = palette[::step]
    out = np.zeros(where.shape, bool)
    pixels = lab[where]
    if len(pixels):
        distance = np.sqrt(((pixels[:, None, :] - colours[None, :, :]) ** 2).sum(-1)).min(axis=1)
        out[where] = distance < tolerance
    return out


def _patch_share(base_lab: np.ndarray, cand_lab: np.ndarray, mask: np.ndarray, cand_mask: np.ndarray,
                 offset: np.ndarray, params: SubjectParams) -> float:
    """Share of the subject's interior (mask eroded by one pixel; the whole mask if that leaves under a quarter of
    it) covered by the largest connected piece of pixels, drawn as subject in both, whose hue differs from the
    baseline's by more than `patch_tolerance` (CIE ΔH), once the candidate is shifted by -offset (its subject
    onto the baseline's) and a tint (the median hue shift, at most `patch_tint_deg`) is taken off."""
    interior = cv2.erode(mask.astype(np.uint8), np.ones((3, 3), np.uint8)).astype(bool)
    if interior.sum() < 0.25 * mask.sum():
        interior = mask
    shift = np.float32([[1, 0, -offset[0]], [0, 1, -offset[1]]])
    size = cand_lab.shape[1::-1]
    moved = cv2.warpAffine(cand_lab, shift, size, flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    both = interior & cv2.warpAffine(cand_mask.astype(np.uint8), shift, size, flags=cv2.INTER_NEAREST).astype(bool)
    if not both.any():
        return 0.0
    cand, base = moved[both].astype(np.float64), base_lab[both].astype(np.float64)
    hue = np.arctan2(cand[:, 2], cand[:, 1]) - np.arctan2(base[:, 2], base[:, 1])
    hue = (hue + np.pi) % (2 * np.pi) - np.pi
    tint = np.radians(params.patch_tint_deg)
    hue -= np.clip(np.median(hue), -tint, tint)
    chroma = np.sqrt(np.hypot(cand[:, 1], cand[:, 2]) * np.hypot(base[:, 1], base[:, 2]))
    off = np.zeros(mask.shape, np.uint8)
    off[both] = np.abs(2 * chroma * np.sin(hue / 2)) > params.patch_tolerance
    count, _, stats, _ = cv2.connectedComponentsWithStats(off, connectivity=8)
    largest = max((stats[i, cv2.CC_STAT_AREA] for i in range(1, count)), default=0)
    return float(largest / interior.sum())


def _box_ssim(a: np.ndarray, b: np.ndarray) -> float:
    """SSIM of two equally shaped luma crops (8-bit units), 7x7 Gaussian windows; whole-crop mean."""
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    a, b = a.astype(np.float64), b.astype(np.float64)

    def blur(x: np.ndarray) -> np.ndarray:
        return cv2.GaussianBlur(x, (7, 7), 1.5, borderType=cv2.BORDER_REFLECT)

    ma, mb = blur(a), blur(b)
    va, vb, cov = blur(a * a) - ma * ma, blur(b * b) - mb * mb, blur(a * b) - ma * mb
    value = ((2 * ma * mb + c1) * (2 * cov + c2)) / ((ma * ma + mb * mb + c1) * (va + vb + c2))
    return float(value.mean())


def subject_mask(frame: np.ndarray, factor: int, params: SubjectParams | None = None) -> np.ndarray:
    """bool (h, w) on the analysis grid: the subject of one baseline frame (all False when it has none)."""
    params = params or SubjectParams()
    lab = to_lab(frame, factor, params.blur_sigma)
    h, w = lab.shape[:2]
    return _pieces(standout(lab, params), params.min_area * h * w)[1]


def track_subject(base_frames: np.ndarray, cand_frames: np.ndarray, factor: int,
                  params: SubjectParams | None = None) -> SubjectTrack:
    """Measure the candidate at the baseline's subject, frame by frame. Frames are uint8 (T, H, W, 3), equal sizes."""
    params = params or SubjectParams()
    frames = len(base_frames)
    nan = np.full(frames, np.nan)
    out = {name: nan.copy() for name in ("base_area", "present", "displacement_px", "size_ratio", "overlap",
                                         "fragments", "base_fragments", "colour_delta", "patch", "ssim")}
    masks = None
    for t in range(frames):
        base_lab = to_lab(base_frames[t], factor, params.blur_sigma)
        if masks is None:
            masks = np.zeros((frames, *base_lab.shape[:2]), bool)
        h, w = base_lab.shape[:2]
        _, base_mask = _pieces(standout(base_lab, params), params.min_area * h * w)
        area = int(base_mask.sum())
        if area == 0:
            continue
        masks[t] = base_mask
        cand_lab = to_lab(cand_frames[t], factor, params.blur_sigma)
        radius = max(1, int(round(params.search * min(h, w))))
        near = cv2.dilate(base_mask.astype(np.uint8), cv2.getStructuringElement(
            cv2.MORPH_ELLIPSE, (2 * radius + 1, 2 * radius + 1))).astype(bool)
        cand_standout = standout(cand_lab, params)
        cand_out = cand_standout & near
        colour = base_lab[base_mask].mean(axis=0)
        matches = cand_out & _near_palette(cand_lab, cand_out, base_lab[base_mask], params.colour_tolerance)
        count, matched = _pieces(matches, params.min_piece * area)
        # The baseline measured the same way (its pieces of min_piece or more), so an identical frame gives 1 and 0 px.
        base_count, base_mask = _pieces(base_mask, params.min_piece * area)
        area = int(base_mask.sum())
        if area == 0:  # only specks stand out (many small pieces, a textured background in a pan): no subject
            masks[t] = False
            continue
        out["base_area"][t] = area * factor * factor
        out["base_fragments"][t] = base_count
        out["present"][t] = min(matched.sum() / area, 1.0)
        out["fragments"][t] = count
        out["size_ratio"][t] = cand_out.sum() / area
        out["colour_delta"][t] = (float(np.linalg.norm(cand_lab[cand_out].mean(axis=0) - colour))
                                  if cand_out.any() else np.nan)
        if matched.any():
            out["displacement_px"][t] = float(np.linalg.norm(_centroid(matched) - _centroid(base_mask))) * factor
            out["overlap"][t] = _aligned_overlap(base_mask, matched)
        else:
            out["overlap"][t] = 0.0
        # Aligned on the subject as the candidate drew it, whatever its colours (`matched` leaves a patch out).
        offset = _centroid(cand_out) - _centroid(base_mask) if cand_out.any() else np.zeros(2)
        out["patch"][t] = _patch_share(base_lab, cand_lab, base_mask, cand_standout, offset, params)
        box = _grown(base_mask, params.box_margin)
        ys, xs = np.nonzero(box)
        crop = (slice(ys.min(), ys.max() + 1), slice(xs.min(), xs.max() + 1))
        out["ssim"][t] = _box_ssim(base_lab[crop][..., 0] * 2.55, cand_lab[crop][..., 0] * 2.55)
    if masks is None:
        masks = np.zeros((0, 1, 1), bool)
    return SubjectTrack(masks=masks, params=params, **out)

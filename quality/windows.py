"""Worst-case aggregation over time: a defect that lasts half a second must fail however long the clip is.

A clip mean dilutes a short defect by the clip's length (a subject gone for 12 of 240 frames moves the mean by
5 %). The gates therefore read the worst window of `window` consecutive frames (12 = half a second at 24 fps) and
runs of consecutive bad frames; each returns the frames it is about, so a reason can say "frames 72-96" and the
Compare tab can jump there.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Window:
    """Frames start..end (inclusive) and the aggregate there; frame: the worst single frame inside it."""

    start: int
    end: int
    value: float
    frame: int


def worst_window(values: np.ndarray, window: int, higher_is_worse: bool, how: str = "mean") -> Window | None:
    """The window of `window` frames (fewer if the clip is shorter) whose mean (or median) is worst. NaN frames
    (not measured) are left out of each window; a window with no measured frame is skipped. None: nothing measured.
    """
    values = np.asarray(values, np.float64)
    n = len(values)
    if n == 0 or not np.isfinite(values).any():
        return None
    size = max(1, min(window, n))
    chunks = np.lib.stride_tricks.sliding_window_view(values, size)
    measured = np.isfinite(chunks).any(axis=1)
    reduce = np.nanmean if how == "mean" else np.nanmedian
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN windows: skipped below
        aggregate = reduce(chunks, axis=1)
    aggregate = np.where(measured, aggregate, -np.inf if higher_is_worse else np.inf)
    start = int(np.argmax(aggregate) if higher_is_worse else np.argmin(aggregate))  # the first of equal windows
    chunk = chunks[start]
    inner = np.where(np.isfinite(chunk), chunk, -np.inf if higher_is_worse else np.inf)
    frame = start + int(np.argmax(inner) if higher_is_worse else np.argmin(inner))
    return Window(start, start + size - 1, float(aggregate[start]), frame)


def runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """Inclusive (start, end) of each run of consecutive True frames, in order."""
    flags = np.asarray(flags, bool)
    edges = np.diff(np.concatenate([[0], flags.astype(np.int8), [0]]))
    return [(int(s), int(e) - 1) for s, e in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1))]


def describe_runs(spans: list[tuple[int, int]], most: int = 3) -> str:
    """"72-96, 110-111 and 2 more" for a list of runs (frame numbers as the Compare tab shows them)."""
    text = [f"{a}" if a == b else f"{a}–{b}" for a, b in spans[:most]]
    if len(spans) > most:
        text.append(f"{len(spans) - most} more")
    return text[0] if len(text) == 1 else ", ".join(text[:-1]) + " and " + text[-1]

"""What the review UI shows of a stored clip: decoded frames, its soundtrack as WAV, spectrograms.

Everything here is read back from the stored MP4 (the same bytes a reviewer downloads), never from the engine's
in-memory tensors, so what the UI shows is what ships. Clips are decoded by quality's read_clip (the one
decoded-clip type, ClipData: the frames and sound the metrics were computed on) and cached per clip sha: moving
the frame slider must not decode the video again.
"""

from __future__ import annotations

import atexit
import hashlib
import shutil
import tempfile
import threading
import wave
from collections import OrderedDict
from pathlib import Path

import cv2
import numpy as np

from quality import ClipData, read_clip

DISPLAY_MIN_WIDTH = 448  # nano clips are 224 px wide: show them at least 2× so single-pixel ghosts stay visible
DISPLAY_MAX_SCALE = 4
FRAME_CACHE_BYTES = 1 << 30  # decoded frames kept in memory across all clips


class ClipCache:
    """Decoded clips by sha256, least recently used evicted first once ``max_bytes`` is exceeded.

    Thread-safe: Gradio runs handlers on a thread pool, and two slider moves may decode at once.
    """

    def __init__(self, max_bytes: int = FRAME_CACHE_BYTES):
        self.max_bytes = max_bytes
        self._clips: OrderedDict[str, ClipData] = OrderedDict()
        self._lock = threading.Lock()
        self._decoding: dict[str, threading.Lock] = {}

    def get(self, sha: str, path: str | Path) -> ClipData:
        with self._lock:
            if sha in self._clips:
                self._clips.move_to_end(sha)
                return self._clips[sha]
            gate = self._decoding.setdefault(sha, threading.Lock())
        with gate:  # one decode per clip even when several handlers ask at once
            with self._lock:
                if sha in self._clips:
                    return self._clips[sha]
            clip = read_clip(path)
            with self._lock:
                self._clips[sha] = clip
                self._decoding.pop(sha, None)
                self._evict()
            return clip

    def _evict(self) -> None:
        total = sum(_nbytes(c) for c in self._clips.values())
        # Keep the two newest whatever their size: a compare view needs both clips of its pair at once.
        while len(self._clips) > 2 and total > self.max_bytes:
            _, dropped = self._clips.popitem(last=False)
            total -= _nbytes(dropped)


def _nbytes(clip: ClipData) -> int:
    return clip.frames.nbytes + (clip.audio.nbytes if clip.audio is not None else 0)


def display_frame(frame: np.ndarray) -> np.ndarray:
    """Upscale a small frame by a whole factor with nearest-neighbour: bigger, but every pixel stays honest."""
    scale = min(DISPLAY_MAX_SCALE, max(1, -(-DISPLAY_MIN_WIDTH // frame.shape[1])))
    if scale == 1:
        return frame
    return cv2.resize(frame, (frame.shape[1] * scale, frame.shape[0] * scale), interpolation=cv2.INTER_NEAREST)


class MediaDir:
    """Files the browser fetches (MP4 copies, WAVs, spectrogram PNGs), kept under the system temp dir.

    Why a copy: Gradio only serves files from the working directory or the temp dir unless the app is mounted
    with ``allowed_paths``, and the data dir may be anywhere. Files are named by the clip's sha256, so a
    clip is copied once. The folders are private to the server's user (0700: the temp dir is shared), and a
    server starts with an empty one (copies are remade on demand) and removes it when its process exits, so they
    never outlive one run (a killed server's copies go at the next start).
    """

    def __init__(self, data_dir: str | Path):
        key = hashlib.sha256(str(Path(data_dir).resolve()).encode()).hexdigest()[:12]
        parent = Path(tempfile.gettempdir()) / "h3studio-ui"
        self.root = parent / key
        shutil.rmtree(self.root, ignore_errors=True)  # the last run's copies
        for folder in (parent, self.root):
            folder.mkdir(mode=0o700, exist_ok=True)
            folder.chmod(0o700)  # also when an older server made it world-readable
        atexit.register(shutil.rmtree, self.root, ignore_errors=True)

    def video(self, sha: str, source: str | Path) -> str:
        target = self.root / f"{sha[:32]}.mp4"
        if not target.exists():
            partial = target.with_suffix(".part")
            shutil.copyfile(source, partial)
            partial.replace(target)  # atomic: a reader never sees half a file
        return str(target)

    def export_copy(self, path: str | Path) -> str:
        """A servable copy of an export zip under its own name (the data dir keeps the original)."""
        target = self.root / "exports" / Path(path).name
        target.parent.mkdir(exist_ok=True)
        if not target.exists():
            shutil.copyfile(path, target.with_suffix(".part"))
            target.with_suffix(".part").replace(target)
        return str(target)

    def wav(self, sha: str, clip: ClipData) -> str | None:
        if clip.audio is None or clip.sample_rate is None:
            return None
        target = self.root / f"{sha[:32]}.wav"
        if not target.exists():
            partial = target.with_suffix(".wav.part")
            write_wav(partial, clip.audio, clip.sample_rate)
            partial.replace(target)
        return str(target)


def write_wav(path: str | Path, audio: np.ndarray, sample_rate: int) -> None:
    """16-bit PCM WAV of (C, N) float audio in [-1, 1]."""
    pcm = (np.clip(audio, -1.0, 1.0).T * 32767.0).round().astype("<i2")
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(audio.shape[0])
        handle.setsampwidth(2)
        handle.setframerate(sample_rate)
        handle.writeframes(pcm.tobytes())


def spectrogram_db(signal: np.ndarray, sample_rate: int, n_fft: int = 512, hop: int = 128) -> tuple[np.ndarray, float]:
    """|STFT| in dB (freq × time) of a mono signal with a Hann window; returns it and the seconds per column."""
    if signal.size < n_fft:
        signal = np.pad(signal, (0, n_fft - signal.size))
    window = np.hanning(n_fft).astype(np.float32)
    count = 1 + (signal.size - n_fft) // hop
    strided = np.lib.stride_tricks.as_strided(
        signal, shape=(count, n_fft), strides=(signal.strides[0] * hop, signal.strides[0]), writeable=False)
    magnitude = np.abs(np.fft.rfft(strided * window, axis=1)).T
    return 20.0 * np.log10(magnitude + 1e-6), hop / sample_rate


def envelope(signal: np.ndarray, sample_rate: int, bins: int = 800) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Min/max per bin: draws a waveform of any length with ``bins`` points and no aliasing."""
    usable = signal[: signal.size - signal.size % bins] if signal.size >= bins else signal
    chunks = usable.reshape(min(bins, usable.size), -1)
    seconds = (np.arange(chunks.shape[0]) + 0.5) * chunks.shape[1] / sample_rate
    return seconds, chunks.min(axis=1), chunks.max(axis=1)


def audio_figure(clips: dict[str, ClipData], frame: int | None = None):
    """One matplotlib figure: per clip a waveform (both channels) and a spectrogram (channel mean), shared axes
    and one colour scale, so a difference in the picture is a difference in the sound. ``frame`` marks the
    compare slider's time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    named = [(name, clip) for name, clip in clips.items() if clip.audio is not None]
    fig, axes = plt.subplots(2, max(1, len(named)), figsize=(5.2 * max(1, len(named)), 4.2), squeeze=False,
                             sharex=True, gridspec_kw={"height_ratios": [1, 2]})
    specs = {name: spectrogram_db(clip.audio.mean(axis=0), clip.sample_rate) for name, clip in named}
    top = max((s.max() for s, _ in specs.values()), default=0.0)
    # One amplitude scale for both clips (not ±1: an untrained or quiet model would look silent).
    peak = max((float(np.abs(clip.audio).max()) for _, clip in named), default=1.0) * 1.05 or 1.0
    for column, (name, clip) in enumerate(named):
        wave_ax, spec_ax = axes[0][column], axes[1][column]
        for channel, colour in zip(clip.audio, ("#1f77b4", "#ff7f0e")):
            seconds, low, high = envelope(channel, clip.sample_rate)
            wave_ax.fill_between(seconds, low, high, color=colour, alpha=0.6, linewidth=0)
        wave_ax.set_title(f"{name} · {clip.sample_rate / 1000:g} kHz · {clip.audio.shape[0]} ch", fontsize=9)
        wave_ax.set_ylim(-peak, peak)
        spec, seconds_per_column = specs[name]
        extent = (0, spec.shape[1] * seconds_per_column, 0, clip.sample_rate / 2000)
        spec_ax.imshow(spec, origin="lower", aspect="auto", extent=extent, vmin=top - 80, vmax=top, cmap="magma")
        spec_ax.set_xlabel("seconds")
        spec_ax.set_ylabel("kHz")
        if frame is not None:
            for ax in (wave_ax, spec_ax):
                ax.axvline((frame + 0.5) / clip.fps, color="#22c55e", linewidth=1)
    fig.tight_layout()
    return fig

"""Read (and, for tests and benchmarks, write) clips with PyAV.

`read_clip` accepts anything PyAV opens (MP4 with H.264/HEVC/AV1 video, with or without an audio track) and
returns a `ClipData`: RGB frames (T, H, W, 3) uint8, the frame rate, and stereo float32 audio (2, N) in [-1, 1]
with its sample rate, or None when the file has no audio. Mono audio is duplicated to both channels; more than
two channels are downmixed to stereo by libswresample.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np

from .errors import QualityError


@dataclass
class ClipData:
    """One decoded clip.

    frames: uint8 (T, H, W, 3), RGB.  fps: frames per second.
    audio: float32 (2, N) stereo in [-1, 1], sample 0 at the time of frame 0; None when the clip is silent-less
    (no audio track).  sample_rate: Hz, or None with audio None.
    """

    frames: np.ndarray
    fps: float
    audio: np.ndarray | None = None
    sample_rate: int | None = None

    def __post_init__(self) -> None:
        f = self.frames
        if f.dtype != np.uint8 or f.ndim != 4 or f.shape[-1] != 3 or len(f) == 0:
            raise QualityError(f"frames must be uint8 (T, H, W, 3) with T >= 1, got {f.dtype} {f.shape}")
        if (self.audio is None) != (self.sample_rate is None):
            raise QualityError("audio and sample_rate must both be set or both be None")
        if self.audio is not None and (self.audio.ndim != 2 or self.audio.shape[0] != 2):
            raise QualityError(f"audio must be float32 (2, N) stereo, got shape {self.audio.shape}")

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) in pixels."""
        return int(self.frames.shape[2]), int(self.frames.shape[1])


def read_clip(path: str | os.PathLike) -> ClipData:
    """Decode a whole clip. Raises QualityError naming the file when it is missing, unreadable or has no video."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise QualityError(f"{path}: file not found")
    try:
        container = av.open(path)
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        raise QualityError(f"{path}: not a readable video file ({exc})") from exc
    with container:
        if not container.streams.video:
            raise QualityError(f"{path}: no video stream")
        try:
            return _decode(container, path)
        except (av.error.FFmpegError, ValueError) as exc:
            raise QualityError(f"{path}: video could not be decoded ({exc})") from exc


def _decode(container: av.container.InputContainer, path: str) -> ClipData:
    video = container.streams.video[0]
    video.thread_type = "AUTO"  # frame threading: decode is a large share of the benchmark
    audio = container.streams.audio[0] if container.streams.audio else None
    frames: list[np.ndarray] = []
    chunks: list[np.ndarray] = []
    resampler = av.AudioResampler(format="fltp", layout="stereo", rate=audio.rate) if audio else None
    first_audio_time: float | None = None
    streams = (video, audio) if audio else (video,)
    for packet in container.demux(*streams):
        for frame in packet.decode():
            if isinstance(frame, av.VideoFrame):
                frames.append(frame.to_ndarray(format="rgb24"))
            elif resampler is not None:
                if first_audio_time is None and frame.time is not None:
                    first_audio_time = float(frame.time)
                chunks.extend(r.to_ndarray() for r in resampler.resample(frame))
    if not frames:
        raise QualityError(f"{path}: the video stream holds no decodable frames")
    shapes = {f.shape for f in frames}
    if len(shapes) > 1:
        raise QualityError(f"{path}: frame size changes inside the clip ({sorted(shapes)})")
    fps = _frame_rate(video, len(frames))
    samples, rate = None, None
    if resampler is not None:
        chunks.extend(r.to_ndarray() for r in resampler.resample(None))
        if chunks:
            rate = int(audio.rate)
            start = float(video.start_time * video.time_base) if video.start_time is not None else 0.0
            samples = _align_audio_start(np.concatenate(chunks, axis=1).astype(np.float32),
                                         (first_audio_time or 0.0) - start, rate)
    return ClipData(np.stack(frames), fps, samples, rate)


def _frame_rate(video: av.video.stream.VideoStream, count: int) -> float:
    """The stream's average frame rate; falls back to count / duration, then 24."""
    for rate in (video.average_rate, video.guessed_rate, video.base_rate):
        if rate:
            return float(rate)
    if video.duration and video.time_base:
        return count / float(video.duration * video.time_base)
    return 24.0


def _align_audio_start(samples: np.ndarray, offset_s: float, rate: int) -> np.ndarray:
    """Shift audio so sample 0 plays with frame 0: pad when audio starts late, drop when it starts early."""
    shift = round(offset_s * rate)
    if shift > 0:
        return np.concatenate([np.zeros((2, shift), np.float32), samples], axis=1)
    return samples[:, -shift:] if shift < 0 else samples


def write_clip(path: str | os.PathLike, clip: ClipData, crf: int = 18) -> None:
    """Write H.264 yuv420p video (+ AAC stereo when the clip has audio) to an MP4. Width and height must be even."""
    height, width = clip.frames.shape[1:3]
    if width % 2 or height % 2:
        raise QualityError(f"yuv420p needs even frame sides, got {width}x{height}")
    with av.open(os.fspath(path), "w") as container:
        video = container.add_stream("h264", rate=Fraction(clip.fps).limit_denominator(1001))
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        video.options = {"crf": str(crf), "preset": "veryfast"}
        audio = None
        if clip.audio is not None:
            audio = container.add_stream("aac", rate=clip.sample_rate)
            audio.layout = "stereo"
        for frame in clip.frames:
            container.mux(video.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(video.encode())
        if audio is not None:
            _write_audio(container, audio, clip.audio, clip.sample_rate)


def _write_audio(container: av.container.OutputContainer, stream: av.audio.stream.AudioStream,
                 samples: np.ndarray, rate: int) -> None:
    step = stream.codec_context.frame_size or 1024
    data = np.clip(samples, -1, 1).astype(np.float32)
    for start in range(0, data.shape[1], step):
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(data[:, start:start + step]), format="fltp",
                                           layout="stereo")
        frame.sample_rate, frame.pts = rate, start
        container.mux(stream.encode(frame))
    container.mux(stream.encode())

"""MP4 in and out with PyAV: H.264 yuv420p video plus AAC stereo audio.

Encoder options are fixed and no wall-clock timestamps enter the file, but libx264 has been seen to give different
bytes for identical frames within one process, so compare clips by their frames and audio, not their MP4 bytes.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np

AAC_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
# mbtree=0: x264's macroblock-tree rate control gave different bytes for the same frames from one encode to the next
# (tiny canvases, e.g. 64x32: 3 variants in 10 encodes; deterministic with mbtree=0 or asm=0). The studio addresses
# clips by the sha256 of their MP4 and promises a same-seed clip byte for byte, so the encode must be a function of
# the frames. Cost: mbtree's bitrate saving at the same CRF.
VIDEO_OPTIONS = {"crf": "18", "preset": "medium", "threads": "1", "x264-params": "mbtree=0"}


def encode_mp4(frames: np.ndarray, fps: int, audio: np.ndarray | None = None, sample_rate: int | None = None) -> bytes:
    """Encode `frames` (T, H, W, 3 uint8, H and W even) and optional `audio` (2, N float32 in [-1, 1]) to MP4 bytes."""
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be uint8 (T, H, W, 3), got {frames.dtype} {frames.shape}")
    if audio is not None and sample_rate not in AAC_RATES:
        raise ValueError(f"AAC needs one of {AAC_RATES} Hz, got {sample_rate}")
    buffer = io.BytesIO()
    # `fflags=+bitexact` keeps encoder version strings and creation times out of the file.
    with av.open(buffer, mode="w", format="mp4", options={"fflags": "+bitexact"}) as container:
        video = container.add_stream("libx264", rate=fps, options=VIDEO_OPTIONS)
        video.width, video.height = frames.shape[2], frames.shape[1]
        video.pix_fmt = "yuv420p"
        video.codec_context.flags |= av.codec.context.Flags.bitexact
        audio_stream = None
        if audio is not None:
            audio_stream = container.add_stream("aac", rate=sample_rate, layout="stereo")
            audio_stream.codec_context.flags |= av.codec.context.Flags.bitexact
        for frame in frames:
            for packet in video.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in video.encode():
            container.mux(packet)
        if audio_stream is not None:
            _encode_audio(container, audio_stream, audio, sample_rate)
    return buffer.getvalue()


def _encode_audio(container, stream, audio: np.ndarray, sample_rate: int) -> None:
    samples = np.clip(audio, -1.0, 1.0).astype(np.float32)
    chunk = 1024  # AAC frame size
    for offset in range(0, samples.shape[1], chunk):
        piece = np.ascontiguousarray(samples[:, offset : offset + chunk])
        frame = av.AudioFrame.from_ndarray(piece, format="fltp", layout="stereo")
        frame.sample_rate = sample_rate
        frame.pts = offset
        frame.time_base = Fraction(1, sample_rate)
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)


@dataclass(frozen=True)
class MediaProbe:
    """What an MP4 really holds, read back from the file."""

    video_codec: str
    pix_fmt: str
    width: int
    height: int
    fps: float
    frames: int
    video_seconds: float
    audio_codec: str | None
    audio_channels: int
    sample_rate: int | None
    audio_seconds: float | None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def probe_mp4(data: bytes | str) -> MediaProbe:
    """Decode an MP4 (bytes or a path) fully and report streams, frame count and durations."""
    source = io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else data
    with av.open(source) as container:
        video = container.streams.video[0]
        frames = sum(1 for _ in container.decode(video))
        fps = float(video.average_rate)
        audio_seconds = audio_codec = sample_rate = None
        channels = 0
        if container.streams.audio:
            container.seek(0)
            stream = container.streams.audio[0]
            audio_codec, sample_rate = stream.codec_context.name, stream.codec_context.sample_rate
            channels = stream.codec_context.channels
            samples = sum(frame.samples for frame in container.decode(stream))
            audio_seconds = samples / sample_rate
        return MediaProbe(
            video_codec=video.codec_context.name,
            pix_fmt=video.codec_context.pix_fmt,
            width=video.codec_context.width,
            height=video.codec_context.height,
            fps=fps,
            frames=frames,
            video_seconds=frames / fps,
            audio_codec=audio_codec,
            audio_channels=channels,
            sample_rate=sample_rate,
            audio_seconds=audio_seconds,
        )


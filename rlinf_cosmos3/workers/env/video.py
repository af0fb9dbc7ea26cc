"""Per-episode mp4 of what the policy saw: main and wrist view side by side, one frame per step.

Frames are streamed into the encoder as chunks arrive (a 520-step episode would be ~200 MB of raw
frames per env), to a temporary name that is renamed only when the episode is complete, so a
crashed attempt never leaves a video that looks finished.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

CODEC = "libx264"
PIXEL_FORMAT = "yuv420p"


def side_by_side(main_images: np.ndarray, wrist_images: np.ndarray) -> np.ndarray:
    """``[T, H, W, 3]`` main and wrist views -> ``[T, H, 2W, 3]`` uint8 (main on the left)."""
    main, wrist = np.asarray(main_images), np.asarray(wrist_images)
    if main.shape != wrist.shape or main.ndim != 4 or main.shape[-1] != 3:
        raise ValueError(f"expected two [T, H, W, 3] stacks of equal shape, got {main.shape} and {wrist.shape}")
    return np.ascontiguousarray(np.concatenate([main, wrist], axis=2), dtype=np.uint8)


class EpisodeVideoWriter:
    """Streams frames of one episode into ``path`` (H.264, yuv420p); use :meth:`finish` or :meth:`discard`."""

    def __init__(self, path: str | Path, fps: int) -> None:
        self.path = Path(path)
        self.fps = int(fps)
        self.num_frames = 0
        self._tmp = self.path.with_name(self.path.name + ".partial")
        self._container: Any = None
        self._stream: Any = None

    def add(self, main_images: np.ndarray, wrist_images: np.ndarray) -> None:
        """Append ``T`` steps (one frame each)."""
        import av

        frames = side_by_side(main_images, wrist_images)
        if self._container is None:
            self._tmp.parent.mkdir(parents=True, exist_ok=True)
            self._container = av.open(str(self._tmp), mode="w", format="mp4")
            self._stream = self._container.add_stream(CODEC, rate=self.fps)
            self._stream.height, self._stream.width = frames.shape[1], frames.shape[2]
            self._stream.pix_fmt = PIXEL_FORMAT
        for frame in frames:
            video_frame = av.VideoFrame.from_ndarray(frame, format="rgb24")
            for packet in self._stream.encode(video_frame):
                self._container.mux(packet)
        self.num_frames += len(frames)

    def finish(self, final_path: str | Path | None = None) -> Path | None:
        """Flush, close and move the video to ``final_path`` (default: ``path``); None if no frame came."""
        if self._container is None:
            return None
        for packet in self._stream.encode():
            self._container.mux(packet)
        self._container.close()
        self._container = None
        target = Path(final_path) if final_path is not None else self.path
        self._tmp.replace(target)
        return target

    def discard(self) -> None:
        """Drop the unfinished video (a crashed attempt)."""
        if self._container is not None:
            import av

            try:
                self._container.close()
            except (av.error.FFmpegError, OSError) as exc:  # the muxer may refuse half a stream
                logger.debug("closing discarded video %s: %s", self._tmp, exc)
            self._container = None
        self._tmp.unlink(missing_ok=True)
        self.num_frames = 0

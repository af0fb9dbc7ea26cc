"""Frame windows of cameras stored as LeRobot ``image`` features, read straight to uint8.

``LeRobotDataset.create(..., use_videos=False)`` stores each camera frame as a PNG inside the
parquet rows. lerobot 0.6.1 reads them through its ``hf_dataset`` transform, which turns every
image into float32 ``k / 255``; and its window queries (``hf_dataset[key][rows]`` under a custom
format) decode *every* column of every queried row. For two cameras, a 17-frame window and a
16-step action window that is ~100 PNG decodes and float conversions per sample, over 20x the CPU
of the same episodes stored as video (docs/benchmarks.md, "Training reader").

Here the window's PNGs are taken from the Arrow rows and decoded once each (a thread per camera,
as lerobot does for videos) to uint8, i.e. the stored pixels (what lerobot's float frames give
back exactly as ``round(x * 255)``), and lerobot's format is narrowed to the other columns so that
it never decodes an image. The window rule is lerobot's: the query is clamped to the episode, and
frames outside it are marked as padding.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from lerobot.datasets.io_utils import hf_transform_to_torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset
from PIL import Image

from rlinf_cosmos3.data.frame_windows import clamp_to_episode, row_lookup


class ImageFeatureWindows:
    """Frames ``index .. index + num_frames - 1`` of the image-feature cameras ``keys``.

    ``windows(index, episode)`` -> ``({camera: uint8 [T, 3, H, W]}, is_pad bool [T])``; ``index``
    is the dataset's ``index`` column (absolute frame index), as in lerobot's own windows.
    """

    def __init__(self, dataset: LeRobotDataset, keys: Sequence[str], num_frames: int) -> None:
        meta, hf = dataset.meta, dataset.hf_dataset
        not_images = [key for key in keys if key not in meta.image_keys]
        if not_images:
            raise ValueError(f"cameras {not_images} are not image features of the dataset")
        self.keys = list(keys)
        self.deltas = np.arange(num_frames, dtype=np.int64)
        self._rows = hf.with_format("arrow", columns=self.keys)  # raw PNG bytes, nothing decoded
        # lerobot keeps reading every other column; it no longer decodes any image.
        hf.set_transform(hf_transform_to_torch, columns=[c for c in hf.column_names if c not in meta.image_keys])
        self._row_of = row_lookup(hf.with_format("arrow", columns=["index"])[:].column("index").to_numpy())
        episodes = meta.episodes.select_columns(["episode_index", "dataset_from_index", "dataset_to_index"])
        self._bounds = {
            int(ep): (int(start), int(end))
            for ep, start, end in zip(episodes["episode_index"], episodes["dataset_from_index"],
                                      episodes["dataset_to_index"], strict=True)
        }

    def __call__(self, index: int, episode: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        start, end = self._bounds[episode]
        wanted = index + self.deltas
        clamped, is_pad = clamp_to_episode(wanted, start, end)
        rows = self._row_of[clamped]
        if (rows < 0).any():
            raise IndexError(f"frames {wanted.tolist()} of episode {episode} are not among the loaded rows")
        table = self._rows[rows.tolist()]
        cells = {key: table.column(key).to_pylist() for key in self.keys}
        if len(self.keys) == 1:
            return {key: decode_png_column(c, key) for key, c in cells.items()}, torch.from_numpy(is_pad)
        # One thread per camera, as lerobot decodes videos (PIL releases the GIL while decoding).
        with ThreadPoolExecutor(max_workers=len(self.keys)) as pool:
            futures = {key: pool.submit(decode_png_column, c, key) for key, c in cells.items()}
            return {key: f.result() for key, f in futures.items()}, torch.from_numpy(is_pad)


def decode_png_column(cells: list[dict], key: str) -> torch.Tensor:
    """Stored image cells (``{"bytes", "path"}``) -> uint8 ``[T, 3, H, W]`` RGB."""
    images = []
    for cell in cells:
        if not cell or cell.get("bytes") is None:
            raise ValueError(f"camera '{key}': a frame has no embedded image bytes (path {cell and cell.get('path')})")
        with Image.open(io.BytesIO(cell["bytes"])) as img:
            images.append(np.asarray(img if img.mode == "RGB" else img.convert("RGB")))
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous()

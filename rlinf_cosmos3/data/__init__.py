"""LeRobot v3 LIBERO dataset -> training samples (frames, normalised 10-D action chunks, prompt).

The reader (:class:`LiberoLeRobotDataset`, :func:`collate_samples`) needs torch and lerobot; they
are imported on first use, so the dataset checks (``data.checks``) stay importable by the SFT
driver's config validation without them. The ``data.dataset`` schema is :mod:`rlinf_cosmos3.config.data`.
Layout and padding rules: docs/data.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlinf_cosmos3.config.data import (
    MAIN_IMAGE_KEY,
    SUPPORTED_NORMALIZATIONS,
    WRIST_IMAGE_KEY,
    LiberoDataConfig,
    image_output_name,
)
from rlinf_cosmos3.data.checks import DatasetMismatchError, check_dataset_info

if TYPE_CHECKING:
    from rlinf_cosmos3.data.collate import collate_samples
    from rlinf_cosmos3.data.dataset import LiberoLeRobotDataset

# Names whose modules import torch/lerobot: loaded by __getattr__ when first asked for.
_LAZY = {
    "LiberoLeRobotDataset": "rlinf_cosmos3.data.dataset",
    "collate_samples": "rlinf_cosmos3.data.collate",
}

__all__ = [
    "MAIN_IMAGE_KEY",
    "SUPPORTED_NORMALIZATIONS",
    "WRIST_IMAGE_KEY",
    "DatasetMismatchError",
    "LiberoDataConfig",
    "LiberoLeRobotDataset",
    "check_dataset_info",
    "collate_samples",
    "image_output_name",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rlinf_cosmos3.data' has no attribute '{name}'")

"""LeRobot v3 LIBERO dataset -> training samples (frames, normalised 10-D action chunks, prompt).

Main environment only (needs torch and lerobot). Layout and padding rules: docs/data.md.
"""

from rlinf_cosmos3.data.checks import DatasetMismatchError
from rlinf_cosmos3.data.collate import collate_samples
from rlinf_cosmos3.data.config import (
    MAIN_IMAGE_KEY,
    SUPPORTED_NORMALIZATIONS,
    WRIST_IMAGE_KEY,
    LiberoDataConfig,
    image_output_name,
)
from rlinf_cosmos3.data.dataset import LiberoLeRobotDataset

__all__ = [
    "MAIN_IMAGE_KEY",
    "SUPPORTED_NORMALIZATIONS",
    "WRIST_IMAGE_KEY",
    "DatasetMismatchError",
    "LiberoDataConfig",
    "LiberoLeRobotDataset",
    "collate_samples",
    "image_output_name",
]

"""Kept for code that imports the dataset schema from here: the ``data.dataset`` section
(:class:`LiberoDataConfig`) and the dataset's feature keys and widths live in
:mod:`rlinf_cosmos3.config.data`, with the other config sections (configs import no piece of the library)."""

from rlinf_cosmos3.config.data import (
    ACTION_KEY,
    DATA_SETTING_KEYS,
    MAIN_IMAGE_KEY,
    RAW_ACTION_DIM,
    STATE_DIM,
    STATE_KEY,
    SUPPORTED_NORMALIZATIONS,
    WRIST_IMAGE_KEY,
    LiberoDataConfig,
    image_output_name,
)

__all__ = ["ACTION_KEY", "DATA_SETTING_KEYS", "MAIN_IMAGE_KEY", "RAW_ACTION_DIM", "STATE_DIM", "STATE_KEY",
           "SUPPORTED_NORMALIZATIONS", "WRIST_IMAGE_KEY", "LiberoDataConfig", "image_output_name"]

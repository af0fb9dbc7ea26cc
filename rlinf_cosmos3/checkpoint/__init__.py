"""Checkpoints: atomic ``global_step_<N>`` directories with exported weights and the resume state.

The names are loaded on first use (PEP 562): config validation imports ``checkpoint.layout``, which
must not import torch the way ``checkpoint.load`` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlinf_cosmos3.lazy_exports import lazy_exports

_HOMES = {
    "CheckpointError": "errors", "InsufficientSpaceError": "errors",
    "clean_stale_temp_dirs": "layout", "full_weights_path": "layout", "is_complete_checkpoint": "layout",
    "latest_checkpoint": "layout", "list_checkpoints": "layout", "parse_step": "layout", "step_dir_name": "layout",
    "load_checkpoint": "load", "load_full_weights": "load",
    "delete_checkpoint": "retention", "prune_checkpoints": "retention",
    "capture_rng_state": "rng", "restore_rng_state": "rng",
    "save_checkpoint": "save",
    "CheckpointSize": "size", "estimate_checkpoint_size": "size", "model_footprint": "size",
    "TrainerState": "trainer_state",
}
"""Public name -> the module of this package that defines it."""

if TYPE_CHECKING:
    from rlinf_cosmos3.checkpoint.errors import CheckpointError, InsufficientSpaceError
    from rlinf_cosmos3.checkpoint.layout import (
        clean_stale_temp_dirs,
        full_weights_path,
        is_complete_checkpoint,
        latest_checkpoint,
        list_checkpoints,
        parse_step,
        step_dir_name,
    )
    from rlinf_cosmos3.checkpoint.load import load_checkpoint, load_full_weights
    from rlinf_cosmos3.checkpoint.retention import delete_checkpoint, prune_checkpoints
    from rlinf_cosmos3.checkpoint.rng import capture_rng_state, restore_rng_state
    from rlinf_cosmos3.checkpoint.save import save_checkpoint
    from rlinf_cosmos3.checkpoint.size import CheckpointSize, estimate_checkpoint_size, model_footprint
    from rlinf_cosmos3.checkpoint.trainer_state import TrainerState

__all__ = [
    "CheckpointError",
    "CheckpointSize",
    "InsufficientSpaceError",
    "TrainerState",
    "capture_rng_state",
    "clean_stale_temp_dirs",
    "delete_checkpoint",
    "estimate_checkpoint_size",
    "full_weights_path",
    "is_complete_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "load_full_weights",
    "model_footprint",
    "parse_step",
    "prune_checkpoints",
    "restore_rng_state",
    "save_checkpoint",
    "step_dir_name",
]

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

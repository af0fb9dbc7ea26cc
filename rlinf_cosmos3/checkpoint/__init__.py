"""Checkpoints: atomic ``global_step_<N>`` directories with exported weights and the resume state."""

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

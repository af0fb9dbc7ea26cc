"""Resume from a complete checkpoint, and read exported weights."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.optim.lr_scheduler import LRScheduler

from rlinf_cosmos3.checkpoint import _dist
from rlinf_cosmos3.checkpoint.layout import (
    DCP_DIR,
    SCHEDULER_FILE,
    TRAINER_STATE_FILE,
    actor_dir,
    full_weights_path,
    is_complete_checkpoint,
    read_marker,
    rng_path,
)
from rlinf_cosmos3.checkpoint.rng import restore_rng_state
from rlinf_cosmos3.checkpoint.save import CheckpointError
from rlinf_cosmos3.checkpoint.trainer_state import TrainerState
from rlinf_cosmos3.components.ema import PowerEMA

logger = logging.getLogger(__name__)


def _require_complete(step_dir: Path) -> None:
    if not is_complete_checkpoint(step_dir):
        raise CheckpointError(
            f"{step_dir} is not a complete checkpoint (needs the name global_step_<N> and a COMPLETE "
            "marker; temp dirs of interrupted saves are never loaded)"
        )


def load_checkpoint(
    step_dir: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: LRScheduler | None = None,
    ema: PowerEMA | None = None,
    *,
    restore_rng: bool = True,
) -> TrainerState:
    """Restore model, optimizer, EMA, scheduler and this rank's RNG from ``step_dir``; return progress.

    Collective: all ranks call it, with the model already built, sharded and given its trainable
    selection, and the optimizer/scheduler/EMA built as for a fresh run. Sharded state is loaded
    with torch.distributed.checkpoint, so the world size may differ from the save's; the RNG
    states are then restored only for ranks that existed at save time (others log a warning).
    If the EMA is enabled but the checkpoint has none, the EMA warm-starts from the loaded
    weights (as cosmos-framework does when it skips ``net_ema.`` keys), with a warning.
    """
    step_dir = Path(step_dir)
    _require_complete(step_dir)
    marker = read_marker(step_dir)
    if optimizer is not None and not marker.get("optimizer", True):
        raise CheckpointError(f"{step_dir} was saved without optimizer state; load it without an optimizer")

    if optimizer is not None:
        model_state, optim_state = get_state_dict(model, optimizer)
        state: dict[str, Any] = {"model": model_state, "optimizer": optim_state}
    else:
        state = {"model": get_model_state_dict(model)}
    use_ema = ema is not None and ema.enabled
    if use_ema and marker.get("ema"):
        state["ema"] = ema.state_dict()
    with _dist.single_process_quiet():
        dcp.load(state, checkpoint_id=actor_dir(step_dir) / DCP_DIR, no_dist=not _dist.initialized())

    if optimizer is not None:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    else:
        set_model_state_dict(model, state["model"])
    if use_ema:
        if "ema" in state:
            ema.load_state_dict(state["ema"])
        else:
            logger.warning("%s has no EMA state; the EMA restarts from the loaded weights", step_dir)
            ema.reset_to_model()

    if scheduler is not None:
        scheduler_path = actor_dir(step_dir) / SCHEDULER_FILE
        if not scheduler_path.is_file():
            raise CheckpointError(f"{step_dir} was saved without scheduler state")
        scheduler.load_state_dict(torch.load(scheduler_path, weights_only=True))

    if restore_rng:
        path = rng_path(step_dir, _dist.rank())
        if path.is_file():
            restore_rng_state(torch.load(path, weights_only=True))
        else:
            logger.warning(
                "no RNG state for rank %d in %s (saved with world size %s)",
                _dist.rank(),
                step_dir,
                marker.get("world_size"),
            )

    trainer_state = TrainerState.read(actor_dir(step_dir) / TRAINER_STATE_FILE)
    _dist.barrier()
    logger.info("resumed from %s at global step %d", step_dir, trainer_state.global_step)
    return trainer_state


def load_full_weights(path: str | Path, *, ema: bool = False) -> dict[str, torch.Tensor]:
    """The consolidated state dict of ``full_weights.pt`` (or of a step dir's, ``ema`` picking the EMA copy).

    Loaded with ``weights_only=True`` and memory-mapped, so a large file is paged in lazily.
    """
    path = Path(path)
    if path.is_dir():
        _require_complete(path)
        path = full_weights_path(path, ema=ema)
    if not path.is_file():
        raise FileNotFoundError(f"no exported weights at {path}")
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)

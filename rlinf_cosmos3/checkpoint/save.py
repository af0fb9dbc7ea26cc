"""Atomic, collective checkpoint save: export weights plus the full resume state.

Every rank calls :func:`save_checkpoint` with the same arguments. The save writes into
``global_step_<N>.tmp-<uuid>``; only when every rank reports success does rank 0 write the
``COMPLETE`` marker and rename the directory to ``global_step_<N>``. A failure on any rank raises
:class:`CheckpointError` on all ranks and removes the temp dir; a killed process leaves only the
temp dir, which readers ignore and the next save deletes. The checkpoint directory must be on a
filesystem every rank sees (one node, or a shared filesystem across nodes).

A write that fails because the filesystem is full (ENOSPC, or torch's errno-less "unexpected pos"
once a free-space probe confirms it) raises :class:`InsufficientSpaceError` saying so, with the
bytes this checkpoint needs and the bytes that were free.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict
from torch.optim.lr_scheduler import LRScheduler

from rlinf_cosmos3.checkpoint import _dist, disk
from rlinf_cosmos3.checkpoint.errors import CheckpointError, InsufficientSpaceError
from rlinf_cosmos3.checkpoint.layout import (
    ACTOR_DIR,
    COMPLETE_MARKER,
    DCP_DIR,
    SCHEDULER_FILE,
    TRAINER_STATE_FILE,
    actor_dir,
    clean_stale_temp_dirs,
    full_weights_path,
    is_complete_checkpoint,
    rng_path,
    step_dir_name,
)
from rlinf_cosmos3.checkpoint.rng import capture_rng_state
from rlinf_cosmos3.checkpoint.size import CheckpointSize, estimate_checkpoint_size, model_footprint
from rlinf_cosmos3.checkpoint.trainer_state import TrainerState
from rlinf_cosmos3.components.ema import PowerEMA

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1

__all__ = ["CheckpointError", "InsufficientSpaceError", "save_checkpoint"]


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


def _capture(action: Callable[[], None], what: str) -> str | None:
    """Run a rank-local step; return its error text instead of raising, so all ranks can agree."""
    try:
        action()
    except Exception as err:
        logger.exception("checkpoint %s failed on rank %d", what, _dist.rank())
        return _describe(err)
    return None


def _raise_if_any_failed(local_error: str | None, what: str) -> None:
    """Collective: raise the same :class:`CheckpointError` on every rank if any rank failed."""
    failures = [(r, e) for r, e in enumerate(_dist.all_gather(local_error)) if e is not None]
    if failures:
        detail = "; ".join(f"rank {r}: {e}" for r, e in failures)
        raise CheckpointError(f"checkpoint {what} failed ({detail})")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _full_disk_error(
    err: BaseException, ckpt_dir: Path, final: Path, tmp: Path, needed: CheckpointSize, free_at_start: int
) -> InsufficientSpaceError | None:
    """The error to raise instead of ``err`` if the save failed because the disk is full, else None.

    An ENOSPC/EDQUOT errno (or its message) anywhere in ``err`` is proof. torch's zip writer reports
    a short write with no errno ("unexpected pos ..."), so such text counts only if a probe confirms
    that the rest of this checkpoint cannot fit: free bytes now < estimated size - bytes written.
    """
    cause = disk.full_disk_cause(err)
    if cause is None:
        return None
    free_now = disk.free_bytes(ckpt_dir)
    written = disk.used_bytes(tmp)
    if not disk.is_proven_full(err) and free_now >= needed.total - written:
        return None
    return InsufficientSpaceError(
        f"checkpoint {final.name} could not be written to {ckpt_dir}: its filesystem is full ({cause}). "
        f"One checkpoint needs about {needed.describe()} = {needed.total:,} bytes; "
        f"{free_at_start:,} bytes ({disk.format_bytes(free_at_start)}) were free when the save started, "
        f"{free_now:,} are free now with {written:,} written. The incomplete {tmp.name} is removed and no "
        "checkpoint was lost. Fix: free space on that filesystem, write checkpoints to a larger one "
        "(SFT: runner.log_path) or keep fewer of them (SFT: runner.max_checkpoints_to_keep)."
    )


def _prepare(ckpt_dir: Path, final: Path, overwrite: bool) -> Path:
    """Rank 0: clean stale temp dirs, refuse to clobber a complete step, create the temp dir."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    clean_stale_temp_dirs(ckpt_dir)
    if is_complete_checkpoint(final) and not overwrite:
        raise CheckpointError(
            f"{final} already holds a complete checkpoint; pass overwrite=True to replace it"
        )
    tmp = ckpt_dir / f"{final.name}.tmp-{uuid.uuid4().hex}"
    tmp.mkdir()
    return tmp


def _publish(tmp: Path, final: Path, marker: dict[str, Any]) -> None:
    """Rank 0: write the COMPLETE marker, then rename the temp dir into place."""
    marker_path = tmp / COMPLETE_MARKER
    with open(marker_path, "w") as fh:
        json.dump(marker, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())
    old = None
    if final.exists():
        # Either overwrite=True on a complete step, or a directory with the right name but no
        # marker (not a checkpoint). Move it aside first: os.rename cannot replace a non-empty dir.
        old = final.with_name(f"{final.name}.old-{uuid.uuid4().hex}")
        logger.warning("replacing existing %s", final)
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old)


def _write_local(
    tmp: Path,
    trainer_state: TrainerState,
    scheduler: LRScheduler | None,
    full_state: dict[str, torch.Tensor] | None,
    ema_full_state: dict[str, torch.Tensor] | None,
    extra_files: Mapping[str, str] | None = None,
) -> None:
    """Files each rank writes alone: RNG on every rank; weights, scheduler, progress and the
    caller's extra files on rank 0."""
    rank = _dist.rank()
    path = rng_path(tmp, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(capture_rng_state(), path)
    if rank != 0:
        return
    actor = actor_dir(tmp)
    if full_state is not None:
        full_weights_path(tmp).parent.mkdir(parents=True, exist_ok=True)
        torch.save(full_state, full_weights_path(tmp))
    if ema_full_state is not None:
        torch.save(ema_full_state, full_weights_path(tmp, ema=True))
    if scheduler is not None:
        torch.save(scheduler.state_dict(), actor / SCHEDULER_FILE)
    trainer_state.write(actor / TRAINER_STATE_FILE)
    for name, text in (extra_files or {}).items():
        with open(tmp / name, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())


def _check_extra_files(extra_files: Mapping[str, str] | None) -> None:
    """Extra files are plain names at the step directory's root that no checkpoint file uses."""
    for name in extra_files or {}:
        if Path(name).name != name or name in ("", ".", "..", COMPLETE_MARKER, ACTOR_DIR):
            raise ValueError(f"extra checkpoint file {name!r} must be a plain file name other than "
                             f"{COMPLETE_MARKER!r} and {ACTOR_DIR!r}")


@dataclass(frozen=True)
class _SavePlan:
    """What every rank agreed on before writing: where the step goes, its temp dir, what it needs."""

    final: Path
    tmp: Path
    needed: CheckpointSize
    free_at_start: int


def _plan_save(ckpt_dir: Path, final: Path, overwrite: bool, needed: CheckpointSize) -> _SavePlan:
    """Collective: rank 0 prepares the temp dir (:func:`_prepare`) and probes the free space; every rank gets
    the same plan, or the same :class:`CheckpointError`."""
    plan: dict[str, Any] = {}
    if _dist.rank() == 0:
        try:
            plan = {"tmp": str(_prepare(ckpt_dir, final, overwrite)), "free": disk.free_bytes(ckpt_dir)}
        except Exception as err:
            logger.exception("cannot start checkpoint %s", final)
            plan = {"error": _describe(err)}
    plan = _dist.broadcast_from_rank0(plan)
    if "error" in plan:
        raise CheckpointError(f"cannot save {final}: {plan['error']}")
    return _SavePlan(final, Path(plan["tmp"]), needed, int(plan["free"]))


@contextmanager
def _removed_unless_published(plan: _SavePlan) -> Iterator[None]:
    """The atomicity guarantee: whatever fails inside (on any rank, or an interrupt), the temp dir is removed
    and nothing is renamed into place; a failure caused by a full disk is re-raised as
    :class:`InsufficientSpaceError`."""
    try:
        yield
    except BaseException as err:
        full_disk = None
        try:  # diagnose before removing: the probe counts what the temp dir holds
            if isinstance(err, Exception):  # not for KeyboardInterrupt / SystemExit
                full_disk = _full_disk_error(err, plan.final.parent, plan.final, plan.tmp, plan.needed,
                                             plan.free_at_start)
        finally:
            if _dist.rank() == 0 and plan.tmp.exists():
                logger.warning("removing incomplete checkpoint %s", plan.tmp)
                shutil.rmtree(plan.tmp, ignore_errors=True)
        if full_disk is not None:
            raise full_disk from err
        raise


def _write_all(
    plan: _SavePlan,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    trainer_state: TrainerState,
    scheduler: LRScheduler | None,
    ema: PowerEMA | None,
    save_full_weights: bool,
    extra_files: Mapping[str, str] | None,
) -> None:
    """Collective: the sharded resume state (DCP), then each rank's own files (:func:`_write_local`) into the
    temp dir; raises the same :class:`CheckpointError` on every rank if any rank failed."""
    # torch.distributed.checkpoint agrees on failures itself (it gathers every rank's exception and raises on
    # all of them).
    if optimizer is not None:
        model_state, optim_state = get_state_dict(model, optimizer)
        resume_state: dict[str, Any] = {"model": model_state, "optimizer": optim_state}
    else:
        resume_state = {"model": get_model_state_dict(model)}
    if ema is not None:
        resume_state["ema"] = ema.state_dict()
    try:
        with _dist.single_process_quiet():
            dcp.save(resume_state, checkpoint_id=actor_dir(plan.tmp) / DCP_DIR, no_dist=not _dist.initialized())
    except CheckpointException as err:
        raise CheckpointError(f"sharded save of {plan.final.name} failed: {err}") from err
    del resume_state

    full_state = ema_full_state = None
    if save_full_weights:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full_state = get_model_state_dict(model, options=options)
        if ema is not None:
            ema_full_state = ema.full_state_dict(full_state)
        if _dist.rank() != 0:
            full_state = ema_full_state = None

    write = functools.partial(_write_local, plan.tmp, trainer_state, scheduler, full_state, ema_full_state,
                              extra_files)
    full_state = ema_full_state = None
    error = _capture(write, "write")
    del write  # frees rank 0's consolidated copies before the collective below
    _raise_if_any_failed(error, f"write of {plan.final.name}")


def _publish_all(plan: _SavePlan, marker: dict[str, Any]) -> None:
    """Collective: rank 0 writes the marker and renames the temp dir into place (:func:`_publish`); every
    rank raises if that failed."""
    error = _capture(lambda: _publish(plan.tmp, plan.final, marker), "publish") if _dist.rank() == 0 else None
    _raise_if_any_failed(error, f"publish of {plan.final.name}")


def save_checkpoint(
    ckpt_dir: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    trainer_state: TrainerState,
    scheduler: LRScheduler | None = None,
    ema: PowerEMA | None = None,
    *,
    overwrite: bool = False,
    save_full_weights: bool = True,
    extra_files: Mapping[str, str] | None = None,
) -> Path:
    """Write ``<ckpt_dir>/global_step_<trainer_state.global_step>`` atomically; return its path.

    Collective: all ranks call it. Contents (see :mod:`rlinf_cosmos3.checkpoint.layout`):
    ``full_weights.pt`` (the consolidated model state dict, dtypes as trained, keys of
    ``get_model_state_dict`` = the model's ``state_dict()`` keys without wrapper segments),
    ``full_weights_ema.pt`` when ``ema`` is enabled, and the resume state — sharded model,
    optimizer and EMA shadow via torch.distributed.checkpoint, the scheduler, ``trainer_state``
    and every rank's RNG. Rank 0 holds the consolidated weights (and the fp32 EMA) in CPU memory
    while writing them; pass ``save_full_weights=False`` to skip the export. ``extra_files``
    (file name -> text) are written by rank 0 at the step directory's root inside the atomic save,
    e.g. the model identity (``model_identity.json``) the converter carries to the served model.

    Three steps: plan (temp dir, free space), write (into the temp dir), publish (marker, rename); a failure
    in the last two removes the temp dir (:func:`_removed_unless_published`).
    """
    _check_extra_files(extra_files)
    started = time.monotonic()
    ckpt_dir = Path(ckpt_dir)
    use_ema = ema is not None and ema.enabled
    needed = estimate_checkpoint_size(
        model_footprint(model),
        world_size=_dist.world_size(),
        ema=use_ema,
        optimizer=optimizer is not None,
        full_weights=save_full_weights,
    )
    plan = _plan_save(ckpt_dir, ckpt_dir / step_dir_name(trainer_state.global_step), overwrite, needed)
    with _removed_unless_published(plan):
        _write_all(plan, model, optimizer, trainer_state, scheduler, ema if use_ema else None, save_full_weights,
                   extra_files)
        _publish_all(plan, {
            "format_version": FORMAT_VERSION,
            "global_step": trainer_state.global_step,
            "world_size": _dist.world_size(),
            "ema": use_ema,
            "full_weights": save_full_weights,
            "optimizer": optimizer is not None,
            "scheduler": scheduler is not None,
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        })
    logger.info("saved checkpoint %s in %.1f s", plan.final, time.monotonic() - started)
    return plan.final

"""Will the run's checkpoints fit on disk? Checked before Ray starts, before each save and after it.

The driver sizes one checkpoint without touching a GPU: it builds the transformer on the ``meta``
device from the model directory's ``transformer/config.json`` (as every rank does before
sharding), applies the ranks' own trainable selection (:func:`select_trainable` with
``actor.model.keys_to_select``) and feeds the result to the checkpoint layer's estimator. A run
whose checkpoint directory cannot take one checkpoint is refused before any step is paid for.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from rlinf_cosmos3.checkpoint import disk
from rlinf_cosmos3.checkpoint.layout import list_checkpoints, parse_step, step_dir_name
from rlinf_cosmos3.checkpoint.size import CheckpointSize, estimate_checkpoint_size, model_footprint
from rlinf_cosmos3.components.optim import build_param_groups, select_trainable
from rlinf_cosmos3.config import ConfigError
from rlinf_cosmos3.config.sft import SFTConfig

logger = logging.getLogger("rlinf_cosmos3.sft")


def checkpoint_root(cfg: SFTConfig) -> Path:
    """``<log_path>/<experiment_name>/checkpoints``: where ``global_step_<N>/`` directories go."""
    return Path(cfg.runner.log_path) / cfg.runner.experiment_name / "checkpoints"


@dataclass(frozen=True)
class CheckpointPlan:
    """One checkpoint's estimated size and the parameter counts it was computed from."""

    size: CheckpointSize
    trainable_params: int
    total_params: int


def plan_checkpoints(cfg: SFTConfig) -> CheckpointPlan:
    """Size one checkpoint of this run from the model directory (meta device: no memory, no GPU)."""
    from rlinf_cosmos3.models.cosmos3.loading import build_transformer_on_meta

    model = cfg.actor.model
    try:
        transformer = build_transformer_on_meta(model.model_path)
    except (OSError, ValueError) as err:
        raise ConfigError("actor.model.model_path", f"cannot build the transformer from its config: {err}",
                          "point it at a complete diffusers Cosmos3 directory") from err
    try:
        selection = select_trainable(transformer, model.keys_to_select)
    except ValueError as err:
        raise ConfigError("actor.model.keys_to_select", str(err),
                          "use substrings of the transformer's parameter names") from err
    try:  # as every rank groups its parameters: a multiplier key that matches nothing is an error there
        build_param_groups(transformer, cfg.actor.optim.lr, cfg.actor.optim.weight_decay, model.lr_multipliers)
    except ValueError as err:
        raise ConfigError("actor.model.lr_multipliers", str(err),
                          "use substrings of the names of trainable parameters (see actor.model.keys_to_select)") from err
    size = estimate_checkpoint_size(
        model_footprint(transformer), world_size=cfg.cluster.world_size, ema=model.ema_enabled
    )
    return CheckpointPlan(size, selection.n_trainable, selection.n_trainable + selection.n_frozen)


def save_steps(start: int, cfg: SFTConfig) -> list[int]:
    """The steps after ``start`` at which the run saves (every ``save_interval`` and the last)."""
    runner = cfg.runner
    return [s for s in range(start + 1, runner.max_steps + 1) if s % runner.save_interval == 0 or s == runner.max_steps]


def _fix(cfg: SFTConfig) -> str:
    """What to do about too little space; retention is named only where it can help."""
    root, keep = checkpoint_root(cfg), cfg.runner.max_checkpoints_to_keep
    fix = "free space on that filesystem or point runner.log_path at a filesystem with room"
    existing = list_checkpoints(root)
    if existing:
        fix += (f"; {len(existing)} checkpoint(s) of this run are in {root}: delete old ones or "
                + ("set runner.max_checkpoints_to_keep (now null: all are kept)" if keep is None
                   else f"lower runner.max_checkpoints_to_keep (now {keep})"))
    return fix


def require_space_for_save(cfg: SFTConfig, size: CheckpointSize, step: int, *, note: str = "") -> int:
    """Raise :class:`InsufficientSpaceError` unless the checkpoint dir can take ``global_step_<step>``.

    One whole checkpoint must fit: the new one is written before retention deletes the oldest.
    Returns the free bytes.
    """
    fix = _fix(cfg) + (f". {note}" if note else "")
    return disk.require_free_space(checkpoint_root(cfg), size.required,
                                   what=f"checkpoint {step_dir_name(step)}, {size.describe_required()}", fix=fix)


def check_no_earlier_checkpoint_in_the_way(cfg: SFTConfig, steps: list[int]) -> None:
    """Refuse a run that would save over an earlier run's complete checkpoint (the save refuses to replace
    one, so the run would otherwise stop at that save, with the steps before it lost)."""
    root = checkpoint_root(cfg)
    existing = list_checkpoints(root)
    complete = {parse_step(path) for path in existing}
    taken = [step for step in steps if step in complete]
    if not taken:
        return
    latest = existing[-1]
    raise ConfigError(
        "runner.log_path",
        f"'{root}' already holds complete checkpoints of an earlier run at steps this run saves "
        f"({', '.join(step_dir_name(s) for s in taken)})",
        f"continue that run with runner.resume_dir={latest}, or point runner.log_path (or "
        f"runner.experiment_name) elsewhere, or delete {root} if it is no longer needed",
    )


def preflight(cfg: SFTConfig) -> CheckpointPlan:
    """Before Ray starts: size a checkpoint, refuse if the first save cannot fit, warn about later ones."""
    plan = plan_checkpoints(cfg)
    resume_step = parse_step(cfg.runner.resume_dir) if cfg.runner.resume_dir else 0
    steps = save_steps(resume_step or 0, cfg)
    logger.info("one checkpoint takes about %s; this run saves %d more", plan.size.describe(), len(steps))
    if not steps:
        return plan
    check_no_earlier_checkpoint_in_the_way(cfg, steps)
    free = require_space_for_save(cfg, plan.size, steps[0])
    keep = cfg.runner.max_checkpoints_to_keep
    # New checkpoints on disk at once: all of them, or keep + 1 (a new one is written before the
    # oldest is deleted) less the checkpoints already there, which retention deletes first.
    existing = len(list_checkpoints(checkpoint_root(cfg)))
    new = len(steps) if keep is None else min(len(steps), max(1, keep + 1 - existing))
    need = (new - 1) * plan.size.total + plan.size.required
    if need > free:
        logger.warning(
            "the %d new checkpoints this run will hold at once need about %s but %s are free in %s: the run "
            "will stop when the next one no longer fits (fix: free space, point runner.log_path at a larger "
            "filesystem, or %s)", new, disk.format_bytes(need), disk.format_bytes(free), checkpoint_root(cfg),
            "set runner.max_checkpoints_to_keep" if keep is None else f"lower runner.max_checkpoints_to_keep (now {keep})",
        )
    return plan

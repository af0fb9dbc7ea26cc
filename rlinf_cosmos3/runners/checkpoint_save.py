"""One checkpoint save of a run (SFT's steps or RL's iterations): SFT's rules, shared by both runners.

Before the save the disk must take it (else the error says what is lost and where to resume); a write that
finds the disk full is reported without a remote traceback; after it, retention prunes old checkpoints
(never the resume source or one an online eval still reads) and the next save must fit too.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlinf_cosmos3.checkpoint.errors import InsufficientSpaceError
from rlinf_cosmos3.checkpoint.layout import latest_checkpoint, step_dir_name
from rlinf_cosmos3.checkpoint.retention import prune_checkpoints
from rlinf_cosmos3.checkpoint.size import CheckpointSize
from rlinf_cosmos3.cluster import WorkerError, WorkerGroup
from rlinf_cosmos3.config.sft import SFTConfig
from rlinf_cosmos3.models.cosmos3.identity import IDENTITY_FILE
from rlinf_cosmos3.runners.checkpoint_space import checkpoint_root, require_space_for_save, save_steps

logger = logging.getLogger("rlinf_cosmos3.sft")


def save_checkpoint_step(cfg: SFTConfig, size: CheckpointSize, step: int, actors: WorkerGroup, identity_json: str,
                         protected: Sequence[str], unit: str = "steps", extra_args: Sequence[Any] = ()) -> Path:
    """Save ``global_step_<step>`` through the actors' ``save_checkpoint`` (``extra_args`` after the path and
    the identity files), apply retention and check the next save's room; ``unit`` names what a failure loses."""
    runner = cfg.runner
    root = checkpoint_root(cfg)
    previous = latest_checkpoint(root) or (Path(runner.resume_dir) if runner.resume_dir else None)
    lost = (f"The {unit} after {previous.name} are lost; continue with runner.resume_dir={previous}"
            if previous else "This run has no checkpoint yet")
    require_space_for_save(cfg, size, step, note=lost)
    path = root / step_dir_name(step)
    try:
        actors.call("save_checkpoint", str(path), {IDENTITY_FILE: identity_json}, *extra_args)
    except WorkerError as err:  # a write that found the disk full: say so, without a remote traceback
        cause = getattr(err.cause, "cause", None)
        if isinstance(cause, InsufficientSpaceError):
            raise InsufficientSpaceError(f"actor rank {err.rank}: {cause} {lost}.") from err
        raise
    logger.info("saved checkpoint %s", path)
    if runner.max_checkpoints_to_keep is not None:
        protect = ([runner.resume_dir] if runner.resume_dir else []) + list(protected)
        prune_checkpoints(root, runner.max_checkpoints_to_keep, protect=protect)
    upcoming = save_steps(step, cfg)
    if upcoming:
        require_space_for_save(cfg, size, upcoming[0],
                               note=f"Nothing is lost: {path} is complete; continue with runner.resume_dir={path}")
    return path

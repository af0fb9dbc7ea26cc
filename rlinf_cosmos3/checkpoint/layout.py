"""Checkpoint directory layout and the rules for which directories count as checkpoints.

```
<run_ckpt_dir>/
  global_step_<N>/                      complete checkpoint (only ever created by a rename)
    COMPLETE                            marker (JSON), written by rank 0 after every rank finished
    model_identity.json                 the trained model's identity (extra file of the SFT runner)
    actor/
      model_state_dict/full_weights.pt      consolidated model state dict (export, weights_only-safe)
      model_state_dict/full_weights_ema.pt  consolidated fp32 EMA weights (when EMA is on)
      dcp/                              torch.distributed.checkpoint: sharded model, optimizer, EMA
      scheduler.pt                      LR scheduler state dict
      trainer_state.json                global step, data position, consumed samples
      rng/rank_<r>.pt                   per-rank RNG states
  global_step_<N>.tmp-<uuid>/           a save in progress or an interrupted one (never read)
  global_step_<N>.old-<hex>/            a checkpoint being deleted or replaced (never read)
```

A reader accepts a directory only if its name is exactly ``global_step_<N>`` and it holds the
``COMPLETE`` marker, so a crash at any point of a save leaves nothing that can be resumed from.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

COMPLETE_MARKER = "COMPLETE"
ACTOR_DIR = "actor"
MODEL_STATE_DIR = "model_state_dict"
FULL_WEIGHTS = "full_weights.pt"
FULL_WEIGHTS_EMA = "full_weights_ema.pt"
DCP_DIR = "dcp"
SCHEDULER_FILE = "scheduler.pt"
TRAINER_STATE_FILE = "trainer_state.json"
RNG_DIR = "rng"

_STEP_RE = re.compile(r"^global_step_(\d+)$")
_TEMP_RE = re.compile(r"^global_step_\d+\.(tmp|old)-[0-9a-f]+$")


def step_dir_name(global_step: int) -> str:
    return f"global_step_{global_step}"


def parse_step(path: str | Path) -> int | None:
    """The step of a ``global_step_<N>`` directory name, else ``None``."""
    match = _STEP_RE.match(Path(path).name)
    return int(match.group(1)) if match else None


def actor_dir(step_dir: str | Path) -> Path:
    return Path(step_dir) / ACTOR_DIR


def full_weights_path(step_dir: str | Path, ema: bool = False) -> Path:
    return actor_dir(step_dir) / MODEL_STATE_DIR / (FULL_WEIGHTS_EMA if ema else FULL_WEIGHTS)


def rng_path(step_dir: str | Path, rank: int) -> Path:
    return actor_dir(step_dir) / RNG_DIR / f"rank_{rank:05d}.pt"


def is_complete_checkpoint(path: str | Path) -> bool:
    """True for a directory named exactly ``global_step_<N>`` that holds the ``COMPLETE`` marker."""
    path = Path(path)
    return parse_step(path) is not None and path.is_dir() and (path / COMPLETE_MARKER).is_file()


def read_marker(step_dir: str | Path) -> dict[str, Any]:
    """The metadata rank 0 wrote into the ``COMPLETE`` marker."""
    return json.loads((Path(step_dir) / COMPLETE_MARKER).read_text())


def list_checkpoints(ckpt_dir: str | Path) -> list[Path]:
    """Complete checkpoints under ``ckpt_dir``, by ascending step."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    found = [p for p in ckpt_dir.iterdir() if is_complete_checkpoint(p)]
    return sorted(found, key=lambda p: parse_step(p) or 0)


def latest_checkpoint(ckpt_dir: str | Path) -> Path | None:
    """The complete checkpoint with the highest step, or ``None`` when there is none."""
    found = list_checkpoints(ckpt_dir)
    return found[-1] if found else None


def clean_stale_temp_dirs(ckpt_dir: str | Path) -> list[Path]:
    """Delete leftovers of interrupted saves (``global_step_<N>.tmp-*`` / ``.old-*``); return them.

    Only call this when no save is in progress in ``ckpt_dir`` (saves are synchronous and one run
    owns its checkpoint directory, so at the start of a save every temp dir is stale).
    """
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    removed = []
    for path in sorted(ckpt_dir.iterdir()):
        if _TEMP_RE.match(path.name) and path.is_dir():
            logger.warning("removing stale checkpoint temp dir from an interrupted save: %s", path)
            shutil.rmtree(path)
            removed.append(path)
    return removed

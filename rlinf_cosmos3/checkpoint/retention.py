"""Keep only the newest checkpoints, deleting the others so that none is ever left half-deleted.

A checkpoint is deleted in two steps: an atomic rename out of its ``global_step_<N>`` name to
``global_step_<N>.old-<hex>`` (from that moment no reader accepts it, and the next save removes it
as a stale leftover if the process dies), then the removal of the renamed directory. A deletion
interrupted at any point therefore leaves either the complete checkpoint or a stale directory,
never a partial one under a checkpoint's name.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path

from rlinf_cosmos3.checkpoint.layout import list_checkpoints, parse_step

logger = logging.getLogger(__name__)


def delete_checkpoint(step_dir: str | Path) -> None:
    """Delete one ``global_step_<N>`` directory: rename it to ``.old-<hex>``, then remove it.

    If the removal fails after the rename, the error propagates and the stale directory is left
    for :func:`~rlinf_cosmos3.checkpoint.layout.clean_stale_temp_dirs` (the next save) to remove.
    """
    step_dir = Path(step_dir)
    if parse_step(step_dir) is None:
        raise ValueError(f"{step_dir} is not a global_step_<N> directory; refusing to delete it")
    doomed = step_dir.with_name(f"{step_dir.name}.old-{uuid.uuid4().hex}")
    os.rename(step_dir, doomed)
    fd = os.open(step_dir.parent, os.O_RDONLY)  # make the rename durable before the data goes
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    shutil.rmtree(doomed)


def prune_checkpoints(ckpt_dir: str | Path, keep: int, *, protect: Iterable[str | Path] = ()) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints of ``ckpt_dir``; return the deleted ones.

    A checkpoint in ``protect`` (e.g. the one the run resumed from) is never deleted, and does not
    count against ``keep`` unless it is among the newest. Incomplete or temporary directories are
    not touched here (saves clean those). A deletion that fails is logged and skipped: the run goes
    on, and the renamed leftover is removed by the next save.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    protected = {Path(p).expanduser().resolve() for p in protect}
    found = list_checkpoints(ckpt_dir)
    deleted = []
    for step_dir in found[: max(len(found) - keep, 0)]:
        if step_dir.resolve() in protected:
            logger.info("keeping %s: the run resumed from it", step_dir)
            continue
        try:
            delete_checkpoint(step_dir)
        except OSError as err:
            logger.warning("could not delete old checkpoint %s (%s: %s); the next save retries", step_dir,
                           type(err).__name__, err)
            continue
        logger.info("deleted old checkpoint %s (keeping the newest %d)", step_dir, keep)
        deleted.append(step_dir)
    return deleted

"""torch.distributed helpers that degrade to single-process behaviour when no group is initialised.

Checkpointing runs inside FSDP2 workers (a process group exists) and in single-process tools and
tests (none exists); these wrappers let one code path serve both.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist


def initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if initialized() else 1


def barrier() -> None:
    if initialized():
        dist.barrier()


def broadcast_from_rank0(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (picklable objects only)."""
    if not initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, indexed by rank."""
    if not initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


@contextlib.contextmanager
def single_process_quiet() -> Iterator[None]:
    """Silence torch.distributed.checkpoint's "assuming single process" warning when that is intended."""
    with warnings.catch_warnings():
        if not initialized():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield

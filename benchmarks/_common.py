"""What the benchmark scripts share: where they run, one-rank process groups, time budgets, JSON reports.

The scripts are run as files (``python benchmarks/gpu/sft_step.py ...``) and loaded by file path in the
tests, so none of them is part of a package: each puts this folder on ``sys.path`` and imports
``_common``. Torch is imported inside the functions that need it, so scripts without it (or with a
slow import) pay only for what they use.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

RESULTS_DIR = Path(__file__).resolve().parent / "results"
"""Where a benchmark's JSON goes when no ``--out`` is given."""
GIB = 2**30


# ---------------------------------------------------------------------------------------------- machine


def host_info() -> dict[str, Any]:
    """The host a run was measured on: name, cores, OS and Python."""
    return {"host": socket.gethostname(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "python": sys.version.split()[0]}


def library_versions() -> dict[str, str]:
    """Versions of what the measured code runs on (torch, diffusers, CUDA, Python)."""
    import diffusers
    import torch

    return {"torch": torch.__version__, "diffusers": diffusers.__version__, "cuda": str(torch.version.cuda),
            "python": platform.python_version()}


def device_name(device: torch.device | str) -> str:
    """The GPU's name (``NVIDIA H200``), or ``cpu (<machine>)``."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.machine()})"


def device_memory_gib(device: torch.device | str) -> float | None:
    """Total memory of the GPU in GiB; None on CPU."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).total_memory / GIB


def device_slug(device: torch.device | str) -> str:
    """The device as it appears in result file names: ``h200``, ``h100-80gb-hbm3``, ``cpu``."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device).lower().replace("nvidia", "")
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "cuda"


def results_path(benchmark: str, tag: str, stamp: str | None = None) -> Path:
    """The default ``--out``: ``benchmarks/results/<benchmark>_<tag>_<stamp>.json``, stamp = today's date
    (``20261205``) unless given."""
    return RESULTS_DIR / f"{benchmark}_{tag}_{stamp or dt.datetime.now().strftime('%Y%m%d')}.json"


# ---------------------------------------------------------------------------------------------- distributed


@contextmanager
def one_rank_process_group(device: torch.device | str = "cpu") -> Iterator[None]:
    """A process group of this process alone (nccl for a GPU, gloo for CPU), so code written for ranks
    (FSDP2, collectives) runs its real path; destroyed on exit.

    Rendezvous through a file in a temporary directory (no port to pick); ``RANK``, ``WORLD_SIZE`` and
    ``LOCAL_RANK`` are set, if unset, as a launcher would set them for rank 0 of 1.
    """
    import torch
    import torch.distributed as dist

    device = torch.device(device)
    for key in ("RANK", "LOCAL_RANK"):
        os.environ.setdefault(key, "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    with tempfile.TemporaryDirectory(prefix="bench_pg_") as tmp:
        init_method = f"file://{Path(tmp) / 'rendezvous'}"
        if device.type == "cuda":
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", init_method=init_method, rank=0, world_size=1, device_id=device)
        else:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
            dist.init_process_group("gloo", init_method=init_method, rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------- time


class Budget:
    """Wall-clock budget of a run and of its phases, from the moment it is made; ``total_s=None``: none."""

    def __init__(self, total_s: float | None) -> None:
        self.total_s = total_s
        self.start = time.monotonic()
        self.end = self.start + total_s if total_s is not None else float("inf")

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def spent(self) -> bool:
        """Whether the budget is used up (never, without one)."""
        return time.monotonic() > self.end

    def phase_end(self, share: float) -> float:
        """Deadline (``time.monotonic``) of a phase that may use ``share`` of the time left now."""
        now = time.monotonic()
        return self.end if self.end == float("inf") else now + share * max(0.0, self.end - now)


# ---------------------------------------------------------------------------------------------- JSON


def _jsonable(obj: Any) -> Any:
    """What ``json`` cannot write itself: numpy values and arrays as lists, paths as strings."""
    import numpy as np

    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, np.generic | np.ndarray):
        return obj.tolist()
    raise TypeError(f"cannot write {type(obj).__name__} to JSON")


def write_json(path: Path, data: Any, *, indent: int = 2) -> Path:
    """Write ``data`` to ``path`` (folders made): into a temporary file beside it, then renamed over it,
    so a run killed mid-write leaves the previous report whole. Returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=indent, default=_jsonable) + "\n")
    os.replace(tmp, path)
    return path

"""Shared test helpers: real gloo process groups on CPU and a small FSDP2-shardable model."""

from __future__ import annotations

import datetime
import multiprocessing
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn


class Toy(nn.Module):
    """Cosmos-like names, a frozen part, a buffer, and dims that shard unevenly over 2 ranks."""

    def __init__(self, dim: int = 5, out: int = 3) -> None:
        super().__init__()
        self.time_embedder = nn.Linear(4, dim)
        self.layers = nn.ModuleList(nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim)) for _ in range(2))
        self.llm2action = nn.Linear(dim, out)
        self.register_buffer("scale", torch.full((out,), 2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.time_embedder(x)
        for layer in self.layers:
            h = h + torch.tanh(layer(h))
        return self.llm2action(h) * self.scale


def _rank_entry(rank: int, world_size: int, store: str, fn, args: tuple) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=120),
    )
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def run_on_ranks(tmp_path: Path, fn, *args, world_size: int = 2) -> None:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; re-raise any rank's error.

    Ranks start from a forkserver that preloads torch, so only the first launch of a test session
    pays the import.
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(
        ["torch", "torch._dynamo", "torch.distributed.checkpoint", "torch.distributed.fsdp"]
    )
    store = tmp_path / f"pg_store_{os.urandom(4).hex()}"
    torch.multiprocessing.start_processes(
        _rank_entry, args=(world_size, str(store), fn, args), nprocs=world_size, start_method="forkserver"
    )


def run_as_thread_ranks(world_size: int, fn) -> None:
    """``fn(rank, barrier)`` on ``world_size`` threads that share a real ``threading.Barrier`` (for collective
    code that takes a barrier callable, e.g. ``latent_cache.build_cache``); a rank's error aborts the barrier
    and is raised here."""
    import threading

    barrier = threading.Barrier(world_size)
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            fn(r, barrier.wait)
        except BaseException as err:  # noqa: BLE001 - raised below, after every thread ended
            errors.append(err)
            barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors

"""The SFT worker's batch stream (real torch DataLoader worker processes): epochs follow the sampler,
a resumed stream continues exactly, and the loader's worker processes are started once, not per epoch."""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils.data import Dataset

from rlinf_cosmos3.data.collate import collate_samples
from rlinf_cosmos3.data.sampler import ResumableDistributedSampler
from rlinf_cosmos3.data.stream import BatchStream


class _Items(Dataset):
    """Item i -> (i, the pid of the process that loaded it)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"index": torch.tensor(i), "pid": torch.tensor(os.getpid())}


def _stream(sampler: ResumableDistributedSampler, batch: int = 3, workers: int = 2) -> BatchStream:
    return BatchStream(_Items(sampler.dataset_len), sampler, batch, num_workers=workers, prefetch_factor=2,
                       collate_fn=collate_samples)


def _expected(sampler_args: tuple, epochs: int, batch: int) -> list[list[int]]:
    """Full batches of each epoch, in the sampler's order (a partial last batch dropped)."""
    sampler = ResumableDistributedSampler(*sampler_args[:3], seed=sampler_args[3])
    out = []
    for epoch in range(epochs):
        order = sampler.epoch_indices(epoch)
        out += [order[a:a + batch] for a in range(0, len(order) - batch + 1, batch)]
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_epochs_follow_the_sampler_and_workers_start_once(workers: int) -> None:
    sampler = ResumableDistributedSampler(11, 0, 1, seed=5)  # 11 samples: 3 batches of 3 per epoch, 2 dropped
    stream = _stream(sampler, workers=workers)
    batches = [next(stream) for _ in range(12)]  # 4 epochs
    assert [b["index"].tolist() for b in batches] == _expected((11, 0, 1, 5), 4, 3)
    assert (sampler.position.epoch, sampler.position.offset) == (3, 9)  # the dropped 2 are skipped at the next call
    pids = {int(p) for b in batches for p in b["pid"]}
    if workers:
        assert os.getpid() not in pids and len(pids) <= workers, f"loader processes per epoch: {pids}"
    else:
        assert pids == {os.getpid()}


def test_a_resumed_stream_continues_exactly() -> None:
    straight = _stream(ResumableDistributedSampler(11, 1, 2, seed=3), batch=2)
    want = [next(straight)["index"].tolist() for _ in range(9)]
    first = ResumableDistributedSampler(11, 1, 2, seed=3)
    head = [next(_stream(first, batch=2))["index"].tolist()]  # a first stream, then a new one on the same sampler
    stream = _stream(first, batch=2)
    head += [next(stream)["index"].tolist() for _ in range(3)]
    resumed = ResumableDistributedSampler(11, 1, 2, seed=3)
    resumed.load_position(first.position.to_dict())
    tail = [next(_stream(resumed, batch=2))["index"].tolist()]
    assert head + tail == want[:5]


def test_a_dataset_smaller_than_a_batch_is_refused() -> None:
    with pytest.raises(RuntimeError, match="no full micro-batch of 4 samples"):
        next(_stream(ResumableDistributedSampler(3, 0, 1), batch=4, workers=0))

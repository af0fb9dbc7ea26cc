"""A distributed sampler whose position can be saved and restored exactly.

``torch.utils.data.DistributedSampler`` can only restart an epoch from its beginning; resuming
SFT exactly needs "epoch e, k samples of this rank already consumed". The permutation is a pure
function of ``(seed, epoch)``, so a restored sampler yields exactly the indices the interrupted
run would have yielded next, without decoding the skipped samples.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch
from torch.utils.data import Sampler


@dataclass
class SamplerPosition:
    """Where a rank stands in the data stream: the epoch and how many of its samples it consumed."""

    epoch: int = 0
    offset: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class ResumableDistributedSampler(Sampler[int]):
    """Shuffled, rank-partitioned, endless-per-epoch sampler with an explicit position.

    Every epoch draws one permutation of ``range(dataset_len)`` from ``seed + epoch``, pads it by
    wrapping so it divides ``world_size``, and gives rank ``r`` the items ``r, r + W, r + 2W, ...``.
    :meth:`advance` must be called with the number of samples the trainer consumed (the DataLoader
    prefetches, so the sampler cannot know this itself).
    """

    def __init__(self, dataset_len: int, rank: int, world_size: int, *, seed: int = 0, shuffle: bool = True) -> None:
        if dataset_len < 1:
            raise ValueError("the dataset is empty: no training samples to draw")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world of size {world_size}")
        self.dataset_len, self.rank, self.world_size = dataset_len, rank, world_size
        self.seed, self.shuffle = seed, shuffle
        self.position = SamplerPosition()

    @property
    def samples_per_epoch(self) -> int:
        """Samples each rank sees per epoch (``ceil(len / world_size)``)."""
        return -(-self.dataset_len // self.world_size)

    def epoch_indices(self, epoch: int) -> list[int]:
        """This rank's indices for ``epoch``, in order."""
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            order = torch.randperm(self.dataset_len, generator=generator).tolist()
        else:
            order = list(range(self.dataset_len))
        total = self.samples_per_epoch * self.world_size
        order += order[: total - len(order)]
        return order[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[int]:
        """Indices from the current position to the end of the current epoch."""
        return iter(self.epoch_indices(self.position.epoch)[self.position.offset :])

    def __len__(self) -> int:
        return self.samples_per_epoch - self.position.offset

    def advance(self, consumed: int) -> bool:
        """Record ``consumed`` more samples; returns True when this finished the epoch."""
        self.position.offset += consumed
        if self.position.offset > self.samples_per_epoch:
            raise ValueError(f"consumed past the epoch end ({self.position.offset} > {self.samples_per_epoch})")
        if self.position.offset == self.samples_per_epoch:
            self.position = SamplerPosition(epoch=self.position.epoch + 1, offset=0)
            return True
        return False

    def load_position(self, state: dict[str, int]) -> None:
        position = SamplerPosition(**state)
        if not 0 <= position.offset < self.samples_per_epoch:
            raise ValueError(f"saved sampler offset {position.offset} outside [0, {self.samples_per_epoch})")
        self.position = position

"""One rank's endless stream of micro-batches: the sampler's epochs one after another.

The DataLoader is built once, with persistent workers, and re-iterated at every epoch: a new loader
per epoch would start ``num_workers`` fresh processes at each epoch boundary, and on a small dataset
that start-up is a large share of the run while the median step time hides it (docs/benchmarks.md,
"loader workers kept across epochs"). Each ``iter`` asks the sampler for its indices again, so the
stream follows the sampler's position: a resumed run starts where the checkpoint left off.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch.utils.data import DataLoader, Dataset

from rlinf_cosmos3.data.sampler import ResumableDistributedSampler, SamplerPosition


class BatchStream:
    """``next(stream)``: the next full micro-batch of this rank, rolling over epochs, the position advanced."""

    def __init__(self, dataset: Dataset, sampler: ResumableDistributedSampler, batch_size: int, *,
                 num_workers: int, prefetch_factor: int | None, collate_fn: Callable[[Sequence[Any]], Any],
                 pin_memory: bool = False, rank: int = 0) -> None:
        self.sampler, self.batch_size, self.rank = sampler, batch_size, rank
        self.loader = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            drop_last=True,
            prefetch_factor=prefetch_factor if num_workers > 0 else None,
            persistent_workers=num_workers > 0,
            pin_memory=pin_memory,
        )
        self._iter: Any = None

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> Any:
        for _ in range(2):
            if self._iter is None:
                self._iter = iter(self.loader)  # persistent workers: the same processes, the sampler asked anew
            try:
                batch = next(self._iter)
            except StopIteration:
                self._iter = None
                if self.sampler.position.offset != 0:  # a dropped partial micro-batch ends the epoch
                    self.sampler.position = SamplerPosition(epoch=self.sampler.position.epoch + 1, offset=0)
                continue
            self.sampler.advance(self.batch_size)
            return batch
        raise RuntimeError(
            f"rank {self.rank}: the dataset yields no full micro-batch of {self.batch_size} samples "
            f"({len(self.loader.dataset)} samples over {self.sampler.world_size} ranks); lower actor.micro_batch_size"
        )

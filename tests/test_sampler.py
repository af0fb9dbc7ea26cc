"""The data position survives a save/restore exactly."""

from rlinf_cosmos3.data.sampler import ResumableDistributedSampler


def _stream(sampler: ResumableDistributedSampler, n: int, batch: int = 3) -> list[int]:
    out: list[int] = []
    while len(out) < n:
        it = iter(sampler)
        for _ in range(len(sampler) // batch):
            out.extend(next(it) for _ in range(batch))
            sampler.advance(batch)
            if len(out) >= n:
                return out
        rest = list(it)
        out.extend(rest)
        sampler.advance(len(rest))
    return out


def test_ranks_partition_each_epoch() -> None:
    samplers = [ResumableDistributedSampler(10, r, 3, seed=7) for r in range(3)]
    per_rank = [s.epoch_indices(0) for s in samplers]
    assert all(len(p) == 4 for p in per_rank)
    assert set().union(*map(set, per_rank)) == set(range(10))
    assert samplers[0].epoch_indices(1) != samplers[0].epoch_indices(0)


def test_resume_continues_the_exact_stream() -> None:
    straight = _stream(ResumableDistributedSampler(11, 1, 2, seed=3), 30)
    first = ResumableDistributedSampler(11, 1, 2, seed=3)
    head = _stream(first, 9)
    resumed = ResumableDistributedSampler(11, 1, 2, seed=3)
    resumed.load_position(first.position.to_dict())
    tail = _stream(resumed, 21)
    assert head + tail == straight

"""Counter-based random draws: a training sample's noise as a pure function of (run seed, step, dataset index).

Why: drawn from one CPU ``torch.Generator`` per sample, a step's noise costs host time per sample (at 128
samples of the small preset, ~0.1 s of CPU ``randn`` and a 30 MB copy to the GPU) while the rest of a
small model's step takes a few tens of milliseconds. Philox4x32-10 (Salmon et al., "Parallel random
numbers: as easy as 1, 2, 3", SC 2011; cuRAND's and torch's CUDA generator) maps a 128-bit counter and a
64-bit key to 128 random bits with no state, so the draws of every sample of a micro-batch come out of one
batch of elementwise integer operations on the device: a constant number of kernels however many samples.

Layout: key = the run seed (low, high 32 bits); counter = (block, stream, dataset index, step), each
32 bits. A stream names one draw of a sample (:data:`STREAM_SIGMA` ...); word ``w`` of a stream is lane
``w % 4`` of block ``w // 4``. A uniform in [0, 1) takes a word's top 24 bits; normals are Box-Muller
over consecutive word pairs. The integer part is exact on every device, so the bits are the same on CPU
and GPU; the float transforms agree to rounding. A sample's draws never depend on which other samples
share its batch, pack or rank, nor on how many words another stream takes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "STREAM_ACTION",
    "STREAM_ACTION_SIGMA",
    "STREAM_DROPOUT",
    "STREAM_SIGMA",
    "STREAM_VISION",
    "NoiseKeys",
    "keyed_words",
    "legacy_sample_seed",
    "normal_from_words",
    "philox4x32",
    "uniform_from_words",
]

STREAM_SIGMA, STREAM_ACTION_SIGMA, STREAM_VISION, STREAM_ACTION, STREAM_DROPOUT = range(5)

_MASK32 = 0xFFFFFFFF
_M0, _M1 = 0xD2511F53, 0xCD9E8D57  # Philox4x32 multipliers
_W0, _W1 = 0x9E3779B9, 0xBB67AE85  # Weyl key increments
_SEED_STRIDE = 1_000_003


def legacy_sample_seed(seed: int, step: int, index: int) -> int:
    """The per-sample ``torch.Generator`` seed of (run seed, step, dataset index) (paraphrase draws use it)."""
    return (seed * _SEED_STRIDE + step) * _SEED_STRIDE + index


@dataclass(frozen=True)
class NoiseKeys:
    """What a micro-batch's draws are a function of: the run seed, the step, each sample's dataset index."""

    seed: int
    step: int
    indexes: torch.Tensor
    """``[n]`` integer dataset indexes (the batch's ``index``), below 2**32."""

    def __len__(self) -> int:
        return int(self.indexes.shape[0])

    def subset(self, rows: Sequence[int]) -> NoiseKeys:
        return NoiseKeys(self.seed, self.step, self.indexes[list(rows)])

    def sample_seeds(self) -> list[int]:
        """Each sample's :func:`legacy_sample_seed` (one host list, for the caption's paraphrase draw)."""
        return [legacy_sample_seed(self.seed, self.step, int(i)) for i in self.indexes.tolist()]


@functools.lru_cache(maxsize=16)
def _round_constants(key: tuple[int, int], rounds: int, device: str) -> tuple[torch.Tensor, ...]:
    """The key schedule ``[rounds, 2, 1]`` and the multipliers' 16-bit limbs ``[2, 1]`` (order: lanes 2, 0) on
    ``device``, made once per key (one small copy)."""
    k0, k1 = key[0] & _MASK32, key[1] & _MASK32
    schedule = [[(k0 + r * _W0) & _MASK32, (k1 + r * _W1) & _MASK32] for r in range(rounds)]
    limbs_low, limbs_high = [[_M1 & 0xFFFF], [_M0 & 0xFFFF]], [[_M1 >> 16], [_M0 >> 16]]
    made = torch.tensor(schedule, dtype=torch.int64).unsqueeze(-1), torch.tensor(limbs_low), torch.tensor(limbs_high)
    return tuple(t.to(device) for t in made)


def philox4x32(
    counter: Sequence[torch.Tensor | int], key: tuple[int, int], rounds: int = 10
) -> tuple[torch.Tensor, ...]:
    """Philox4x32 of a (broadcastable) counter ``(c0, c1, c2, c3)`` under ``key``: four int64 tensors of 32-bit
    words. Tensors in the counter must be int64 holding values in ``[0, 2**32)`` (at least one is a tensor);
    ints are broadcast.

    A round is ``hi0, lo0 = M0 c0``; ``hi1, lo1 = M1 c2``; ``(c0, c1, c2, c3) <- (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1,
    lo0)``. Both products are taken at once on the pair ``(c2, c0)``, in 16-bit limbs so int64 never overflows
    (exact on every device), and the state is kept as that pair and ``(c1, c3)``: 12 operations a round.
    """
    like = next(c for c in counter if isinstance(c, torch.Tensor))
    c0, c1, c2, c3 = (c if isinstance(c, torch.Tensor) else like.new_full((1,) * like.dim(), int(c) & _MASK32)
                      for c in counter)
    keys, low_limb, high_limb = _round_constants((key[0], key[1]), rounds, str(like.device))
    pair = torch.stack(torch.broadcast_tensors(c2, c0, c1, c3)[:2])  # [c2, c0]
    other = torch.stack(torch.broadcast_tensors(c1, c3, c2, c0)[:2])  # [c1, c3]
    shape = (2,) + (1,) * (pair.dim() - 1)
    low_limb, high_limb = low_limb.view(shape), high_limb.view(shape)
    for r in range(rounds):
        low_part = pair * low_limb  # < 2**48
        high_part = pair * high_limb  # < 2**48
        mid = low_part + ((high_part & 0xFFFF) << 16)  # < 2**49
        lo = mid & _MASK32  # [lo1, lo0]
        hi = (high_part >> 16) + (mid >> 32)  # [hi1, hi0]
        mixed = hi ^ other ^ keys[r].view(shape)  # [new c0, new c2]
        other = lo  # [new c1, new c3]
        if r + 1 < rounds:
            pair = mixed.flip(0)  # [new c2, new c0]
    return mixed[0], other[0], mixed[1], other[1]


@functools.lru_cache(maxsize=32)
def _stream_counters(streams: tuple[tuple[int, int], ...], device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(block, stream) counter rows of ``streams`` laid end to end, on ``device`` (built once per layout)."""
    blocks = [(count + 3) // 4 for _, count in streams]
    block = torch.cat([torch.arange(b, dtype=torch.int64) for b in blocks])
    stream = torch.cat([torch.full((b,), s, dtype=torch.int64) for (s, _), b in zip(streams, blocks, strict=True)])
    return block.to(device), stream.to(device)


def keyed_words(keys: NoiseKeys, streams: Sequence[tuple[int, int]], device: torch.device | str) -> list[torch.Tensor]:
    """For each ``(stream, count)``, ``[n, count]`` random 32-bit words (int64) of every sample, on ``device``,
    all from one Philox pass."""
    streams = tuple((int(s), int(c)) for s, c in streams)
    device = torch.device(device)
    block, stream = _stream_counters(streams, str(device))
    index = keys.indexes.to(device=device, dtype=torch.int64, non_blocking=True) & _MASK32
    seed = int(keys.seed)
    lanes = philox4x32((block[None, :], stream[None, :], index[:, None], int(keys.step) & _MASK32),
                       (seed & _MASK32, (seed >> 32) & _MASK32))
    words = torch.stack(lanes, dim=-1).reshape(len(keys), -1)  # word 4 * block + lane
    out, start = [], 0
    for _, count in streams:
        out.append(words[:, start : start + count])
        start += 4 * ((count + 3) // 4)
    return out


def uniform_from_words(words: torch.Tensor) -> torch.Tensor:
    """float32 uniforms in [0, 1) from the words' top 24 bits, each exactly ``k / 2**24`` (as ``torch.rand``)."""
    return (words >> 8).to(torch.float32) * (2.0**-24)


def normal_from_words(words: torch.Tensor) -> torch.Tensor:
    """float32 standard normals, Box-Muller over consecutive word pairs (an even number of words)."""
    if words.shape[-1] % 2:
        raise ValueError(f"normals take pairs of words, got {words.shape[-1]}")
    u1, u2 = uniform_from_words(words[..., 0::2]), uniform_from_words(words[..., 1::2])
    radius = torch.sqrt(-2.0 * torch.log1p(-u1))  # 1 - u1 in (0, 1], exact: a finite radius
    angle = (2.0 * math.pi) * u2
    return torch.stack((radius * torch.cos(angle), radius * torch.sin(angle)), dim=-1).flatten(-2)

"""How many bytes one ``global_step_<N>`` checkpoint takes on disk, from the model's tensors alone.

A run must know this before it pays for any step (a Nano checkpoint of the recipe is ~248 GiB,
docs/sft.md). The estimate
follows what :func:`rlinf_cosmos3.checkpoint.save.save_checkpoint` writes:

* ``full_weights.pt``: every tensor of the model state dict (parameters and persistent buffers)
  in the dtype it is trained in: fp32 master weights under FSDP2 mixed precision;
* ``full_weights_ema.pt`` (EMA on): the same keys with every floating tensor in fp32;
* ``dcp/`` (the resume state): the model state dict again, AdamW's ``exp_avg`` and
  ``exp_avg_sq`` (dtype of their parameter) and a scalar ``step`` per trainable parameter, the
  fp32 EMA shadow of the trainable parameters, the param groups, and a ``.metadata`` index.
  torch.distributed.checkpoint writes every local chunk of every tensor with its own
  ``torch.save`` (one chunk per rank for a sharded tensor);
* scheduler state, ``trainer_state.json``, the ``COMPLETE`` marker and one RNG file per rank.

The per-record costs of ``torch.save`` are measured once on this torch version (a few small
saves into memory) instead of being assumed. Files are rounded up to whole filesystem blocks, as
``du`` counts them. The estimate works on a model built on the ``meta`` device, so a driver can
size a 15B-parameter checkpoint without allocating it.
"""

from __future__ import annotations

import functools
import io
import math
from dataclasses import dataclass

import torch
from torch import nn

from rlinf_cosmos3.checkpoint.disk import format_bytes
from rlinf_cosmos3.checkpoint.rng import capture_rng_state

BLOCK = 4096
"""Allocation unit assumed for rounding files (ext4/XFS default)."""
SAFETY_FRACTION = 0.02
SAFETY_BYTES = 128 * 2**20
"""Margin on top of the estimate before a save is allowed to start: 2 % plus 128 MiB, for what the
estimate leaves out (filesystem metadata, other writers: the run log, TensorBoard events)."""

_DCP_METADATA_PER_CHUNK = 320
"""Bytes of ``dcp/.metadata`` per saved chunk (its pickled index; ~260 measured with torch 2.11)."""
_DCP_PARAM_GROUP_ITEMS = 13
"""Non-tensor entries per AdamW param group (lr, betas, eps, ..., params), each a BYTE_IO record."""
_PARAM_GROUPS_ALLOWANCE = 4
"""Param groups assumed (one per distinct (lr, weight decay); the recipe has 2)."""
_SMALL_FILE_ALLOWANCE = 16 * 1024
"""``scheduler.pt``, ``trainer_state.json`` and ``COMPLETE`` are each below this."""
_CUDA_RNG_ALLOWANCE = 4 * 1024
"""Per rank: the CUDA generator states a GPU rank adds to its RNG file."""
_NUM_DIRS = 5
"""step dir, actor/, model_state_dict/, dcp/, rng/."""


@dataclass(frozen=True)
class TensorSet:
    """How many tensors, elements and bytes (global, not per shard), and their keys' characters."""

    tensors: int = 0
    numel: int = 0
    nbytes: int = 0
    key_chars: int = 0


@dataclass(frozen=True)
class ModelFootprint:
    """What the checkpoint size depends on: the model state dict and the trainable parameters."""

    state: TensorSet
    """The model state dict (parameters and persistent buffers), dtypes as trained."""
    state_fp32: TensorSet
    """The same tensors with floating ones counted as fp32 (the EMA export)."""
    trainable: TensorSet
    """Parameters with ``requires_grad`` (what AdamW and the EMA hold), dtypes as trained."""

    @property
    def trainable_fp32_bytes(self) -> int:
        return self.trainable.numel * 4


def _tensor_set(items: list[tuple[str, torch.Tensor]], *, as_fp32: bool = False) -> TensorSet:
    def nbytes(t: torch.Tensor) -> int:
        size = 4 if as_fp32 and t.is_floating_point() else t.element_size()
        return t.numel() * size

    return TensorSet(
        tensors=len(items),
        numel=sum(t.numel() for _, t in items),
        nbytes=sum(nbytes(t) for _, t in items),
        key_chars=sum(len(k) for k, _ in items),
    )


def model_footprint(model: nn.Module) -> ModelFootprint:
    """The footprint of ``model`` as it will be saved: plain, FSDP2-sharded or on ``meta``.

    Call it after the trainable selection (``select_trainable``): ``requires_grad`` decides what
    the optimizer and the EMA hold. Sharded (DTensor) tensors count with their global shape.
    """
    state = [(k, v) for k, v in model.state_dict().items() if torch.is_tensor(v)]
    trainable = [(k, p) for k, p in model.named_parameters() if p.requires_grad]
    return ModelFootprint(
        state=_tensor_set(state), state_fp32=_tensor_set(state, as_fp32=True), trainable=_tensor_set(trainable)
    )


@functools.lru_cache(maxsize=1)
def _torch_save_costs() -> tuple[int, int, int]:
    """Bytes ``torch.save`` adds: around one tensor saved alone, per entry of a saved dict
    (besides its data and key), and for one small non-tensor value saved alone."""

    def size(obj: object) -> int:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        return buffer.tell()

    n, key_len = 64, 8
    single = size(torch.zeros(1)) - 4
    per_entry = (size({f"{i:0{key_len}d}": torch.zeros(1) for i in range(n)}) - size({})) // n - 4 - key_len
    return single, per_entry, size(0.5)


@functools.lru_cache(maxsize=1)
def _rng_file_bytes() -> int:
    """One rank's RNG file: this process's state serialised the same way, plus the CUDA states."""
    buffer = io.BytesIO()
    torch.save(capture_rng_state(), buffer)
    return buffer.tell() + _CUDA_RNG_ALLOWANCE


def _blocks(n: int) -> int:
    return math.ceil(n / BLOCK) * BLOCK


@dataclass(frozen=True)
class CheckpointSize:
    """Estimated bytes on disk of one checkpoint, by part."""

    full_weights: int
    """``full_weights.pt`` (0 without the export)."""
    full_weights_ema: int
    """``full_weights_ema.pt`` (0 without EMA or without the export)."""
    resume_model: int
    """``dcp/``: the sharded model state."""
    resume_optimizer: int
    """``dcp/``: AdamW moments, steps and param groups."""
    resume_ema: int
    """``dcp/``: the fp32 EMA shadow."""
    other: int
    """``dcp/.metadata``, scheduler, trainer state, marker, RNG files, directories."""

    @property
    def resume_state(self) -> int:
        """Everything a resume reads: ``dcp/`` plus the small files."""
        return self.resume_model + self.resume_optimizer + self.resume_ema + self.other

    @property
    def total(self) -> int:
        """The whole ``global_step_<N>`` directory, as ``du`` would count it."""
        return self.full_weights + self.full_weights_ema + self.resume_state

    @property
    def required(self) -> int:
        """Free bytes a save should find before it starts: :attr:`total` plus the safety margin."""
        return int(self.total * (1 + SAFETY_FRACTION)) + SAFETY_BYTES

    def describe_required(self) -> str:
        """The total, its parts and the margin, for error messages."""
        margin = f"{SAFETY_FRACTION:.0%} + {format_bytes(SAFETY_BYTES)}"
        return f"about {self.describe()} plus a {margin} margin"

    def describe(self) -> str:
        """One line: the total and its parts."""
        parts = [("full_weights.pt", self.full_weights), ("full_weights_ema.pt", self.full_weights_ema),
                 ("resume state", self.resume_state)]
        inner = ", ".join(f"{name} {format_bytes(n)}" for name, n in parts if n)
        return f"{format_bytes(self.total)} ({inner})"


def estimate_checkpoint_size(
    footprint: ModelFootprint,
    *,
    world_size: int,
    ema: bool,
    optimizer: bool = True,
    full_weights: bool = True,
) -> CheckpointSize:
    """Bytes of one checkpoint written by ``world_size`` ranks (see the module docstring).

    ``ema``: an enabled EMA is saved; ``optimizer``: AdamW state is saved; ``full_weights``: the
    consolidated export is written (``save_full_weights``).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    alone, per_entry, small_value = _torch_save_costs()
    state, trainable = footprint.state, footprint.trainable

    def consolidated(tensors: TensorSet, nbytes: int) -> int:  # one torch.save of a whole state dict
        return _blocks(nbytes + tensors.tensors * per_entry + tensors.key_chars + alone)

    def chunked(tensors: int, nbytes: int) -> int:  # dcp: every rank's chunk of every tensor saved alone
        return nbytes + tensors * world_size * alone

    export = consolidated(state, state.nbytes) if full_weights else 0
    export_ema = consolidated(state, footprint.state_fp32.nbytes) if full_weights and ema else 0
    resume_model = chunked(state.tensors, state.nbytes)
    resume_optimizer = resume_ema = 0
    chunks = state.tensors * world_size
    if optimizer:
        resume_optimizer = chunked(2 * trainable.tensors, 2 * trainable.nbytes)
        resume_optimizer += trainable.tensors * (alone + 4)  # the scalar ``step``s, saved once
        group_items = _DCP_PARAM_GROUP_ITEMS * _PARAM_GROUPS_ALLOWANCE
        resume_optimizer += group_items * small_value + trainable.key_chars
        chunks += 2 * trainable.tensors * world_size + trainable.tensors + group_items
    if ema:
        resume_ema = chunked(trainable.tensors, footprint.trainable_fp32_bytes)
        chunks += trainable.tensors * world_size
    # Each rank's .distcp file and the index are rounded to blocks; then the small files.
    other = world_size * BLOCK + _blocks(chunks * _DCP_METADATA_PER_CHUNK)
    other += 3 * _blocks(_SMALL_FILE_ALLOWANCE) + world_size * _blocks(_rng_file_bytes()) + _NUM_DIRS * BLOCK
    return CheckpointSize(
        full_weights=export,
        full_weights_ema=export_ema,
        resume_model=resume_model,
        resume_optimizer=resume_optimizer,
        resume_ema=resume_ema,
        other=other,
    )

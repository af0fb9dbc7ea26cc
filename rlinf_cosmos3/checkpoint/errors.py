"""Checkpoint exceptions, in a module of their own so every checkpoint module can raise them."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; raised on every rank."""


class InsufficientSpaceError(CheckpointError):
    """The checkpoint directory's filesystem cannot hold a checkpoint (found before or while writing)."""

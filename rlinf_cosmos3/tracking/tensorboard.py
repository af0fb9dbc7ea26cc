"""TensorBoard scalars, written by the driver only (workers return metrics, the driver logs them)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter


class ScalarWriter:
    """A thin wrapper that namespaces scalars (``train/loss``) and always flushes on close."""

    def __init__(self, log_dir: str | Path, prefix: str = "") -> None:
        self.log_dir = Path(log_dir)
        self.prefix = prefix
        self._writer = SummaryWriter(log_dir=str(self.log_dir))

    def log(self, scalars: Mapping[str, float], step: int, prefix: str | None = None) -> None:
        """Add ``<prefix>/<name>`` scalars at ``step`` (``prefix`` defaults to the writer's own)."""
        prefix = self.prefix if prefix is None else prefix
        for name, value in scalars.items():
            tag = f"{prefix}/{name}" if prefix else name
            self._writer.add_scalar(tag, float(value), global_step=step)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()

    def __enter__(self) -> ScalarWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

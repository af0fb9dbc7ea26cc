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

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        for name, value in scalars.items():
            tag = f"{self.prefix}/{name}" if self.prefix else name
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

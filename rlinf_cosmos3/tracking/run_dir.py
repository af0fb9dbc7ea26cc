"""``logs/<timestamp>-<config>/``: one folder per run with its log, resolved config and events.

Every entry point (SFT, eval) creates its run directory first, so even a run that fails at config
validation leaves a log that says why.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@dataclass(frozen=True)
class RunDir:
    """Paths of one run's outputs."""

    root: Path
    log_file: Path

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def config_file(self) -> Path:
        return self.root / "config.yaml"

    def save_config(self, resolved: dict[str, Any]) -> Path:
        """Write the fully resolved config next to the log (what actually ran)."""
        self.config_file.write_text(yaml.safe_dump(resolved, sort_keys=False))
        return self.config_file


def create_run_dir(base: str | Path, config_name: str, log_name: str, *, stamp: str | None = None) -> RunDir:
    """Create ``<base>/<timestamp>-<config_name>/`` (unique even when two runs start in one second)."""
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    base = Path(base)
    root = base / f"{stamp}-{config_name}"
    suffix = 1
    while root.exists():
        suffix += 1
        root = base / f"{stamp}-{config_name}-{suffix}"
    root.mkdir(parents=True)
    return RunDir(root=root, log_file=root / log_name)


def setup_run_logging(run_dir: RunDir, level: int = logging.INFO) -> None:
    """Send every logger to the run's log file and to the console, one format for both.

    Entry points own the root logger: handlers installed earlier (a library's ``basicConfig``,
    Hydra's defaults) are replaced, so each line appears once.
    """
    formatter = logging.Formatter(LOG_FORMAT)
    root = logging.getLogger()
    root.setLevel(level)
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    for handler in (logging.FileHandler(run_dir.log_file), logging.StreamHandler(sys.stdout)):
        handler.setFormatter(formatter)
        root.addHandler(handler)


def resolve_config(raw_cfg: Any) -> dict[str, Any]:
    """A Hydra/OmegaConf config (or a dict) as a plain dict, interpolations resolved, Hydra's section dropped."""
    from omegaconf import DictConfig, OmegaConf

    resolved = OmegaConf.to_container(raw_cfg, resolve=True) if isinstance(raw_cfg, DictConfig) else dict(raw_cfg)
    resolved.pop("hydra", None)
    return resolved


def start_run(raw_cfg: Any, config_name: str, log_name: str) -> tuple[dict[str, Any], RunDir]:
    """What every entry point does first: resolve the Hydra config, create the run directory under
    ``runner.logs_dir`` (default ``logs``), route logging there and save the resolved config."""
    resolved = resolve_config(raw_cfg)
    run_dir = create_run_dir((resolved.get("runner") or {}).get("logs_dir") or "logs", config_name, log_name)
    setup_run_logging(run_dir)
    run_dir.save_config(resolved)
    logging.getLogger("rlinf_cosmos3").info("run directory: %s", run_dir.root)
    return resolved, run_dir

"""Hydra entry point of RL; see run_vla_rl.sh. All work happens in :mod:`rlinf_cosmos3.runners.rl_runner`."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from rlinf_cosmos3.config.hydra_cli import check_command_line
from rlinf_cosmos3.config.rl import RLConfig, register_hydra_schema
from rlinf_cosmos3.runners.rl_runner import run_rl

register_hydra_schema()  # before Hydra composes: the YAMLs' defaults start from the typed schema

CONFIG_PATH, CONFIG_NAME = "config", "libero_rl_cosmos3_tiny"


@hydra.main(config_path=CONFIG_PATH, config_name=CONFIG_NAME, version_base=None)
def main(cfg: DictConfig) -> None:
    sys.exit(run_rl(cfg, config_name=HydraConfig.get().job.config_name))


if __name__ == "__main__":
    # An override Hydra cannot apply (unknown key, wrong type) is a config error like any other: exit 2.
    code = check_command_line(RLConfig, Path(__file__).parent, CONFIG_PATH, CONFIG_NAME, "rlinf_cosmos3.rl")
    if code is not None:
        sys.exit(code)
    main()

"""Hydra entry point of evaluation; see run_eval.sh. The work is in :mod:`rlinf_cosmos3.runners.eval_runner`."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from rlinf_cosmos3.config.eval import EvalConfig, register_hydra_schema
from rlinf_cosmos3.config.hydra_cli import check_command_line
from rlinf_cosmos3.runners.eval_runner import run_eval

register_hydra_schema()  # before Hydra composes: the YAMLs' defaults start from the typed schema

CONFIG_PATH, CONFIG_NAME = "libero", "libero_spatial_cosmos3_eval_tiny"


@hydra.main(config_path=CONFIG_PATH, config_name=CONFIG_NAME, version_base=None)
def main(cfg: DictConfig) -> None:
    sys.exit(run_eval(cfg, config_name=HydraConfig.get().job.config_name))


if __name__ == "__main__":
    # An override Hydra cannot apply (unknown key, wrong type) is a config error like any other: exit 2.
    code = check_command_line(EvalConfig, Path(__file__).parent, CONFIG_PATH, CONFIG_NAME, "rlinf_cosmos3.eval")
    if code is not None:
        sys.exit(code)
    main()

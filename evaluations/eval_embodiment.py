"""Hydra entry point of evaluation; see run_eval.sh. The work is in :mod:`rlinf_cosmos3.runners.eval_runner`."""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from rlinf_cosmos3.config.eval import register_hydra_schema
from rlinf_cosmos3.runners.eval_runner import run_eval

register_hydra_schema()  # before Hydra composes: the YAMLs' defaults start from the typed schema


@hydra.main(config_path="libero", config_name="libero_spatial_cosmos3_eval_tiny", version_base=None)
def main(cfg: DictConfig) -> None:
    sys.exit(run_eval(cfg, config_name=HydraConfig.get().job.config_name))


if __name__ == "__main__":
    main()

"""Hydra entry point of SFT; see run_vla_sft.sh. All work happens in :mod:`rlinf_cosmos3.runners.sft_runner`."""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from rlinf_cosmos3.config.sft import register_hydra_schema
from rlinf_cosmos3.runners.sft_runner import run_sft

register_hydra_schema()  # before Hydra composes: the YAMLs' defaults start from the typed schema


@hydra.main(config_path="config", config_name="libero_sft_cosmos3_tiny", version_base=None)
def main(cfg: DictConfig) -> None:
    sys.exit(run_sft(cfg, config_name=HydraConfig.get().job.config_name))


if __name__ == "__main__":
    main()

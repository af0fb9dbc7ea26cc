"""The SFT configs compose with Hydra and every rule fails with a message naming field and fix."""

from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlinf_cosmos3.actions import compute_action_stats, write_action_stats
from rlinf_cosmos3.config import ConfigError
from rlinf_cosmos3.config.sft import load_sft_config
from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir

CONFIG_DIR = Path(__file__).resolve().parent.parent / "examples" / "sft" / "config"


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("sftcfg")
    model = write_model_dir(root / "model", preset="tiny", seed=0)
    rng = np.random.default_rng(0)
    episodes = [np.concatenate([rng.uniform(-1, 1, (40, 6)), rng.uniform(0, 1, (40, 1))], axis=1)]
    stats = compute_action_stats(episodes, chunk_length=16, metadata={"fps": 20})
    stats_path = write_action_stats(stats, root / "stats.json")
    dataset = root / "dataset"
    dataset.mkdir()
    return {"model": str(model), "stats": str(stats_path), "data": str(dataset), "root": str(root)}


def _compose(name: str, overrides: list[str]) -> dict:
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name=name, overrides=overrides)
    return OmegaConf.to_container(cfg, resolve=True)


def _tiny(paths: dict[str, str], *extra: str) -> list[str]:
    return [f"actor.model.model_path={paths['model']}", f"data.dataset.root={paths['data']}",
            f"data.dataset.stats_path={paths['stats']}", *extra]


def test_tiny_config_is_valid(paths) -> None:
    cfg = load_sft_config(_compose("libero_sft_cosmos3_tiny", _tiny(paths)))
    assert cfg.cluster.world_size == 2 and cfg.actor.global_batch_size == 4
    assert cfg.actor.model.lr_multipliers["action_proj_out"] == 5.0


def test_reference_recipe_values(paths) -> None:
    raw = _compose("libero_sft_cosmos3", _tiny(paths))
    cfg = load_sft_config(raw, check_gpus=False)
    assert (cfg.cluster.num_gpus_per_node, cfg.actor.micro_batch_size, cfg.actor.global_batch_size) == (8, 32, 2048)
    assert (cfg.actor.optim.lr, cfg.actor.optim.lr_warmup_steps, cfg.runner.max_steps) == (5e-5, 500, 5000)
    assert cfg.runner.save_interval == 500 and cfg.actor.model.ema_enabled and cfg.actor.model.precision == "bf16"
    assert cfg.actor.model.load_to_device is False


def test_gpus_requested_but_absent(paths) -> None:
    import torch

    if torch.cuda.device_count() >= 8:
        pytest.skip("this machine has the GPUs")
    with pytest.raises(ConfigError, match=r"cluster.num_gpus_per_node.*requested 8 GPUs"):
        load_sft_config(_compose("libero_sft_cosmos3", _tiny(paths)))


@pytest.mark.parametrize(
    ("override", "field", "text"),
    [
        ("actor.global_batch_size=3", "actor.global_batch_size", "not a multiple of micro_batch_size x world_size"),
        ("actor.model.model_path=/nonexistent", "actor.model.model_path", "not found"),
        ("data.dataset.root=/nonexistent", "data.dataset.root", "not found"),
        ("data.dataset.fps=10", "data.dataset.fps", "disagrees with the model setting"),
        ("actor.model.precision=fp16", "actor.model.precision", "unknown precision"),
        ("actor.optim.lr_warmup_steps=100", "actor.optim.lr_warmup_steps", "must be in"),
        ("runner.resume_dir=/nonexistent/global_step_5", "runner.resume_dir", "not found"),
        ("runner.max_checkpoints_to_keep=0", "runner.max_checkpoints_to_keep", "must be >= 1 or null"),
        ("+actor.model.bogus=1", "actor.model.bogus", "Key 'bogus' not in"),
    ],
)
def test_errors_name_the_field(paths, override: str, field: str, text: str) -> None:
    with pytest.raises(ConfigError, match=text) as err:
        load_sft_config(_compose("libero_sft_cosmos3_tiny", _tiny(paths, override)))
    assert err.value.field == field


def test_compiled_blocks_with_activation_checkpointing_is_rejected(paths) -> None:
    """The combination fails in the first backward on an H200 (docs/benchmarks.md); each alone is fine."""
    both = _tiny(paths, "actor.model.compile_blocks=true", "actor.model.activation_checkpointing=true")
    with pytest.raises(ConfigError, match="activation_checkpointing=false") as err:
        load_sft_config(_compose("libero_sft_cosmos3_tiny", both))
    assert err.value.field == "actor.model.compile_blocks"
    for alone in ("actor.model.compile_blocks=true", "actor.model.activation_checkpointing=true"):
        load_sft_config(_compose("libero_sft_cosmos3_tiny", _tiny(paths, alone)))


def test_stats_computed_at_other_fps_is_rejected(paths) -> None:
    rng = np.random.default_rng(1)
    episodes = [np.concatenate([rng.uniform(-1, 1, (40, 6)), rng.uniform(0, 1, (40, 1))], axis=1)]
    other = write_action_stats(compute_action_stats(episodes, metadata={"fps": 10}), Path(paths["root"]) / "s10.json")
    with pytest.raises(ConfigError, match="computed with fps=10"):
        load_sft_config(_compose("libero_sft_cosmos3_tiny", _tiny(paths, f"data.dataset.stats_path={other}")))

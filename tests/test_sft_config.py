"""The SFT configs compose with Hydra and every rule fails with a message naming field and fix."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from dataset_helpers import MAIN, WRIST, write_libero_like
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlinf_cosmos3.actions import compute_action_stats, write_action_stats
from rlinf_cosmos3.config import ConfigError
from rlinf_cosmos3.validation.sft import load_sft_config

REPO = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO / "examples" / "sft" / "config"


@pytest.fixture(scope="module")
def paths(tiny_model_and_stats, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("sftcfg")
    dataset = write_libero_like(root / "dataset")  # a real LeRobot v3 dataset, cameras as images
    return {"model": str(tiny_model_and_stats.model), "stats": str(tiny_model_and_stats.stats), "data": str(dataset),
            "root": str(root)}


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


@pytest.mark.parametrize("name", sorted(p.stem for p in CONFIG_DIR.glob("*_small.yaml")))
def test_small_recipes_are_valid(paths, name: str) -> None:
    """The small-model recipes (one task, libero_goal, libero_object) validate, each schedule whole (the learning
    rate decays over exactly the steps it runs) and saving on its last step."""
    cfg = load_sft_config(_compose(name, _tiny(paths, f"data.latent_cache_dir={paths['root']}/latents_{name}")),
                          check_gpus=False)
    assert cfg.runner.experiment_name == name
    assert cfg.actor.optim.total_training_steps == cfg.runner.max_steps
    assert cfg.runner.max_steps % cfg.runner.save_interval == 0


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
        ("actor.model.load_to_device=true", "actor.model.load_to_device", "not implemented"),
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


# ----------------------------------------------------------------------------- the dataset, from meta/info.json
@pytest.fixture(scope="module")
def datasets(paths) -> dict[str, Path]:
    """Real LeRobot v3 datasets (lerobot's writer, or a copy whose meta/info.json was edited), one fault each."""
    root = Path(paths["root"])
    out = {
        "video": write_libero_like(root / "video", cameras={MAIN: "video", WRIST: "video"}),
        "no_wrist": write_libero_like(root / "no_wrist", cameras={MAIN: "image"}),
        "no_action": write_libero_like(root / "no_action", action_dim=None),
        "small_images": write_libero_like(root / "small_images", image_size=(128, 128)),
        "array_camera": write_libero_like(root / "array_camera", cameras={MAIN: "image", WRIST: "uint8"}),
        "empty": root / "empty",
    }
    out["empty"].mkdir()
    for name, edit in (("fps10", lambda info: info.update(fps=10)),
                       ("float_camera", lambda info: info["features"][WRIST].update(dtype="float32"))):
        out[name] = root / name
        shutil.copytree(paths["data"], out[name])
        info_path = out[name] / "meta" / "info.json"
        info = json.loads(info_path.read_text())
        edit(info)
        info_path.write_text(json.dumps(info, indent=4))
    return out


def test_image_and_video_cameras_are_both_accepted(paths, datasets) -> None:
    info = json.loads((Path(paths["data"]) / "meta" / "info.json").read_text())
    assert info["features"][MAIN]["dtype"] == "image"
    load_sft_config(_compose("libero_sft_cosmos3_tiny", _tiny(paths)))
    load_sft_config(_compose("libero_sft_cosmos3_tiny", _tiny(paths, f"data.dataset.root={datasets['video']}")))


@pytest.mark.parametrize(
    ("name", "field", "text"),
    [
        ("no_wrist", "data.dataset.image_keys", r"lacks feature\(s\) \['observation\.images\.wrist_image'\]"),
        ("no_action", "data.dataset.root", r"lacks feature\(s\) \['action'\]"),
        ("small_images", "data.dataset.image_size", r"128x128x3 \(HxWxC\), data\.image_size expects 256x256x3"),
        ("array_camera", "data.dataset.image_keys", r"'observation\.images\.wrist_image' has dtype 'uint8'.*video or image"),
        ("float_camera", "data.dataset.image_keys", r"'observation\.images\.wrist_image' has dtype 'float32'"),
        ("fps10", "data.dataset.fps", r"dataset fps 10 != data\.fps 20"),
        ("empty", "data.dataset.root", r"no LeRobot dataset.*info\.json"),
    ],
)
def test_bad_datasets_are_config_errors(paths, datasets, name: str, field: str, text: str) -> None:
    with pytest.raises(ConfigError, match=text) as err:
        load_sft_config(_compose("libero_sft_cosmos3_tiny", _tiny(paths, f"data.dataset.root={datasets[name]}")))
    assert err.value.field == field
    assert err.value.fix


def test_episode_selection_is_checked_against_the_dataset(paths) -> None:
    with pytest.raises(ConfigError, match=r"\[3\] do not exist.*episodes 0\.\.0") as err:
        load_sft_config(_compose("libero_sft_cosmos3_tiny", _tiny(paths, "data.dataset.episodes=[0,3]")))
    assert err.value.field == "data.dataset.episodes"
    with pytest.raises(ConfigError, match="no 'success' column") as err:
        load_sft_config(_compose("libero_sft_cosmos3_tiny", _tiny(paths, "data.dataset.successful_only=true")))
    assert err.value.field == "data.dataset.successful_only"


def test_dataset_checks_need_neither_torch_nor_lerobot(paths) -> None:
    """The driver's dataset checks read meta/info.json only; importing them pulls in no training stack."""
    code = (
        "import sys\n"
        "from rlinf_cosmos3.data.checks import check_dataset_info\n"
        "from rlinf_cosmos3.config.data import LiberoDataConfig\n"
        f"info = check_dataset_info(LiberoDataConfig(root={paths['data']!r}, stats_path='unused.json'))\n"
        "print(info['features']['observation.images.image']['dtype'], "
        "[m for m in ('torch', 'lerobot', 'datasets') if m in sys.modules])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["image", "[]"]


@pytest.mark.slow
def test_launcher_rejects_a_bad_dataset_before_ray_starts(paths, datasets, tmp_path) -> None:
    """The real SFT launcher exits with 2 and names the field; the log shows no Ray start and no rank."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    overrides = _tiny(paths, f"data.dataset.root={datasets['no_wrist']}", f"runner.logs_dir={tmp_path / 'logs'}",
                      f"runner.log_path={tmp_path / 'ckpts'}")
    proc = subprocess.run(["bash", str(REPO / "examples/sft/run_vla_sft.sh"), "libero_sft_cosmos3_tiny", *overrides],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = list((tmp_path / "logs").iterdir())
    log = (run_dir / "run_embodiment.log").read_text()
    assert "config field 'data.dataset.image_keys'" in log and "observation.images.wrist_image" in log
    assert "Ray " not in log and "starting" not in log
    assert not (tmp_path / "ckpts").exists()


def test_objective_settings_reach_the_policy(paths) -> None:
    """The recipe's objective knobs are set from YAML / the command line and the ranks' PolicyConfig gets them."""
    from rlinf_cosmos3.config.objective import ObjectiveConfig
    from rlinf_cosmos3.models.cosmos3.configuration import PolicyConfig, policy_config_from_sft

    default = policy_config_from_sft(load_sft_config(_compose("libero_sft_cosmos3_tiny", _tiny(paths))), precision="fp32")
    recipe = PolicyConfig()
    names = ("sigma_distribution", "action_sigma_distribution", "shift", "caption_dropout", "mask_padded_frames",
             "resolution_tier")
    assert [getattr(default.objective, n) for n in names] == [getattr(recipe.objective, n) for n in names]
    cfg = load_sft_config(_compose("libero_sft_cosmos3_tiny", _tiny(
        paths, "actor.model.sigma_distribution=logitnormal", "actor.model.action_sigma_distribution=uniform",
        "actor.model.shift=5.0", "actor.model.caption_dropout=0.1", "actor.model.mask_padded_frames=false")))
    policy = policy_config_from_sft(cfg, precision="fp32")
    assert [getattr(policy.objective, n) for n in names] == ["logitnormal", "uniform", 5.0, 0.1, False, 256]
    assert policy.objective == ObjectiveConfig.of(cfg.actor.model)  # every objective field, none copied by hand
    assert policy.training_shift == 5.0

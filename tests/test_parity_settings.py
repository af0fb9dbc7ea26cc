"""Parity settings through the configs: SFT schedule, gripper conventions, caption styles, flow shift.

Real configs (Hydra compose of the shipped YAMLs, the typed schemas and their validation), real
stats files written by the library, a real tokenizer directory for the adapter; the conventions'
numbers themselves are checked against the reference implementations in test_parity_reference.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from dataset_helpers import write_libero_like
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlinf_cosmos3.actions import compute_action_stats, write_action_stats
from rlinf_cosmos3.config import ConfigError, objective
from rlinf_cosmos3.config import sft as sft_config
from rlinf_cosmos3.config.base import load_structured
from rlinf_cosmos3.config.rollout import RolloutModelConfig
from rlinf_cosmos3.models.cosmos3 import captions, configuration
from rlinf_cosmos3.models.cosmos3.identity import IDENTITY_FILE, ModelIdentity, file_sha256, write_identity
from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir
from rlinf_cosmos3.validation.rollout import validate_rollout_model
from rlinf_cosmos3.validation.sft import load_sft_config
from rlinf_cosmos3.workers.rollout.adapter import Cosmos3ActionAdapter, RequestGroup

REPO = Path(__file__).resolve().parent.parent
SFT_CONFIGS = REPO / "examples" / "sft" / "config"
TASK = "put the black bowl on the plate"


def _episodes(convention: str, seed: int = 0) -> list[np.ndarray]:
    """Two 40-frame episodes whose gripper follows ``convention`` (open, then closed)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(2):
        ep = np.concatenate([rng.uniform(-0.5, 0.5, (40, 6)), np.zeros((40, 1))], axis=1)
        command = np.where(np.arange(40) < 20, -1.0, 1.0)  # LIBERO: open, then close
        ep[:, 6] = {"zero_one": (1 - command) / 2, "pm_one": command, "pm_one_flip": -command}[convention]
        out.append(ep)
    return out


def _stats_file(path: Path, convention: str) -> Path:
    stats = compute_action_stats(_episodes(convention), metadata={"fps": 20}, gripper_convention=convention)
    return write_action_stats(stats, path)


# ----------------------------------------------------------------------------- the SFT recipe


def test_reference_recipe_runs_nvidias_lambda_linear_cycle() -> None:
    """NVIDIA's LIBERO recipe: LambdaLinear over 16,000 steps, stopped at 5,000 -> the LR is still ~71 % of peak."""
    from rlinf_cosmos3.components.optim import lambda_linear_factor

    with initialize_config_dir(config_dir=str(SFT_CONFIGS), version_base=None):
        raw = compose(config_name="libero_sft_cosmos3", overrides=[  # placeholders: only the schedule is read
            "actor.model.model_path=/m", "data.dataset.root=/d", "data.dataset.stats_path=/s.json"])
    cfg = load_structured(sft_config.SFTConfig, OmegaConf.to_container(raw))
    optim = cfg.actor.optim
    assert (optim.lr_warmup_steps, optim.total_training_steps, cfg.runner.max_steps) == (500, 16000, 5000)
    end = lambda_linear_factor(cfg.runner.max_steps, optim.lr_warmup_steps, optim.total_training_steps,
                               1e-6, 1.0, optim.min_lr_rate)
    assert end == pytest.approx(1 - (5000 - 500) / (16000 - 500), abs=1e-9)
    assert 0.70 < end < 0.72


def test_caption_styles_and_sigma_distributions_of_the_config_and_the_model_agree() -> None:
    assert sft_config.CAPTION_STYLES == captions.CAPTION_STYLES
    assert objective.SIGMA_DISTRIBUTIONS is configuration.SIGMA_DISTRIBUTIONS  # declared once, imported


# ----------------------------------------------------------------------------- SFT config checks


@pytest.fixture(scope="module")
def sft_paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("parity_sft")
    return {"model": write_model_dir(root / "model", preset="tiny", seed=0), "data": write_libero_like(root / "data"),
            "zero_one": _stats_file(root / "zero_one.json", "zero_one"),
            "pm_one": _stats_file(root / "pm_one.json", "pm_one")}


def _sft(paths: dict[str, Path], stats: str, *extra: str) -> sft_config.SFTConfig:
    with initialize_config_dir(config_dir=str(SFT_CONFIGS), version_base=None):
        raw = compose(config_name="libero_sft_cosmos3_tiny", overrides=[
            f"actor.model.model_path={paths['model']}", f"data.dataset.root={paths['data']}",
            f"data.dataset.stats_path={paths[stats]}", *extra])
    return load_sft_config(OmegaConf.to_container(raw, resolve=True), check_gpus=False)


@pytest.mark.parametrize(("stats", "override", "text"), [
    ("zero_one", "data.dataset.gripper_convention=pm_one", "computed for gripper_convention='zero_one'"),
    ("pm_one", "data.dataset.gripper_convention=zero_one", "computed for gripper_convention='pm_one'"),
    ("zero_one", "data.dataset.gripper_convention=open_close", "unknown gripper convention"),
    ("zero_one", "actor.model.caption_style=nvidia", "unknown caption style"),
])
def test_sft_refuses_a_wrong_gripper_convention_or_caption_style(sft_paths, stats: str, override: str,
                                                                 text: str) -> None:
    field = override.split("=")[0]
    with pytest.raises(ConfigError, match=text) as err:
        _sft(sft_paths, stats, override)
    assert err.value.field == field


def test_sft_checks_the_gripper_range_of_stats_without_a_recorded_convention(sft_paths, tmp_path: Path) -> None:
    """NVIDIA's bundled stats record no convention: their gripper range decides."""
    stats = json.loads(sft_paths["pm_one"].read_text())
    del stats["metadata"]["gripper_convention"]
    (tmp_path / "pm_one.json").write_text(json.dumps(stats))
    paths = dict(sft_paths, bare=tmp_path / "pm_one.json")
    with pytest.raises(ConfigError, match=r"outside zero_one's \[0, 1\] \(looks like pm_one or pm_one_flip\)"):
        _sft(paths, "bare")
    assert _sft(paths, "bare", "data.dataset.gripper_convention=pm_one").data.dataset.gripper_convention == "pm_one"


def test_the_training_identity_records_caption_style_and_gripper_convention(sft_paths) -> None:
    from rlinf_cosmos3.runners.sft_runner import training_identity

    default = training_identity(_sft(sft_paths, "zero_one"))
    assert (default.caption_style, default.gripper_convention) == ("diffusers", "zero_one")
    nvidia = training_identity(_sft(sft_paths, "pm_one", "data.dataset.gripper_convention=pm_one",
                                    "actor.model.caption_style=cosmos_framework"))
    assert (nvidia.caption_style, nvidia.gripper_convention) == ("cosmos_framework", "pm_one")
    assert ModelIdentity.from_json(nvidia.to_json()) == nvidia


def test_stats_refuse_values_outside_the_convention() -> None:
    with pytest.raises(ValueError, match="outside \\[0, 1\\] of the gripper convention 'zero_one'"):
        compute_action_stats(_episodes("pm_one"))
    with pytest.raises(ValueError, match="never negative: that is zero_one data, not pm_one"):
        compute_action_stats(_episodes("zero_one"), gripper_convention="pm_one")
    stats = compute_action_stats(_episodes("pm_one_flip"), gripper_convention="pm_one_flip")
    assert stats["metadata"]["gripper_convention"] == "pm_one_flip"
    assert (stats["global_raw"]["min"][9], stats["global_raw"]["max"][9]) == (-1.0, 1.0)


# ----------------------------------------------------------------------------- eval config and adapter


def _rollout(model: Path, stats: Path, **overrides) -> RolloutModelConfig:
    cfg = RolloutModelConfig(model_path=str(model), action_stats_path=str(stats), action_normalization="quantile_rot",
                             num_inference_steps=2)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def _trained_copy(adapter_model_dir: Path, root: Path, stats: Path, **identity) -> Path:
    """A model directory whose identity says it was trained with ``identity`` (and these stats)."""
    model = root / "trained"
    model.mkdir()
    for part in ("text_tokenizer", "model_index.json"):
        (model / part).symlink_to(adapter_model_dir / part)
    write_identity(model, ModelIdentity(fps=20, action_horizon=16, num_frames=17, canvas_height=192, canvas_width=320,
                                        view_point="concat_view", normalization="quantile_rot",
                                        stats_sha256=file_sha256(stats), domain_name="libero", **identity))
    return model


def test_eval_compares_caption_style_and_gripper_convention_with_the_model(adapter_model_dir: Path, tmp_path: Path) -> None:
    stats = _stats_file(tmp_path / "pm_one.json", "pm_one")
    model = _trained_copy(adapter_model_dir, tmp_path, stats, caption_style="cosmos_framework", gripper_convention="pm_one")
    assert (model / IDENTITY_FILE).is_file()
    with pytest.raises(ConfigError) as err:
        validate_rollout_model(_rollout(model, stats))
    assert err.value.field == "rollout.model.caption_style"  # the first of the two mismatches, both listed
    assert "trained with caption_style='cosmos_framework'" in str(err.value)
    assert "trained with gripper_convention='pm_one'" in str(err.value)
    with pytest.raises(ConfigError) as err:
        validate_rollout_model(_rollout(model, stats, caption_style="cosmos_framework"))
    assert err.value.field == "rollout.model.gripper_convention"
    validate_rollout_model(_rollout(model, stats, gripper_convention="pm_one", caption_style="cosmos_framework"))


@pytest.mark.parametrize(("overrides", "field", "text"), [
    ({"flow_shift": 0.0}, "rollout.model.flow_shift", "must be > 0"),
    ({"caption_style": "nvidia"}, "rollout.model.caption_style", "unknown value 'nvidia'"),
    ({"gripper_command": "binarize"}, "rollout.model.gripper_command", "unknown value"),
    ({"rot6d_decode": "qr"}, "rollout.model.rot6d_decode", "unknown value"),
    ({"caption_style": "cosmos_framework", "view_point": "ego_view"}, "rollout.model.view_point", "concat_view"),
    ({"gripper_convention": "pm_one"}, "rollout.model.gripper_convention", "computed for 'zero_one'"),
])
def test_eval_config_errors(adapter_model_dir: Path, tmp_path: Path, overrides: dict, field: str, text: str) -> None:
    stats = _stats_file(tmp_path / "zero_one.json", "zero_one")
    with pytest.raises(ConfigError, match=text) as err:
        validate_rollout_model(_rollout(adapter_model_dir, stats, **overrides))
    assert err.value.field == field


def _group(n: int = 1) -> RequestGroup:
    return RequestGroup(np.arange(n), ("t",) * n, np.zeros((n, 192, 320, 3), np.uint8), 1)


def test_adapter_sends_the_styles_task_text_and_the_flow_shift(adapter_model_dir: Path, tmp_path: Path) -> None:
    stats = _stats_file(tmp_path / "zero_one.json", "zero_one")
    rng = np.random.default_rng(0)
    obs = {"main_images": rng.integers(0, 256, (2, 256, 256, 3), dtype=np.uint8),
           "wrist_images": rng.integers(0, 256, (2, 256, 256, 3), dtype=np.uint8),
           "task_descriptions": [f" {TASK} ", TASK]}
    default = Cosmos3ActionAdapter(validate_rollout_model(_rollout(adapter_model_dir, stats)), batching_max_size=4)
    (group,) = default.request_groups(obs)
    payload = default.build_request(group)
    assert payload["input"]["task"] == [TASK, TASK] and payload["parameters"]["flow_shift"] == 5.0

    nvidia = Cosmos3ActionAdapter(validate_rollout_model(_rollout(adapter_model_dir, stats, caption_style="cosmos_framework", flow_shift=3.0)),
                                  batching_max_size=4)
    (group,) = nvidia.request_groups(obs)
    payload = nvidia.build_request(group)
    description = f"{TASK}. {captions.CONCAT_VIEW_SENTENCE} {captions.LAYOUT_SENTENCE}"
    assert payload["input"]["task"] == [description, description] and payload["parameters"]["flow_shift"] == 3.0
    # Grouping measures what SGLang will tokenize: the longer description.
    assert group.token_length > default.request_groups(obs)[0].token_length


def _model_output(rot6d: list[float], gripper_normalized: float) -> np.ndarray:
    out = np.zeros((1, 16, 10), dtype=np.float32)
    out[..., 3:9] = np.asarray(rot6d) / 2.0  # _hand_stats de-normalise rot6d as a = 2 a_n
    out[..., 9] = gripper_normalized
    return out


def _hand_stats(path: Path, gripper: tuple[float, float]) -> Path:
    """Stats that leave rot6d as 2 a_n and map the gripper's normalised [-1, 1] onto ``gripper``."""
    q01 = [-1.0] * 3 + [-2.0] * 6 + [gripper[0]]
    q99 = [1.0] * 3 + [2.0] * 6 + [gripper[1]]
    block = {"mean": [0.0] * 10, "std": [1.0] * 10, "min": q01, "max": q99, "q01": q01, "q99": q99}
    return write_action_stats({"metadata": {"fps": 20, "chunk_length": 16}, "global": block, "global_raw": block}, path)


def test_adapter_decodes_rot6d_by_svd_and_applies_the_gripper_convention(adapter_model_dir: Path, tmp_path: Path) -> None:
    zero_one = _hand_stats(tmp_path / "zo.json", (0.0, 1.0))
    adapter = Cosmos3ActionAdapter(validate_rollout_model(_rollout(adapter_model_dir, zero_one)), batching_max_size=1)
    # c0 = (0, 2, 0), c1 = (-1, 1, 0): [c0, c1, c0 x c1] has the 2-D block [[0, -1], [2, 1]] (and 2 on z),
    # whose nearest rotation turns by atan2(2 - (-1), 0 + 1) = atan2(3, 1) about z (Gram-Schmidt: pi / 2).
    actions = adapter.parse_response(_model_output([0, 2, 0, -1, 1, 0], 0.2), _group())
    np.testing.assert_allclose(actions[0, :, 3:6], np.tile([0.0, 0.0, math.atan2(3, 1)], (16, 1)), atol=1e-6)
    assert (actions[0, :, 6] == -1.0).all()  # g = 0.6 > 0.5: open
    continuous = Cosmos3ActionAdapter(validate_rollout_model(_rollout(adapter_model_dir, zero_one, gripper_command="continuous")),
                                      batching_max_size=1)
    np.testing.assert_allclose(continuous.parse_response(_model_output([1, 0, 0, 0, 1, 0], 0.2), _group())[0, :, 6],
                               -0.2, atol=1e-6)  # 1 - 2 g

    pm_one = _hand_stats(tmp_path / "pm.json", (-1.0, 1.0))
    for convention, expected in (("pm_one", 1.0), ("pm_one_flip", -1.0)):
        cfg = validate_rollout_model(_rollout(adapter_model_dir, pm_one, gripper_convention=convention))
        out = Cosmos3ActionAdapter(cfg, batching_max_size=1).parse_response(_model_output([1, 0, 0, 0, 1, 0], 0.3),
                                                                             _group())
        assert (out[0, :, 6] == expected).all(), convention  # g = +0.3: close in robosuite's sign, open flipped

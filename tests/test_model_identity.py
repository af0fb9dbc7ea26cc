"""The model identity travels with the model: SFT checkpoint -> converted directory -> eval validation.

Real pieces throughout: the tiny Cosmos3 in the genuine diffusers format, the real SFT config (the
tiny recipe through Hydra), a real single-process checkpoint save of its transformer, the real
converter, and the real eval config loader. Only the identity file of a converted copy is
rewritten, to stand for a model trained with other settings.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlinf_cosmos3.actions import write_action_stats
from rlinf_cosmos3.config import ConfigError
from rlinf_cosmos3.models.cosmos3.identity import (
    COMPARED_FIELDS,
    IDENTITY_FILE,
    IDENTITY_FORMAT_VERSION,
    IdentityError,
    IdentityMismatch,
    ModelIdentity,
    compare_identities,
    file_sha256,
    read_identity,
    write_identity,
)

REPO = Path(__file__).resolve().parent.parent
Q01 = [-0.5, -1.0, 0.0, -2.0, -2.0, -2.0, -2.0, -2.0, -2.0, 0.0]
Q99 = [0.5, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 1.0]
IDENTITY = ModelIdentity(fps=20, action_horizon=16, num_frames=17, canvas_height=192, canvas_width=320,
                         view_point="concat_view", normalization="quantile_rot", stats_sha256="0" * 64,
                         domain_name="libero", stats_path="/data/stats.json")


def _stats(q99: list[float] = Q99) -> dict:
    block = {"mean": [0.0] * 10, "std": [1.0] * 10, "min": Q01, "max": q99, "q01": Q01, "q99": q99}
    return {"metadata": {"fps": 20, "chunk_length": 16}, "global": block, "global_raw": block}


# ----------------------------------------------------------------------------- the record itself


def test_json_round_trip_and_files(tmp_path: Path) -> None:
    text = IDENTITY.to_json()
    assert json.loads(text)["format_version"] == IDENTITY_FORMAT_VERSION
    assert ModelIdentity.from_json(text) == IDENTITY
    assert read_identity(tmp_path) is None
    assert write_identity(tmp_path, IDENTITY) == tmp_path / IDENTITY_FILE
    assert read_identity(tmp_path) == IDENTITY
    (tmp_path / "stats.bin").write_bytes(b"abc")
    assert file_sha256(tmp_path / "stats.bin") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(format_version=IDENTITY_FORMAT_VERSION + 1), "format_version 2"),
    (lambda d: d.pop("format_version"), "no integer format_version"),
    (lambda d: d.pop("fps"), r"missing fields \['fps'\]"),
    (lambda d: d.update(extra=1), r"unknown fields \['extra'\]"),
    (lambda d: d.update(fps="20"), "'fps' must be int"),
    (lambda d: d.update(view_point=3), "'view_point' must be str"),
])
def test_unreadable_identities_are_errors(edit, message: str) -> None:
    raw = json.loads(IDENTITY.to_json())
    edit(raw)
    with pytest.raises(IdentityError, match=message):
        ModelIdentity.from_json(json.dumps(raw))
    with pytest.raises(IdentityError, match="not valid JSON"):
        ModelIdentity.from_json("{")


def test_compare_returns_every_mismatch_with_its_config_field() -> None:
    fields = {name: f"cfg.{name}" for name in COMPARED_FIELDS}
    assert compare_identities(IDENTITY, dataclasses.replace(IDENTITY, stats_path="/elsewhere.json"), fields) == []
    other = dataclasses.replace(IDENTITY, fps=10, canvas_width=256, stats_sha256="1" * 64)
    assert compare_identities(IDENTITY, other, fields) == [
        IdentityMismatch("fps", 20, 10, "cfg.fps"),
        IdentityMismatch("canvas_width", 320, 256, "cfg.canvas_width"),
        IdentityMismatch("stats_sha256", "0" * 64, "1" * 64, "cfg.stats_sha256"),
    ]
    with pytest.raises(KeyError, match="domain_name"):
        compare_identities(IDENTITY, other, {k: v for k, v in fields.items() if k != "domain_name"})


def test_every_config_section_reads_its_model_settings_through_one_table() -> None:
    """The settings are declared once (config/model_settings.py): each section names the key that sets each
    of them, its defaults are the recipe's, and serving sets (and the identity compares) every one."""
    from rlinf_cosmos3.config.data import DATA_SETTING_KEYS, LiberoDataConfig
    from rlinf_cosmos3.config.model_settings import RECIPE, SETTING_NAMES, read_settings
    from rlinf_cosmos3.config.rollout import (
        IDENTITY_CONFIG_FIELDS,
        ROLLOUT_SETTING_KEYS,
        RolloutModelConfig,
    )
    from rlinf_cosmos3.config.sft import SFT_SETTING_KEYS, SFTConfig, sft_model_settings

    assert sft_model_settings(SFTConfig()) == RECIPE
    assert read_settings(LiberoDataConfig(), DATA_SETTING_KEYS) == RECIPE
    served = RolloutModelConfig(action_normalization=RECIPE.normalization)  # the one setting with no default
    assert read_settings(served, ROLLOUT_SETTING_KEYS) == RECIPE
    assert set(ROLLOUT_SETTING_KEYS) == set(SETTING_NAMES)
    assert set(SFT_SETTING_KEYS) == set(SETTING_NAMES) - {"view_point"}  # the policy composes the recipe's framing
    assert set(IDENTITY_CONFIG_FIELDS) == set(COMPARED_FIELDS)
    assert dataclasses.replace(IDENTITY, fps=10).fps == 10 and isinstance(IDENTITY, type(RECIPE))
    with pytest.raises(KeyError, match="not model settings"):
        read_settings(served, {"height": "height"})


def test_importing_the_identity_pulls_in_nothing_heavy() -> None:
    code = ("import sys, rlinf_cosmos3.models.cosmos3.identity; "
            "print(sorted(m for m in ('torch', 'diffusers', 'ray', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


# ----------------------------------------------------------------------------- SFT -> convert -> eval


@pytest.fixture(scope="module")
def trained(recorded_libero_dataset, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny model, its SFT config, and two real checkpoints of it: with and without an identity."""
    import torch
    from diffusers import Cosmos3OmniTransformer
    from hydra import compose, initialize_config_dir

    from rlinf_cosmos3.checkpoint import TrainerState, save_checkpoint
    from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir
    from rlinf_cosmos3.runners.sft_runner import SFTRunner
    from rlinf_cosmos3.validation.sft import load_sft_config

    root = tmp_path_factory.mktemp("identity")
    model = write_model_dir(root / "tiny", preset="tiny", seed=0)
    stats = write_action_stats(_stats(), root / "stats.json")
    with initialize_config_dir(config_dir=str(REPO / "examples/sft/config"), version_base=None):
        raw = compose("libero_sft_cosmos3_tiny", overrides=[
            f"actor.model.model_path={model}", f"data.dataset.root={recorded_libero_dataset.root}",
            f"data.dataset.stats_path={stats}"])
    cfg = load_sft_config(raw, check_gpus=False)
    identity = SFTRunner(cfg, {}, tensorboard_dir=root / "tb").identity  # what the runner saves each checkpoint with

    transformer = Cosmos3OmniTransformer.from_pretrained(model / "transformer")
    with torch.no_grad():  # "training": the checkpoint differs from the base
        next(transformer.parameters()).add_(1.0)
    step = save_checkpoint(root / "ckpts", transformer, None, TrainerState(global_step=2),
                           extra_files={IDENTITY_FILE: identity.to_json()})
    old = save_checkpoint(root / "old_ckpts", transformer, None, TrainerState(global_step=2))
    return {"root": root, "model": model, "stats": stats, "step": step, "old_step": old, "identity": identity}


def test_the_sft_identity_is_the_validated_config(trained: dict) -> None:
    assert trained["identity"] == ModelIdentity(
        fps=20, action_horizon=16, num_frames=17, canvas_height=192, canvas_width=320, view_point="concat_view",
        normalization="quantile_rot", stats_sha256=file_sha256(trained["stats"]), domain_name="libero",
        stats_path=str(trained["stats"].resolve()))


def test_the_checkpoint_carries_the_identity_inside_the_atomic_save(trained: dict) -> None:
    from rlinf_cosmos3.checkpoint import is_complete_checkpoint

    step = trained["step"]
    assert is_complete_checkpoint(step) and step.name == "global_step_2"
    assert read_identity(step) == trained["identity"]
    assert sorted(p.name for p in step.parent.iterdir()) == ["global_step_2"]  # no temp dir left
    assert read_identity(trained["old_step"]) is None


def test_extra_checkpoint_files_must_be_plain_names(trained: dict, tmp_path: Path) -> None:
    from torch import nn

    from rlinf_cosmos3.checkpoint import TrainerState, save_checkpoint

    for name in ("../escape.json", "COMPLETE", "actor"):
        with pytest.raises(ValueError, match="plain file name"):
            save_checkpoint(tmp_path, nn.Linear(2, 2), None, TrainerState(global_step=1), extra_files={name: "x"})
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def converted(trained: dict) -> Path:
    """The converter on full_weights.pt, as the quickstart calls it (in-process: the CLI is a thin wrapper
    whose run tests/test_sft_e2e.py covers)."""
    from rlinf_cosmos3.checkpoint.export import export_diffusers

    weights = trained["step"] / "actor" / "model_state_dict" / "full_weights.pt"
    return export_diffusers(weights, trained["model"], trained["root"] / "converted")


def test_conversion_writes_the_training_identity(trained: dict, converted: Path) -> None:
    assert read_identity(converted) == trained["identity"]
    assert (converted / IDENTITY_FILE).read_text() == (trained["step"] / IDENTITY_FILE).read_text()


def test_a_checkpoint_without_identity_converts_with_a_warning_and_no_identity(trained: dict, tmp_path: Path,
                                                                              caplog) -> None:
    from rlinf_cosmos3.checkpoint.export import export_diffusers

    base = tmp_path / "base"  # a base that has an identity of its own: it must not be passed on
    shutil.copytree(trained["model"], base)
    write_identity(base, dataclasses.replace(trained["identity"], fps=5))
    with caplog.at_level(logging.WARNING, logger="rlinf_cosmos3.checkpoint.export"):
        out = export_diffusers(trained["old_step"], base, tmp_path / "out")
    assert f"has no {IDENTITY_FILE}" in caplog.text and str(trained["old_step"]) in caplog.text
    assert read_identity(out) is None and (out / "transformer").is_dir()


def _eval_cfg(model: Path, stats: Path, **model_overrides):
    from rlinf_cosmos3.validation.eval import load_eval_config

    return load_eval_config({
        "env": {"eval": {"suite": "libero_spatial", "task_ids": [0], "trials_per_task": 1, "total_num_envs": 1,
                         "num_workers": 1}},
        "rollout": {"rollout_backend": "embedded", "pipeline_stage_num": 1,
                    "model": {"model_path": str(model), "action_stats_path": str(stats),
                              "action_normalization": "quantile_rot", "num_inference_steps": 2, **model_overrides},
                    "embedded": {"num_workers": 1, "gpus_per_worker": 0}},
    })


def test_eval_accepts_the_model_with_its_training_settings(trained: dict, converted: Path) -> None:
    from rlinf_cosmos3.validation.rollout import check_identity

    cfg = _eval_cfg(converted, trained["stats"], num_inference_steps=7)  # steps are not part of the identity
    assert check_identity(cfg.rollout.model) == trained["identity"]


@pytest.mark.parametrize(("field", "trained_value", "config_field", "config_value"), [
    ("fps", 10, "rollout.model.fps", 20),
    ("canvas_height", 256, "rollout.model.height", 192),
    ("canvas_width", 384, "rollout.model.width", 320),
    ("view_point", "single_view", "rollout.model.view_point", "concat_view"),
    ("action_horizon", 8, "rollout.model.num_action_chunks", 16),
    ("num_frames", 9, "rollout.model.num_frames", 17),
    ("normalization", "quantile", "rollout.model.action_normalization", "quantile_rot"),
    ("domain_name", "bridge", "rollout.model.domain_name", "libero"),
])
def test_eval_rejects_a_model_trained_with_other_settings(trained: dict, converted: Path, tmp_path: Path,
                                                          field: str, trained_value, config_field: str,
                                                          config_value) -> None:
    model = tmp_path / "model"
    shutil.copytree(converted, model)
    write_identity(model, dataclasses.replace(trained["identity"], **{field: trained_value}))
    with pytest.raises(ConfigError) as err:
        _eval_cfg(model, trained["stats"])
    assert err.value.field == config_field
    assert f"{config_field}={config_value!r} but the model was trained with {field}={trained_value!r}" in str(err.value)
    assert f"set {config_field}={trained_value}" in str(err.value)


def test_eval_rejects_another_stats_file_and_lists_every_mismatch(trained: dict, converted: Path,
                                                                  tmp_path: Path) -> None:
    # Same metadata (fps 20, chunk 16), other numbers: only the hash tells them apart.
    other = write_action_stats(_stats(q99=[v * 2 for v in Q99]), tmp_path / "other_stats.json")
    with pytest.raises(ConfigError) as err:
        _eval_cfg(converted, other)
    message = str(err.value)
    assert err.value.field == "rollout.model.action_stats_path"
    assert file_sha256(other) in message and trained["identity"].stats_sha256 in message
    assert str(trained["stats"].resolve()) in message  # where the training's stats file was

    with pytest.raises(ConfigError) as err:
        _eval_cfg(converted, other, fps=10, height=256, view_point="single_view")
    message = str(err.value)
    assert err.value.field == "rollout.model.fps"
    for part in ("rollout.model.fps=10 but the model was trained with fps=20",
                 "rollout.model.height=256 but the model was trained with canvas_height=192",
                 "rollout.model.view_point='single_view' but the model was trained with view_point='concat_view'",
                 f"has sha256 {file_sha256(other)}"):
        assert part in message


def test_eval_warns_about_a_model_without_identity_and_passes(trained: dict, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="rlinf_cosmos3.config.rollout"):
        cfg = _eval_cfg(trained["model"], trained["stats"], view_point="single_view")  # nothing to compare with
    assert cfg.rollout.model.view_point == "single_view"
    assert f"has no {IDENTITY_FILE}" in caplog.text and "cannot be checked" in caplog.text


def test_eval_rejects_an_unreadable_identity(trained: dict, converted: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(converted, model)
    (model / IDENTITY_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="rollout.model.model_path.*unreadable training identity"):
        _eval_cfg(model, trained["stats"])

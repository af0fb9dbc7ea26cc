"""Bad inputs to the SFT entry point, each refused before Ray or any rank starts, naming the field and the fix.

Real inputs throughout: the tiny Cosmos3 in the genuine diffusers format, the session's LeRobot v3
dataset recorded with the real simulator (and small ones written by lerobot's own writer where one
property must be wrong), real stats files, real checkpoints (``save_checkpoint``), the real SFT YAMLs
composed by Hydra, and the driver entry ``run_sft`` in-process. After every test nothing may be left
running (no Ray, no child process). The table in docs/reliability.md names these tests.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from dataset_helpers import MAIN, write_libero_like
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from process_checks import nothing_left_running

from rlinf_cosmos3.actions import compute_action_stats, read_lerobot_episode_actions, write_action_stats
from rlinf_cosmos3.config import ConfigError
from rlinf_cosmos3.config.hydra_cli import compose_overrides
from rlinf_cosmos3.config.sft import SFTConfig
from rlinf_cosmos3.validation.sft import check_micro_batch_fits, load_sft_config

REPO = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO / "examples" / "sft" / "config"
TINY = "libero_sft_cosmos3_tiny"


@pytest.fixture(autouse=True)
def _nothing_left_running():
    with nothing_left_running():
        yield


@pytest.fixture(scope="module")
def inputs(recorded_libero_dataset, tmp_path_factory) -> dict:
    """A tiny model, the recorded dataset and stats computed on it, and a 20-frame dataset (4 complete
    17-frame windows: the recipe's sampling) for the batch-size checks."""
    from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir

    root = tmp_path_factory.mktemp("bad_sft")
    episodes = read_lerobot_episode_actions(recorded_libero_dataset.root).episodes
    stats = compute_action_stats(episodes, chunk_length=16, metadata={"fps": recorded_libero_dataset.fps})
    return {"root": root, "model": write_model_dir(root / "model", preset="tiny", seed=0),
            "stats": write_action_stats(stats, root / "stats.json"), "stats_doc": stats,
            "data": recorded_libero_dataset.root, "short": write_libero_like(root / "short", length=20)}


def _overrides(inputs: dict, *extra: str) -> list[str]:
    return [f"actor.model.model_path={inputs['model']}", f"data.dataset.root={inputs['data']}",
            f"data.dataset.stats_path={inputs['stats']}", f"runner.logs_dir={inputs['root'] / 'logs'}",
            f"runner.log_path={inputs['root'] / 'ckpts'}", *extra]


def _raw(inputs: dict, *extra: str) -> dict:
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return OmegaConf.to_container(compose(TINY, overrides=_overrides(inputs, *extra)), resolve=True)


def _load(inputs: dict, *extra: str) -> SFTConfig:
    return load_sft_config(_raw(inputs, *extra))


def _refused(inputs: dict, field: str, text: str, *extra: str) -> ConfigError:
    with pytest.raises(ConfigError, match=text) as err:
        _load(inputs, *extra)
    assert err.value.field == field and err.value.fix, str(err.value)
    return err.value


def _driver_refuses(inputs: dict, tmp_path: Path, field: str, *extra: str) -> str:
    """``run_sft`` exits with 2 before Ray; its log names the field and the fix. Returns the log."""
    from rlinf_cosmos3.runners.sft_runner import run_sft

    raw = _raw(inputs, *extra, f"runner.logs_dir={tmp_path / 'logs'}", f"runner.log_path={tmp_path / 'ckpts'}")
    assert run_sft(raw, config_name="bad") == 2
    (run_dir,) = (tmp_path / "logs").glob("*-bad")
    log = (run_dir / "run_embodiment.log").read_text()
    assert f"invalid config: config field '{field}'" in log and "(fix: " in log, log
    assert "Ray " not in log and "starting" not in log and not (tmp_path / "ckpts").exists()
    return log


def test_the_inputs_are_valid(inputs) -> None:
    cfg = _load(inputs)
    assert check_micro_batch_fits(cfg) > 0
    assert check_micro_batch_fits(_load(inputs, f"data.dataset.root={inputs['short']}")) == 4  # starts 0..3


# ----------------------------------------------------------------------------- command line keys
@pytest.mark.parametrize(("override", "field", "text"), [
    ("foo.bar=1", "foo.bar", r"unknown key \(Key 'foo' not in 'SFTConfig'\); the top level has the fields "
                             r"cluster, runner, actor, data"),
    ("actor.micro_bach_size=2", "actor.micro_bach_size", r"unknown key .*'actor' has the fields micro_batch_size"),
    ("actor.micro_batch_size=abc", "actor.micro_batch_size", r"Value 'abc' of type 'str' could not be converted"),
    ("actor.model.keys_to_select=[a,b", "actor.model.keys_to_select", r"cannot parse the override"),
])
def test_overrides_hydra_rejects_are_config_errors_naming_the_key(inputs, override, field, text) -> None:
    with pytest.raises(ConfigError, match=text) as err:
        compose_overrides(SFTConfig, CONFIG_DIR, TINY, _overrides(inputs, override))
    assert err.value.field == field and err.value.fix
    assert "+foo.bar" not in str(err.value)  # not Hydra's advice: the typed schema rejects an added key too


def test_an_added_unknown_key_names_it_and_the_closest_field(inputs, tmp_path) -> None:
    err = _refused(inputs, "foo.bar", r"unknown key \(Key 'foo' not in 'SFTConfig'\)", "+foo.bar=1")
    assert err.fix.startswith("remove foo.bar")
    err = _refused(inputs, "runner.max_wall_time", r"Key 'max_wall_time' not in 'RunnerConfig'",
                   "+runner.max_wall_time=60")
    assert "runner.max_wall_time_s" in err.fix  # the field that was meant
    _driver_refuses(inputs, tmp_path, "runner.max_wall_time", "+runner.max_wall_time=60")


# ----------------------------------------------------------------------------- model directory
@pytest.mark.parametrize("part", ["transformer", "text_tokenizer", "vae", "transformer/config.json"])
def test_a_model_directory_without_a_component_is_refused(inputs, tmp_path, part) -> None:
    model = tmp_path / "model"
    shutil.copytree(inputs["model"], model)
    (shutil.rmtree if (model / part).is_dir() else Path.unlink)(model / part)
    err = _refused(inputs, "actor.model.model_path", "not a complete diffusers Cosmos3 directory",
                   f"actor.model.model_path={model}")
    assert repr(part) in err.problem and "make_tiny_model" in err.fix
    if part == "transformer":
        _driver_refuses(inputs, tmp_path, "actor.model.model_path", f"actor.model.model_path={model}")


# ----------------------------------------------------------------------------- the dataset
@pytest.mark.parametrize(("kind", "field", "text"), [
    ("no_wrist_camera", "data.dataset.image_keys", r"lacks feature\(s\) \['observation\.images\.wrist_image'\]"),
    ("no_action", "data.dataset.root", r"lacks feature\(s\) \['action'\]"),
])
def test_a_dataset_without_a_camera_or_the_action_column_is_refused(inputs, tmp_path, kind, field, text) -> None:
    data = (write_libero_like(tmp_path / kind, cameras={MAIN: "image"}) if kind == "no_wrist_camera"
            else write_libero_like(tmp_path / kind, action_dim=None))
    _refused(inputs, field, text, f"data.dataset.root={data}")
    _driver_refuses(inputs, tmp_path, field, f"data.dataset.root={data}")


# ----------------------------------------------------------------------------- stats file
def _stats_file(inputs: dict, tmp_path: Path, edit) -> Path:
    doc = json.loads(json.dumps(inputs["stats_doc"]))
    edit(doc)
    path = tmp_path / "stats.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(("edit", "text"), [
    (lambda d: d["global_raw"].update(q01=d["global_raw"]["q01"][:7]), r"'global_raw.q01' has 7 values, expected 10"),
    (lambda d: d.pop("global"), r"missing top-level field 'global'"),
    (lambda d: d["metadata"].update(fps=10), r"computed with fps=10 but the run uses fps=20"),
    (lambda d: d["metadata"].update(normalization="mean_std"),
     r"computed with normalization='mean_std' but the run uses normalization='quantile_rot'"),
    (lambda d: d["metadata"].update(chunk_length=8), r"computed with chunk_length=8 but the run uses chunk_length=16"),
], ids=["wrong_width", "no_global_block", "other_fps", "other_normalization", "other_chunk_length"])
def test_a_stats_file_for_another_recipe_is_refused(inputs, tmp_path, edit, text) -> None:
    stats = _stats_file(inputs, tmp_path, edit)
    err = _refused(inputs, "data.dataset.stats_path", text, f"data.dataset.stats_path={stats}")
    assert "compute_action_stats.py" in err.fix


def test_a_malformed_stats_file_is_refused(inputs, tmp_path) -> None:
    stats = tmp_path / "stats.json"
    stats.write_text('{"metadata": {"fps": 20}, "global":')
    _refused(inputs, "data.dataset.stats_path", r"not valid JSON", f"data.dataset.stats_path={stats}")
    _driver_refuses(inputs, tmp_path, "data.dataset.stats_path", f"data.dataset.stats_path={stats}")


# ----------------------------------------------------------------------------- resume_dir
def _checkpoint(root: Path, extra_files: dict[str, str] | None = None) -> Path:
    from torch import nn

    from rlinf_cosmos3.checkpoint import TrainerState, save_checkpoint

    return save_checkpoint(root, nn.Linear(2, 2), None, TrainerState(global_step=3), extra_files=extra_files)


def test_resume_dir_must_be_a_complete_checkpoint(inputs, tmp_path) -> None:
    from rlinf_cosmos3.checkpoint.layout import COMPLETE_MARKER

    step = _checkpoint(tmp_path / "ckpts")
    _load(inputs, f"runner.resume_dir={step}")  # complete: accepted
    interrupted = step.parent / "global_step_6.tmp-0a1b2c3d"  # what a killed save leaves
    shutil.copytree(step, interrupted)
    (interrupted / COMPLETE_MARKER).unlink()
    _refused(inputs, "runner.resume_dir", r"is not a global_step_<N> directory \(it is the temporary directory of a "
             r"save that did not finish\)", f"runner.resume_dir={interrupted}")
    unmarked = step.parent / "global_step_9"
    shutil.copytree(interrupted, unmarked)
    err = _refused(inputs, "runner.resume_dir", r"is not a complete checkpoint: it has no COMPLETE marker",
                   f"runner.resume_dir={unmarked}")
    assert "global_step_<N> with a COMPLETE file" in err.fix
    _refused(inputs, "runner.resume_dir", r"is not a global_step_<N> directory", f"runner.resume_dir={inputs['model']}")
    _refused(inputs, "runner.resume_dir", r"checkpoint to resume not found", f"runner.resume_dir={tmp_path / 'none'}")
    _driver_refuses(inputs, tmp_path / "run", "runner.resume_dir", f"runner.resume_dir={unmarked}")


def test_resume_dir_trained_with_other_settings_is_refused_before_ray(inputs, tmp_path) -> None:
    import dataclasses

    from rlinf_cosmos3.models.cosmos3.identity import IDENTITY_FILE
    from rlinf_cosmos3.validation.sft import check_resume_identity, training_identity

    cfg = _load(inputs)
    same = _checkpoint(tmp_path / "same", {IDENTITY_FILE: training_identity(cfg).to_json()})
    check_resume_identity(_load(inputs, f"runner.resume_dir={same}"))
    other = dataclasses.replace(training_identity(cfg), stats_sha256="0" * 64, fps=10)
    step = _checkpoint(tmp_path / "other", {IDENTITY_FILE: other.to_json()})
    with pytest.raises(ConfigError) as err:
        check_resume_identity(_load(inputs, f"runner.resume_dir={step}"))
    assert err.value.field == "runner.resume_dir" and "resume with the settings" in err.value.fix
    assert "actor.model.fps: the checkpoint was trained with fps=10, this run has 20" in str(err.value)
    assert "data.dataset.stats_path: the checkpoint was trained with stats_sha256='0000" in str(err.value)
    _driver_refuses(inputs, tmp_path / "run", "runner.resume_dir", f"runner.resume_dir={step}")


# ----------------------------------------------------------------------------- values out of range
@pytest.mark.parametrize(("override", "field", "text"), [
    ("runner.max_wall_time_s=0", "runner.max_wall_time_s", "must be > 0 or null, got 0.0"),
    ("runner.max_wall_time_s=-60", "runner.max_wall_time_s", "must be > 0 or null, got -60.0"),
    ("actor.max_tokens_per_pack=0", "actor.max_tokens_per_pack", "must be >= 1 or null, got 0"),
    ("actor.micro_batch_size=0", "actor.micro_batch_size", "must be >= 1, got 0"),
    ("data.num_workers=-1", "data.num_workers", "must be >= 0, got -1"),
])
def test_values_out_of_range_name_their_field(inputs, override, field, text) -> None:
    _refused(inputs, field, text, override)


# ----------------------------------------------------------------------------- the data against the batch
def test_a_micro_batch_larger_than_the_dataset_is_refused_before_ray(inputs, tmp_path) -> None:
    short = [f"data.dataset.root={inputs['short']}", "actor.micro_batch_size=3", "actor.global_batch_size=6"]
    cfg = _load(inputs, *short)  # 4 samples over 2 ranks: 2 each
    with pytest.raises(ConfigError, match=r"3 is more than the 2 sample\(s\) each of the 2 ranks gets") as err:
        check_micro_batch_fits(cfg)
    assert err.value.field == "actor.micro_batch_size" and "at most 2" in err.value.fix
    _driver_refuses(inputs, tmp_path, "actor.micro_batch_size", *short)


def test_episodes_too_short_for_complete_windows_are_refused(inputs, tmp_path) -> None:
    short = write_libero_like(tmp_path / "short", length=10)
    cfg = _load(inputs, f"data.dataset.root={short}")
    with pytest.raises(ConfigError, match=r"no training sample: .* at least 17 frames \(.* at most 10\)") as err:
        check_micro_batch_fits(cfg)
    assert err.value.field == "data.dataset.complete_chunks_only" and "complete_chunks_only=false" in err.value.fix
    assert check_micro_batch_fits(_load(inputs, f"data.dataset.root={short}",
                                        "data.dataset.complete_chunks_only=false")) == 10


def test_parameter_selections_matching_nothing_are_refused_before_ray(inputs, tmp_path) -> None:
    from rlinf_cosmos3.runners.checkpoint_space import preflight

    with pytest.raises(ConfigError, match="no_such_module") as err:
        preflight(_load(inputs, "actor.model.keys_to_select=[no_such_module]"))
    assert err.value.field == "actor.model.keys_to_select" and err.value.fix
    with pytest.raises(ConfigError, match=r"lr_multipliers keys \['no_such_head'\] match no parameter") as err:
        preflight(_load(inputs, "+actor.model.lr_multipliers.no_such_head=2.0"))
    assert err.value.field == "actor.model.lr_multipliers" and "substrings" in err.value.fix
    _driver_refuses(inputs, tmp_path, "actor.model.lr_multipliers", "+actor.model.lr_multipliers.no_such_head=2.0")


# ----------------------------------------------------------------------------- a full disk
def test_a_disk_without_room_for_one_checkpoint_is_refused_before_ray(inputs, tmp_path, monkeypatch) -> None:
    """The fault: the free-space probe reports 1 MiB (the tiny checkpoint needs ~11)."""
    from rlinf_cosmos3.checkpoint import disk
    from rlinf_cosmos3.runners.sft_runner import run_sft

    monkeypatch.setattr(disk, "free_bytes", lambda path: 2**20)
    raw = _raw(inputs, f"runner.logs_dir={tmp_path / 'logs'}", f"runner.log_path={tmp_path / 'ckpts'}")
    assert run_sft(raw, config_name="full") == 2
    (run_dir,) = (tmp_path / "logs").glob("*-full")
    log = (run_dir / "run_embodiment.log").read_text()
    assert "refusing to start: not enough disk space" in log and "1,048,576 bytes" in log
    assert "point runner.log_path at a filesystem with room" in log  # the field and the fix
    assert "Ray " not in log and "starting" not in log and not (tmp_path / "ckpts").exists()


# ----------------------------------------------------------------------------- online evaluation
@pytest.mark.parametrize(("extra", "field", "text"), [
    (("runner.eval_interval=3",), "runner.eval_interval", r"3 is not a multiple of runner.save_interval=15"),
    (("runner.eval_interval=15", "runner.online_eval.config_name=no_such_eval"), "runner.online_eval.config_name",
     r"no eval config 'no_such_eval' in .*evaluations/libero"),
    (("runner.eval_interval=15", 'runner.online_eval.overrides=["rollout.rollout_backend=sglang"]'),
     "runner.online_eval.overrides", r"rollout.rollout_backend is set by the online evaluation itself"),
])
def test_online_eval_settings_name_their_field(inputs, extra, field, text) -> None:
    _refused(inputs, field, text, *extra)


@pytest.mark.parametrize(("override", "text"), [
    ("rollout.model.fps=10", r"fps"),  # not what this run trains: the identity (or the stats' fps) disagrees
    ("env.eval.no_such_key=1", r"no_such_key"),
])
def test_an_eval_config_that_cannot_evaluate_the_run_is_refused_before_ray(inputs, tmp_path, override, text) -> None:
    log = _driver_refuses(inputs, tmp_path, "runner.online_eval", "runner.eval_interval=15",
                          "runner.online_eval.config_name=libero_spatial_cosmos3_eval_tiny",
                          f'runner.online_eval.overrides=["{override}"]')
    assert "libero_spatial_cosmos3_eval_tiny" in log and re.search(text, log.split("invalid config:")[1]), log


# ----------------------------------------------------------------------------- the objective's knobs
@pytest.mark.parametrize(("override", "field", "text"), [
    ("actor.model.sigma_distribution=cosine", "actor.model.sigma_distribution", r"unknown distribution 'cosine'"),
    ("actor.model.action_sigma_distribution=cosine", "actor.model.action_sigma_distribution",
     r"unknown distribution 'cosine'"),
    ("actor.model.shift=-1", "actor.model.shift", r"must be > 0 or null, got -1"),
    ("actor.model.caption_dropout=1.0", "actor.model.caption_dropout", r"must be in \[0, 1\), got 1.0"),
])
def test_objective_settings_name_their_field(inputs, override, field, text) -> None:
    _refused(inputs, field, text, override)


def test_a_resolution_tier_that_resizes_the_canvas_is_refused_before_ray(inputs, tmp_path) -> None:
    log = _driver_refuses(inputs, tmp_path, "actor.model.resolution_tier", "actor.model.resolution_tier=480")
    assert "not the 192x320 canvas" in log


def test_a_domain_the_policy_does_not_know_is_refused_before_ray(inputs, tmp_path) -> None:
    """Once a rank's policy refused it after Ray had started; ``preflight`` runs the policy's own check."""
    from rlinf_cosmos3.config.base import load_structured
    from rlinf_cosmos3.validation.sft import preflight

    with pytest.raises(ConfigError, match="no raw action width registered for domain 'not_a_robot'") as err:
        preflight(load_structured(SFTConfig, _raw(inputs, "actor.model.domain_name=not_a_robot")))
    assert err.value.field == "actor.model.domain_name" and "domains.py" in err.value.fix
    _driver_refuses(inputs, tmp_path, "actor.model.domain_name", "actor.model.domain_name=not_a_robot")

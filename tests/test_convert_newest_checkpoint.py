"""The converter, given a run's ``checkpoints/`` directory, converts its newest complete checkpoint by
step number - not by name, which puts ``global_step_880`` after ``global_step_1760`` (a shell
``ls | sort`` in the learning-proof script converted step 880 of a 1,760-step run that way).

Real checkpoints of two real tiny diffusers transformers with different weights, saved at steps 880
and 1760 beside an incomplete ``global_step_2000`` and an interrupted save's temporary directory;
the converter's command line in-process, and ``benchmarks/gpu/learning_proof.sh``'s convert phase
as a user runs it.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from process_checks import nothing_left_running

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _nothing_left_running():
    with nothing_left_running():
        yield


def _write_run(root: Path, base_preset: str) -> dict[str, Path]:
    """A base model and a checkpoints directory: steps 880 (seed 1) and 1760 (seed 2), each with EMA."""
    from diffusers import Cosmos3OmniTransformer

    from rlinf_cosmos3.checkpoint import TrainerState, save_checkpoint
    from rlinf_cosmos3.components.ema import PowerEMA
    from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir

    base = write_model_dir(root / "base", preset=base_preset, seed=0)
    ckpts = root / "checkpoints"
    for step, seed in ((880, 1), (1760, 2)):
        weights = write_model_dir(root / f"weights_{seed}", preset=base_preset, seed=seed)
        model = Cosmos3OmniTransformer.from_pretrained(weights / "transformer")
        save_checkpoint(ckpts, model, None, TrainerState(global_step=step), ema=PowerEMA(model, rate=0.1))
    incomplete = ckpts / "global_step_2000"
    shutil.copytree(ckpts / "global_step_1760", incomplete)
    (incomplete / "COMPLETE").unlink()
    shutil.copytree(ckpts / "global_step_880", ckpts / "global_step_3000.tmp-0a1b2c3d")
    return {"base": base, "ckpts": ckpts, "880": root / "weights_1", "1760": root / "weights_2"}


def _same_weights(converted: Path, expected: Path, dtype: torch.dtype = torch.float32) -> bool:
    """Equal tensors in ``dtype``, the dtype the converter wrote (the script converts to bf16)."""
    from diffusers import Cosmos3OmniTransformer

    got = Cosmos3OmniTransformer.from_pretrained(converted / "transformer").state_dict()
    want = Cosmos3OmniTransformer.from_pretrained(expected / "transformer").state_dict()
    assert got.keys() == want.keys()
    return all(torch.equal(got[k].to(dtype), want[k].to(dtype)) for k in want)


def test_a_checkpoints_directory_converts_its_newest_complete_step(tmp_path, caplog) -> None:
    run = _write_run(tmp_path, "tiny")
    spec = importlib.util.spec_from_file_location("convert_checkpoint", REPO / "toolkits/cosmos3/convert_checkpoint.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    for ema in (False, True):
        out = tmp_path / f"out_ema{ema}"
        caplog.clear()
        with caplog.at_level(logging.INFO):
            argv = ["--src", str(run["ckpts"]), "--base", str(run["base"]), "--out", str(out)]
            assert cli.main(argv + (["--use-ema-weights"] if ema else [])) == 0, caplog.text
        assert f"converting the newest complete checkpoint of 2: {run['ckpts'] / 'global_step_1760'}" in caplog.text
        assert _same_weights(out, run["1760"])
        assert not _same_weights(out, run["880"])


def test_a_directory_without_a_complete_checkpoint_is_refused(tmp_path, caplog) -> None:
    from rlinf_cosmos3.checkpoint.export import ConversionError, export_diffusers
    from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir

    base = write_model_dir(tmp_path / "base", preset="tiny", seed=0)
    empty = tmp_path / "checkpoints"
    empty.mkdir()
    with pytest.raises(ConversionError, match=r"is not a global_step_<N> directory, nor a directory holding a "
                                              r"complete one; pass a complete checkpoint directory"):
        export_diffusers(empty, base, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_learning_proof_script_converts_the_newest_step(tmp_path) -> None:
    work = tmp_path / "lp"
    run = _write_run(work, "small")
    layout = work / "sft" / "libero_sft_cosmos3_small"
    layout.mkdir(parents=True)
    run["ckpts"].rename(layout / "checkpoints")
    run["base"].rename(work / "cosmos3_small")
    env = {k: v for k, v in os.environ.items() if k != "RLINF_DEVICE_PYTHON"}
    done = subprocess.run(["bash", str(REPO / "benchmarks/gpu/learning_proof.sh"), str(work), "convert"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "global_step_1760" in done.stdout + done.stderr
    assert _same_weights(work / "cosmos3_small_sft", run["1760"], torch.bfloat16)
    assert not _same_weights(work / "cosmos3_small_sft", run["880"], torch.bfloat16)
    assert (work / "phase_times.txt").read_text().startswith("convert ")

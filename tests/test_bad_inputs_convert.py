"""Bad inputs to the checkpoint converter: refused with the input named and the fix, nothing written.

Real checkpoints (``save_checkpoint`` of real diffusers transformers: the tiny preset, a one-layer tiny,
the wider ``small`` preset), real base directories, and the converter's command line in-process; the
only faults injected are a full disk (the free-space probe, or a write that fails with ENOSPC). The
table in docs/reliability.md names these tests.
"""

from __future__ import annotations

import errno
import importlib.util
import logging
import shutil
from pathlib import Path

import pytest
from process_checks import nothing_left_running

from rlinf_cosmos3.checkpoint.export import ConversionError, export_diffusers

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _nothing_left_running():
    with nothing_left_running():
        yield


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    from diffusers import Cosmos3OmniTransformer

    from rlinf_cosmos3.checkpoint import TrainerState, save_checkpoint
    from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir

    root = tmp_path_factory.mktemp("bad_convert")
    out = {"root": root, "tiny": write_model_dir(root / "tiny", preset="tiny", seed=0),
           "one_layer": write_model_dir(root / "one_layer", preset="tiny", seed=0, num_layers=1),
           "small": write_model_dir(root / "small", preset="small", seed=0)}
    for name in ("tiny", "one_layer", "small"):
        transformer = Cosmos3OmniTransformer.from_pretrained(out[name] / "transformer")
        out[f"{name}_step"] = save_checkpoint(root / f"ckpts_{name}", transformer, None, TrainerState(global_step=2))
    return out


def _weights(step: Path) -> Path:
    return step / "actor" / "model_state_dict" / "full_weights.pt"


def test_the_inputs_convert(models, tmp_path) -> None:
    assert (export_diffusers(models["tiny_step"], models["tiny"], tmp_path / "out") / "transformer").is_dir()


def test_a_src_that_is_not_a_checkpoint_is_refused(models, tmp_path) -> None:
    text = tmp_path / "notes.pt"
    text.write_text("not a checkpoint")
    incomplete = tmp_path / "global_step_2"
    shutil.copytree(models["tiny_step"], incomplete)
    (incomplete / "COMPLETE").unlink()
    interrupted = tmp_path / "global_step_4.tmp-0a1b2c3d"
    shutil.copytree(incomplete, interrupted)
    cases = [
        (tmp_path / "missing.pt", FileNotFoundError, r"--src '.*missing\.pt' does not exist"),
        (text, ConversionError, r"is not a weights file written by an SFT run \(torch\.load: "),
        (models["tiny"], ConversionError, r"is not a global_step_<N> directory"),
        (interrupted, ConversionError, r"is not a global_step_<N> directory"),
        (incomplete, ConversionError, r"is an incomplete checkpoint \(no COMPLETE marker"),
    ]
    for src, error, text_ in cases:
        with pytest.raises(error, match=text_) as err:
            export_diffusers(src, models["tiny"], tmp_path / "out")
        assert "global_step_<N>" in str(err.value), str(err.value)
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("other", "text"), [
    ("small_step", r"size mismatch for .*copying a param with shape"),
    ("one_layer_step", r"missing \['layers\.1\."),
])
def test_a_checkpoint_of_another_model_is_refused(models, tmp_path, other, text) -> None:
    with pytest.raises(ConversionError, match=r"is of another model than the base .*" + text) as err:
        export_diffusers(_weights(models[other]), models["tiny"], tmp_path / "out")
    assert "actor.model.model_path" in str(err.value)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))


@pytest.mark.parametrize("part", ["transformer", "text_tokenizer", "model_index.json"])
def test_a_base_without_a_component_is_refused(models, tmp_path, part) -> None:
    base = tmp_path / "base"
    shutil.copytree(models["tiny"], base)
    (shutil.rmtree if (base / part).is_dir() else Path.unlink)(base / part)
    with pytest.raises(FileNotFoundError, match=f"base '{base}' is not a .*diffusers.*{part}") as err:
        export_diffusers(models["tiny_step"], base, tmp_path / "out")
    assert "actor.model.model_path" in str(err.value)
    assert not (tmp_path / "out").exists()


def test_the_command_line_reports_bad_inputs_without_a_traceback(models, tmp_path, caplog) -> None:
    spec = importlib.util.spec_from_file_location("convert_checkpoint", REPO / "toolkits/cosmos3/convert_checkpoint.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    runs = [
        (["--src", str(models["tiny"]), "--base", str(models["tiny"])], "is not a global_step_<N> directory"),
        (["--src", str(_weights(models["small_step"])), "--base", str(models["tiny"])], "is of another model"),
        (["--src", str(_weights(models["tiny_step"])), "--base", str(models["tiny"]), "--use-ema-weights"],
         "--use-ema-weights: no full_weights_ema.pt"),
    ]
    for argv, text in runs:
        caplog.clear()
        with caplog.at_level(logging.INFO):
            assert cli.main([*argv, "--out", str(tmp_path / "out")]) == 1
        assert "conversion failed: " in caplog.text and text in caplog.text, caplog.text
        assert not (tmp_path / "out").exists()
    taken = tmp_path / "taken"  # another model already there, no --overwrite: kept as it is
    taken.mkdir()
    (taken / "model_index.json").write_text("{}")
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert cli.main(["--src", str(models["tiny_step"]), "--base", str(models["tiny"]), "--out", str(taken)]) == 1
    assert f"'{taken}' exists; pass overwrite=True (--overwrite) to replace it" in caplog.text
    assert [p.name for p in taken.iterdir()] == ["model_index.json"]


# ----------------------------------------------------------------------------- a full disk
def test_a_disk_without_room_for_the_model_is_refused_before_writing(models, tmp_path, monkeypatch) -> None:
    from rlinf_cosmos3.checkpoint import disk

    monkeypatch.setattr(disk, "free_bytes", lambda path: 4096)  # the fault: a nearly full filesystem
    with pytest.raises(ConversionError, match=r"--out: not enough disk space in .* for the converted model") as err:
        export_diffusers(models["tiny_step"], models["tiny"], tmp_path / "out")
    assert "4,096 bytes" in str(err.value) and "pass an --out on one with room" in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_a_disk_that_fills_up_while_writing_leaves_the_old_model(models, tmp_path, monkeypatch) -> None:
    from diffusers import Cosmos3OmniTransformer

    out = export_diffusers(models["tiny_step"], models["tiny"], tmp_path / "out")
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def full(self, save_directory, **kwargs) -> None:  # the fault: the weights file hits ENOSPC halfway
        Path(save_directory).mkdir(parents=True, exist_ok=True)
        (Path(save_directory) / "diffusion_pytorch_model.safetensors").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Cosmos3OmniTransformer, "save_pretrained", full)
    with pytest.raises(ConversionError, match=r"--out: the filesystem of .* filled up while writing") as err:
        export_diffusers(models["tiny_step"], models["tiny"], out, overwrite=True)
    assert f"'{out}' is unchanged" in str(err.value) and "Fix: free space" in str(err.value)
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary copy left

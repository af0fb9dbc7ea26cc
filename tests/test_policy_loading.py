"""Loading a diffusers Cosmos3 directory: meta build + streamed load equals diffusers' from_pretrained.

Single process here; tests/test_parallelize.py does the same into an FSDP2-sharded model on 2 ranks.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from diffusers import Cosmos3OmniTransformer

from rlinf_cosmos3.models.cosmos3 import loading
from rlinf_cosmos3.models.cosmos3.policy import Cosmos3Policy
from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("cosmos3") / "tiny", preset="tiny", seed=0)


def _copy_with_transformer(src: Path, dst: Path, transformer: Cosmos3OmniTransformer, **save_kwargs) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(loading.TRANSFORMER_DIR))
    transformer.save_pretrained(dst / loading.TRANSFORMER_DIR, **save_kwargs)
    return dst


def _assert_same_state(got: torch.nn.Module, expected: torch.nn.Module) -> None:
    got_sd, expected_sd = got.state_dict(), expected.state_dict()
    assert got_sd.keys() == expected_sd.keys()
    for name, tensor in expected_sd.items():
        assert got_sd[name].dtype == tensor.dtype, name
        assert torch.equal(got_sd[name], tensor), name
    for (name, buf), (_, ref) in zip(got.named_buffers(), expected.named_buffers(), strict=True):
        assert torch.equal(buf, ref), name  # incl. the non-persistent rotary inv_freq, in no checkpoint


def test_meta_build_holds_no_weights(tiny_dir: Path) -> None:
    model = loading.build_transformer_on_meta(tiny_dir)
    assert all(p.is_meta for p in model.parameters())
    assert not any(b.is_meta for b in model.buffers())
    reference = loading.load_transformer(tiny_dir)
    assert torch.equal(model.rotary_emb.inv_freq, reference.rotary_emb.inv_freq)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in reference.parameters())


def test_meta_build_then_load_equals_from_pretrained(tiny_dir: Path) -> None:
    model = loading.build_transformer_on_meta(tiny_dir)
    loading.load_transformer_weights(model, tiny_dir, device="cpu")
    _assert_same_state(model, loading.load_transformer(tiny_dir))


def test_sharded_checkpoint_streams_file_by_file(tiny_dir: Path, tmp_path: Path) -> None:
    reference = loading.load_transformer(tiny_dir)
    sharded = _copy_with_transformer(tiny_dir, tmp_path / "sharded", reference, max_shard_size="300KB")
    files = loading.transformer_weight_files(sharded)
    assert len(files) > 2 and (sharded / loading.TRANSFORMER_DIR / loading.WEIGHTS_INDEX_NAME).is_file()
    assert sum(len(part) for part in loading.iter_weight_files(files)) == len(reference.state_dict())
    model = loading.build_transformer_on_meta(sharded)
    loading.load_transformer_weights(model, sharded)
    _assert_same_state(model, reference)


def test_bf16_files_load_into_fp32_master_weights(tiny_dir: Path, tmp_path: Path) -> None:
    bf16 = loading.load_transformer(tiny_dir, dtype=torch.bfloat16)
    bf16_dir = _copy_with_transformer(tiny_dir, tmp_path / "bf16", bf16)
    model = loading.build_transformer_on_meta(bf16_dir)
    loading.load_transformer_weights(model, bf16_dir)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    _assert_same_state(model, loading.load_transformer(bf16_dir, dtype=torch.float32))


def test_mismatched_checkpoint_is_an_error(tiny_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "three_layers"
    shutil.copytree(tiny_dir, other)
    config_path = other / loading.TRANSFORMER_DIR / "config.json"
    config = json.loads(config_path.read_text())
    config["num_hidden_layers"] = 3
    config_path.write_text(json.dumps(config))
    model = loading.build_transformer_on_meta(other)
    with pytest.raises(KeyError, match=r"missing \['layers\.2\."):
        loading.load_transformer_weights(model, other)


def test_incomplete_directory_names_what_is_missing(tiny_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_dir, broken, ignore=shutil.ignore_patterns(loading.VAE_DIR))
    with pytest.raises(FileNotFoundError, match=r"missing \['vae'\]"):
        loading.load_vae(broken)
    (broken / loading.VAE_DIR).mkdir()
    shutil.rmtree(broken / loading.TRANSFORMER_DIR)
    (broken / loading.TRANSFORMER_DIR).mkdir()
    with pytest.raises(FileNotFoundError, match="no transformer weights"):
        loading.transformer_weight_files(broken)


def test_policy_from_a_meta_transformer(tiny_dir: Path) -> None:
    """The load_to_device=false path of the policy: VAE frozen and real, transformer filled afterwards."""
    policy = Cosmos3Policy.from_pretrained(tiny_dir, transformer_on_meta=True)
    assert all(p.is_meta for p in policy.transformer.parameters())
    assert all(not p.is_meta and not p.requires_grad for p in policy.vae.parameters())
    assert not policy.vae.training and policy.device == torch.device("cpu")
    loading.load_transformer_weights(policy.transformer, tiny_dir)
    _assert_same_state(policy.transformer, loading.load_transformer(tiny_dir))
    assert policy.pipeline.transformer is policy.transformer
    assert policy.compute_dtype == torch.float32
    policy.train()
    assert policy.transformer.training and not policy.vae.training

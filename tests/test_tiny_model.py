"""The random Cosmos3 directories load in diffusers and answer policy calls for LIBERO.

Everything here runs the real diffusers 0.42.1 pipeline on a real (tiny, random) model on CPU.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import AutoencoderKLWan, Cosmos3OmniPipeline, Cosmos3OmniTransformer, UniPCMultistepScheduler
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import _EMBODIMENT_TO_DOMAIN_ID, CosmosActionCondition
from transformers import PreTrainedTokenizerFast

from rlinf_cosmos3.models.cosmos3 import (
    ACTION_HORIZON,
    LIBERO_DOMAIN_ID,
    LIBERO_DOMAIN_NAME,
    LIBERO_RAW_ACTION_DIM,
    get_action_domain,
)
from rlinf_cosmos3.models.cosmos3.action_condition import RegisteredActionCondition, policy_condition
from rlinf_cosmos3.models.cosmos3.tiny import (
    NANO_NUM_PARAMETERS,
    PRESETS,
    SPECIAL_TOKENS,
    TOKENIZER_VOCAB_SIZE,
    count_parameters,
    random_pipeline,
    random_transformer,
    write_model_dir,
    write_random_weights,
)
from rlinf_cosmos3.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "toolkits" / "cosmos3" / "make_tiny_model.py"
PROMPT = "pick up the black bowl and place it on the plate"


def _observation(seed: int = 0) -> np.ndarray:
    """A LIBERO-shaped policy input: two 256x256 views side by side."""
    return np.random.default_rng(seed).integers(0, 256, size=(256, 512, 3), dtype=np.uint8)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("cosmos3") / "tiny", preset="tiny", seed=0)


@pytest.fixture(scope="module")
def pipe(tiny_dir: Path) -> Cosmos3OmniPipeline:
    """Loaded as served: DiT and VAE in bf16 (diffusers keeps ``time_embedder`` in fp32)."""
    pipeline = Cosmos3OmniPipeline.from_pretrained(tiny_dir, enable_safety_checker=False, dtype=torch.bfloat16)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def _policy(pipe: Cosmos3OmniPipeline, image: np.ndarray, seed: int, steps: int = 2):
    return pipe(
        prompt=PROMPT,
        action=policy_condition(image),
        num_inference_steps=steps,
        guidance_scale=1.0,
        fps=20,
        generator=torch.Generator().manual_seed(seed),
        output_type="latent",
    )


# ----------------------------------------------------------------------------- the domain registry


def test_libero_constants() -> None:
    assert (LIBERO_DOMAIN_NAME, LIBERO_DOMAIN_ID, LIBERO_RAW_ACTION_DIM, ACTION_HORIZON) == ("libero", 5, 10, 16)
    domain = get_action_domain("libero")
    assert (domain.domain_id, domain.raw_action_dim) == (5, 10)
    # Our registry must agree with the id diffusers uses to pick the action head.
    assert _EMBODIMENT_TO_DOMAIN_ID[LIBERO_DOMAIN_NAME] == LIBERO_DOMAIN_ID
    with pytest.raises(KeyError, match="domains.py"):
        get_action_domain("not_a_robot")


def test_condition_carries_registered_width() -> None:
    image = _observation()
    # Why the subclass exists: diffusers' own condition has no width for libero.
    with pytest.raises(ValueError, match="no canonical action"):
        CosmosActionCondition(mode="policy", chunk_size=16, domain_name="libero", image=image)
    condition = policy_condition(image)
    assert isinstance(condition, CosmosActionCondition)
    assert (condition.raw_action_dim, condition.chunk_size, condition.domain_name) == (10, 16, "libero")

    with pytest.raises(ValueError, match="exactly one"):
        RegisteredActionCondition(mode="policy", chunk_size=16, domain_name="libero")
    with pytest.raises(ValueError, match="resolution_tier"):
        policy_condition(image, resolution_tier=300)
    with pytest.raises(ValueError, match="width 7"):
        RegisteredActionCondition(
            mode="forward_dynamics", chunk_size=16, domain_name="libero", image=image, raw_actions=torch.zeros(16, 7)
        )


# ----------------------------------------------------------------------------- the directory


def test_directory_layout_and_configs(tiny_dir: Path) -> None:
    index = json.loads((tiny_dir / "model_index.json").read_text())
    assert index["_class_name"] == "Cosmos3OmniPipeline"
    assert index["enable_safety_checker"] is False
    assert index["transformer"] == ["diffusers", "Cosmos3OmniTransformer"]
    assert index["vae"] == ["diffusers", "AutoencoderKLWan"]
    assert "sound_tokenizer" not in index and "safety_checker" not in index
    for weights in ("transformer", "vae"):
        assert (tiny_dir / weights / "diffusion_pytorch_model.safetensors").is_file()
    assert (tiny_dir / "text_tokenizer" / "tokenizer.json").is_file()
    size_mb = sum(f.stat().st_size for f in tiny_dir.rglob("*") if f.is_file()) / 2**20
    assert 10 < size_mb < 20, size_mb
    assert not list(tiny_dir.parent.glob(".tiny.*")), "staging directory left behind"

    tcfg = Cosmos3OmniTransformer.load_config(tiny_dir / "transformer")
    expected = PRESETS["tiny"].transformer
    for key in ("head_dim", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads"):
        assert tcfg[key] == expected[key]
    assert tcfg["num_hidden_layers"] == 2 and tcfg["action_gen"] is True and tcfg["action_dim"] == 64
    assert sum(tcfg["rope_axes_dim"]) == tcfg["head_dim"] // 2
    vcfg = AutoencoderKLWan.load_config(tiny_dir / "vae")
    assert tcfg["latent_channel"] == vcfg["z_dim"] == 48
    assert tcfg["patch_latent_dim"] == tcfg["latent_patch_size"] ** 2 * tcfg["latent_channel"]
    assert (vcfg["base_dim"], vcfg["decoder_base_dim"], vcfg["num_res_blocks"], vcfg["is_residual"]) == (16, 16, 1, True)
    assert (vcfg["scale_factor_spatial"], vcfg["scale_factor_temporal"], vcfg["patch_size"]) == (16, 4, 2)
    assert vcfg["latents_mean"] == [0.0] * 48 and vcfg["latents_std"] == [1.0] * 48
    scfg = UniPCMultistepScheduler.load_config(tiny_dir / "scheduler")
    assert scfg["_class_name"] == "UniPCMultistepScheduler"
    assert (scfg["prediction_type"], scfg["use_flow_sigmas"], scfg["flow_shift"]) == ("flow_prediction", True, 5.0)


def test_tokenizer_is_qwen_style_chatml(tiny_dir: Path) -> None:
    tok = PreTrainedTokenizerFast.from_pretrained(tiny_dir / "text_tokenizer")
    assert len(tok) == TOKENIZER_VOCAB_SIZE
    assert len(tok) <= Cosmos3OmniTransformer.load_config(tiny_dir / "transformer")["vocab_size"]
    assert (tok.eos_token, tok.pad_token) == ("<|im_end|>", "<|endoftext|>")
    for special in SPECIAL_TOKENS:
        assert tok.convert_tokens_to_ids(special) != tok.unk_token_id
        assert tok.encode(special) == [tok.convert_tokens_to_ids(special)], special
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    # Byte-level BPE: any text round-trips, including bytes never seen in training.
    for sample in (PROMPT, '{"fps": 20.0}', "Größe ✓ 机器人"):
        assert tok.decode(tok.encode(sample)) == sample


def test_same_seed_same_files_other_seed_other_weights(tiny_dir: Path, tmp_path: Path) -> None:
    """The command line reproduces the library's directory byte for byte; a new seed changes weights."""
    same = tmp_path / "same"
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(same), "--seed", "0"], check=True, timeout=300)
    for rel in (
        "transformer/diffusion_pytorch_model.safetensors",
        "vae/diffusion_pytorch_model.safetensors",
        "text_tokenizer/tokenizer.json",
        "model_index.json",
    ):
        assert _digest(same / rel) == _digest(tiny_dir / rel), rel
    other = write_model_dir(tmp_path / "other", seed=1)
    weights = "transformer/diffusion_pytorch_model.safetensors"
    assert _digest(other / weights) != _digest(tiny_dir / weights)
    with pytest.raises(FileExistsError):
        write_model_dir(other, seed=1)


# ----------------------------------------------------------------------------- the pipeline


def test_policy_returns_libero_action_chunk(pipe: Cosmos3OmniPipeline) -> None:
    out = _policy(pipe, _observation(), seed=0)
    action = out.action[0]
    assert action.shape == (ACTION_HORIZON, LIBERO_RAW_ACTION_DIM)
    assert torch.isfinite(action).all()
    assert action.abs().max() > 0
    # 17 frames -> 5 latent frames; the 2:1 input fills a 320x192 canvas as 320x160 content = 20x10 latents.
    assert tuple(out.video.shape) == (1, 48, 5, 10, 20)


def test_policy_is_deterministic_for_a_seed(pipe: Cosmos3OmniPipeline) -> None:
    image = _observation()
    first = _policy(pipe, image, seed=3).action[0]
    again = _policy(pipe, image, seed=3).action[0]
    other_seed = _policy(pipe, image, seed=4).action[0]
    other_image = _policy(pipe, _observation(1), seed=3).action[0]
    assert torch.equal(first, again)
    assert not torch.allclose(first, other_seed)
    assert not torch.allclose(first, other_image)


def test_loads_in_saved_fp32(tiny_dir: Path, pipe: Cosmos3OmniPipeline) -> None:
    """Without a dtype the saved fp32 weights load as they are, and policy mode works there too."""
    assert pipe.transformer.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    assert pipe.transformer.time_embedder.linear_1.weight.dtype == torch.float32
    pipeline = Cosmos3OmniPipeline.from_pretrained(tiny_dir, enable_safety_checker=False)
    pipeline.set_progress_bar_config(disable=True)
    assert pipeline.transformer.dtype == torch.float32
    action = _policy(pipeline, _observation(), seed=0).action[0]
    assert action.shape == (16, 10) and torch.isfinite(action).all()


def test_materialised_weights_equal_saved_weights(tiny_dir: Path, tmp_path: Path) -> None:
    """The GPU path for Nano, run on CPU with the tiny shape: building from configs and saving give
    the same weights as ``random_pipeline`` builds in memory for that seed."""
    model_dir = write_model_dir(tmp_path / "tiny", seed=0)
    write_random_weights(model_dir, device="cpu", dtype=torch.float32, seed=5)
    loaded = Cosmos3OmniPipeline.from_pretrained(model_dir, enable_safety_checker=False)
    in_memory = random_pipeline(model_dir, device="cpu", dtype=torch.float32, seed=5)
    for component in ("transformer", "vae"):
        expected = getattr(in_memory, component).state_dict()
        got = getattr(loaded, component).state_dict()
        assert got.keys() == expected.keys()
        for name, tensor in expected.items():
            assert torch.equal(tensor, got[name]), f"{component}.{name}"
    seed0 = Cosmos3OmniTransformer.from_pretrained(tiny_dir / "transformer")
    assert not torch.equal(seed0.proj_in.weight, in_memory.transformer.proj_in.weight)


# ----------------------------------------------------------------------------- the Nano preset


def test_nano_instantiates_on_meta_with_real_size() -> None:
    model = random_transformer(PRESETS["nano"].transformer, device="meta")
    assert count_parameters(model) == NANO_NUM_PARAMETERS
    assert all(p.is_meta for p in model.parameters())
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (36, 4096, 32, 8)
    assert (cfg.head_dim, cfg.intermediate_size, cfg.vocab_size, cfg.latent_channel) == (128, 12288, 151936, 48)
    assert list(cfg.rope_axes_dim) == [24, 20, 20]
    assert (cfg.num_embodiment_domains, cfg.action_dim) == (32, 64)


def test_nano_directory_has_configs_not_weights(tmp_path: Path) -> None:
    nano = write_model_dir(tmp_path / "nano", preset="nano")
    assert not list(nano.rglob("*.safetensors"))
    cfg = Cosmos3OmniTransformer.load_config(nano / "transformer")
    with torch.device("meta"):
        model = Cosmos3OmniTransformer.from_config(cfg)
    assert count_parameters(model) == NANO_NUM_PARAMETERS
    assert AutoencoderKLWan.load_config(nano / "vae")["base_dim"] == 160
    assert json.loads((nano / "model_index.json").read_text())["_class_name"] == "Cosmos3OmniPipeline"


def test_fewer_layers_keep_the_width(tmp_path: Path) -> None:
    """``--num-layers`` cuts a preset's depth (a Nano-width model that trains on one GPU), nothing else."""
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "nano8"), "--preset", "nano",
                    "--num-layers", "8"], check=True, timeout=300)
    cfg = Cosmos3OmniTransformer.load_config(tmp_path / "nano8" / "transformer")
    full = dict(PRESETS["nano"].transformer)
    assert cfg["num_hidden_layers"] == 8
    assert all(cfg[k] == v for k, v in full.items() if k != "num_hidden_layers")
    with torch.device("meta"):
        model = Cosmos3OmniTransformer.from_config(cfg)
    per_layer = sum(p.numel() for p in model.layers[0].parameters())
    assert count_parameters(model) == NANO_NUM_PARAMETERS - 28 * per_layer
    with pytest.raises(ValueError, match="num_layers must be in 1..36"):
        write_model_dir(tmp_path / "bad", preset="nano", num_layers=37)

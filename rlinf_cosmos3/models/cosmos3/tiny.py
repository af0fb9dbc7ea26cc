"""Random Cosmos3 diffusers directories: a tiny one for CPU tests, the real Nano shape for GPU benchmarks.

Tests need a model that diffusers' ``Cosmos3OmniPipeline`` and the SGLang server both load, without
downloading the 15B checkpoint. ``write_model_dir`` writes the full diffusers layout
(``model_index.json``, ``transformer/``, ``vae/``, ``text_tokenizer/``, ``scheduler/``). The
``tiny`` preset (~14 MB) carries random weights; the ``nano`` preset is the real Cosmos3-Nano
architecture (15.17B parameters) and writes configs only, because its weights must never be built
in host RAM here: ``random_transformer``/``random_pipeline``/``write_random_weights`` materialise
them directly on a GPU.

Random weights follow the modules' own initialisers, seeded. One exception, ours: the per-domain
action heads (``DomainAwareLinear``) hold their weights in ``nn.Embedding`` tables, which
initialise to N(0, 1); we rescale them to N(0, 1/fan_in) with zero bias, like a linear layer, so
random actions stay O(1) instead of O(sqrt(hidden_size)).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from diffusers import AutoencoderKLWan, Cosmos3OmniPipeline, Cosmos3OmniTransformer
    from transformers import PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

PIPELINE_CLASS = "Cosmos3OmniPipeline"
TOKENIZER_VOCAB_SIZE = 512

# Qwen2-style special tokens the pipeline and SGLang look up by name.
PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, "<|im_start|>", EOS_TOKEN, "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>")

# ChatML, as Qwen2 uses it. Both diffusers and SGLang call apply_chat_template with
# add_generation_prompt=True; content is a plain string in both.
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

SCHEDULER_CONFIG: dict[str, Any] = {"prediction_type": "flow_prediction", "use_flow_sigmas": True, "flow_shift": 5.0}

_VAE_COMMON: dict[str, Any] = {
    "z_dim": 48,
    "dim_mult": [1, 2, 4, 4],
    "is_residual": True,
    "in_channels": 12,
    "out_channels": 12,
    "patch_size": 2,
    "scale_factor_spatial": 16,
    "scale_factor_temporal": 4,
    # Random weights have no latent statistics of their own: identity normalisation.
    "latents_mean": [0.0] * 48,
    "latents_std": [1.0] * 48,
}


@dataclass(frozen=True)
class Preset:
    """Constructor arguments of the random components, and whether weights are written on CPU."""

    transformer: dict[str, Any]
    vae: dict[str, Any]
    write_weights: bool
    description: str = ""


PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        transformer={
            "head_dim": 16,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_hidden_layers": 2,
            "latent_channel": 48,  # = VAE z_dim
            "latent_patch_size": 2,
            "patch_latent_dim": 192,  # = patch^2 * latent_channel
            "rope_scaling": {"mrope_section": [4, 2, 2], "rope_type": "default"},  # sums to head_dim / 2
            "action_gen": True,
            "action_dim": 64,
            "num_embodiment_domains": 32,
            "vocab_size": TOKENIZER_VOCAB_SIZE,
        },
        vae={**_VAE_COMMON, "base_dim": 16, "decoder_base_dim": 16, "num_res_blocks": 1},
        write_weights=True,
        description="2-layer, hidden-64 transformer and a narrow Wan2.2-layout VAE, random weights",
    ),
    "small": Preset(
        transformer={
            "head_dim": 64,
            "hidden_size": 256,
            "intermediate_size": 768,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_hidden_layers": 4,
            "latent_channel": 48,
            "latent_patch_size": 2,
            "patch_latent_dim": 192,
            "rope_scaling": {"mrope_section": [12, 10, 10], "rope_type": "default"},  # Nano's split, halved
            "action_gen": True,
            "action_dim": 64,
            "num_embodiment_domains": 32,
            "vocab_size": TOKENIZER_VOCAB_SIZE,
        },
        vae={**_VAE_COMMON, "base_dim": 16, "decoder_base_dim": 16, "num_res_blocks": 1},
        write_weights=True,
        description="4-layer, hidden-256 transformer (7.85M) and the tiny preset's VAE: trains from scratch "
                    "on one GPU in minutes (the learning proof)",
    ),
    "nano": Preset(
        transformer={
            "head_dim": 128,
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "num_hidden_layers": 36,
            "latent_channel": 48,
            "latent_patch_size": 2,
            "patch_latent_dim": 192,
            "rope_scaling": {"mrope_section": [24, 20, 20], "rope_type": "default"},
            "action_gen": True,
            "action_dim": 64,
            "num_embodiment_domains": 32,
            "vocab_size": 151936,
        },
        # The Wan2.2 (TI2V-5B) VAE architecture Cosmos3 uses (~0.7B parameters).
        vae={**_VAE_COMMON, "base_dim": 160, "decoder_base_dim": 256, "num_res_blocks": 2},
        write_weights=False,
        description="the real Cosmos3-Nano architecture (15.17B), configs only; weights are made on a GPU",
    ),
}

NANO_NUM_PARAMETERS = 15_173_136_576


def get_preset(name: str) -> Preset:
    """Preset by name, with an error that lists the choices."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


def _tokenizer_corpus() -> Iterator[str]:
    """Text the tiny BPE learns its merges from: the words the pipelines actually send it."""
    objects = ["black bowl", "plate", "ketchup", "alphabet soup", "cream cheese", "wine bottle", "mug", "book"]
    places = ["on the plate", "in the basket", "on top of the cabinet", "on the stove", "in the tray"]
    verbs = ["pick up the", "put the", "place the", "open the top drawer and put the", "push the", "turn on the"]
    for verb in verbs:
        for obj in objects:
            for place in places:
                yield f"{verb} {obj} {place}"
    yield "You are a helpful assistant who will generate videos from a give prompt."
    yield "You are a helpful assistant who will generate images from a give prompt."
    yield "This video is captured from a first-person perspective looking at the scene."
    yield "This video contains concatenated views from multiple camera perspectives."
    yield "This video is captured from a wrist-mounted camera."
    yield "The video is 3.4 seconds long and is of 5 FPS. This video is of 192x320 resolution."
    for fps in (5, 10, 20, 24):
        yield json.dumps(
            {
                "cinematography": {"framing": "first-person perspective"},
                "actions": [{"time": "0:00-0:03", "description": "pick up the mug."}],
                "duration": "3s",
                "fps": float(fps),
                "resolution": {"H": 192, "W": 320},
                "aspect_ratio": "16,9",
            }
        )
    yield "system user assistant 0123456789"


def build_tokenizer(vocab_size: int = TOKENIZER_VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE locally (deterministic) and wrap it with Qwen-style specials and ChatML."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_tokenizer_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (EOS_TOKEN, PAD_TOKEN)],
        chat_template=CHATML_TEMPLATE,
        model_max_length=32768,
    )


# --------------------------------------------------------------------------------------------
# Random modules
# --------------------------------------------------------------------------------------------


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _rescale_action_heads(transformer: Cosmos3OmniTransformer, generator: torch.Generator | None) -> None:
    """Give the per-domain action tables a linear layer's scale (see the module docstring)."""
    for head in (getattr(transformer, "action_proj_in", None), getattr(transformer, "action_proj_out", None)):
        if head is None:
            continue
        std = head.input_size**-0.5
        with torch.no_grad():
            weight = head.fc.weight
            noise = torch.randn(weight.shape, generator=generator, device=weight.device, dtype=torch.float32)
            weight.copy_(noise * std)
            head.bias.weight.zero_()


def random_transformer(
    config: dict[str, Any],
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Cosmos3OmniTransformer:
    """A Cosmos3OmniTransformer with seeded random weights, built directly on ``device``.

    ``device="meta"`` allocates nothing (shape/parameter checks); ``device="cuda"`` with bf16 builds
    Nano without touching host RAM. Modules diffusers keeps in fp32 (``time_embedder``) stay fp32,
    as ``from_pretrained(torch_dtype=bf16)`` would leave them.
    """
    from diffusers import Cosmos3OmniTransformer

    device = torch.device(device)
    torch.manual_seed(seed)
    with torch.device(device), _default_dtype(dtype):
        model = Cosmos3OmniTransformer.from_config(config)
    if device.type != "meta":
        generator = torch.Generator(device=device).manual_seed(seed + 1)
        _rescale_action_heads(model, generator)
        for name in model._keep_in_fp32_modules or []:
            getattr(model, name).float()
    return model.eval()


def random_vae(
    config: dict[str, Any],
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> AutoencoderKLWan:
    """An AutoencoderKLWan with seeded random weights, built directly on ``device``."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    with torch.device(torch.device(device)), _default_dtype(dtype):
        vae = AutoencoderKLWan.from_config(config)
    return vae.eval()


def count_parameters(module: torch.nn.Module) -> int:
    """Number of parameters (works on the meta device)."""
    return sum(p.numel() for p in module.parameters())


# --------------------------------------------------------------------------------------------
# Directory writing
# --------------------------------------------------------------------------------------------


def model_index(diffusers_version: str) -> dict[str, Any]:
    """``model_index.json``. The optional sound tokenizer and safety checker are left out, not null:
    SGLang loads every component the index names."""
    return {
        "_class_name": PIPELINE_CLASS,
        "_diffusers_version": diffusers_version,
        "default_use_system_prompt": True,
        "enable_safety_checker": False,
        "use_native_flow_schedule": False,
        "scheduler": ["diffusers", "UniPCMultistepScheduler"],
        "text_tokenizer": ["transformers", "PreTrainedTokenizerFast"],
        "transformer": ["diffusers", "Cosmos3OmniTransformer"],
        "vae": ["diffusers", "AutoencoderKLWan"],
    }


def write_model_dir(out: str | Path, preset: str = "tiny", seed: int = 0, overwrite: bool = False,
                    num_layers: int | None = None) -> Path:
    """Write a complete random Cosmos3 diffusers directory; complete or absent (staged, then renamed).

    ``num_layers`` keeps only that many decoder layers (the preset's width, fewer layers: a
    Nano-width model small enough to train on one GPU)."""
    import diffusers
    from diffusers import UniPCMultistepScheduler

    spec = get_preset(preset)
    if num_layers is not None:
        layers = spec.transformer["num_hidden_layers"]
        if not 1 <= num_layers <= layers:
            raise ValueError(f"num_layers must be in 1..{layers} for the {preset} preset, got {num_layers}")
        spec = dataclasses.replace(spec, transformer={**spec.transformer, "num_hidden_layers": num_layers})
    out = Path(out)
    if out.exists():
        if not overwrite:
            raise FileExistsError(f"{out} exists; pass overwrite=True (--overwrite) to replace it")
        if not (out / "model_index.json").is_file():
            raise FileExistsError(f"{out} exists and is not a model directory; refusing to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        build_tokenizer().save_pretrained(stage / "text_tokenizer")
        UniPCMultistepScheduler(**SCHEDULER_CONFIG).save_pretrained(stage / "scheduler")
        if spec.write_weights:
            random_transformer(spec.transformer, seed=seed).save_pretrained(stage / "transformer")
            random_vae(spec.vae, seed=seed).save_pretrained(stage / "vae")
        else:
            random_transformer(spec.transformer, device="meta").save_config(stage / "transformer")
            random_vae(spec.vae, device="meta").save_config(stage / "vae")
        (stage / "model_index.json").write_text(json.dumps(model_index(diffusers.__version__), indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        stage.rename(out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    logger.info("wrote %s Cosmos3 model (%s) to %s", preset, spec.description, out)
    return out


def _read_config(model_dir: Path, component: str) -> dict[str, Any]:
    config = json.loads((model_dir / component / "config.json").read_text())
    return {k: v for k, v in config.items() if not k.startswith("_")}


def random_pipeline(
    model_dir: str | Path,
    *,
    device: str | torch.device = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    vae_dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Cosmos3OmniPipeline:
    """A ready pipeline from a directory's configs with random transformer and VAE made on ``device``.

    For benchmarking the Nano shape with diffusers: nothing is read but configs, tokenizer and scheduler.
    """
    from diffusers import Cosmos3OmniPipeline, UniPCMultistepScheduler
    from transformers import PreTrainedTokenizerFast

    model_dir = Path(model_dir)
    transformer = random_transformer(_read_config(model_dir, "transformer"), device=device, dtype=dtype, seed=seed)
    vae = random_vae(_read_config(model_dir, "vae"), device=device, dtype=vae_dtype, seed=seed)
    return Cosmos3OmniPipeline(
        transformer=transformer,
        text_tokenizer=PreTrainedTokenizerFast.from_pretrained(model_dir / "text_tokenizer"),
        vae=vae,
        scheduler=UniPCMultistepScheduler.from_pretrained(model_dir / "scheduler"),
        enable_safety_checker=False,
    )


def write_random_weights(
    model_dir: str | Path,
    *,
    device: str | torch.device = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    max_shard_size: str = "5GB",
) -> None:
    """Materialise the configured transformer and VAE on ``device`` and save their weights into the
    directory, so the SGLang server can load a Nano-shaped model (about 31 GB on disk in bf16)."""
    model_dir = Path(model_dir)
    transformer = random_transformer(_read_config(model_dir, "transformer"), device=device, dtype=dtype, seed=seed)
    transformer.save_pretrained(model_dir / "transformer", max_shard_size=max_shard_size)
    del transformer
    vae = random_vae(_read_config(model_dir, "vae"), device=device, dtype=torch.float32, seed=seed)
    vae.save_pretrained(model_dir / "vae", max_shard_size=max_shard_size)


def write_synthetic_action_stats(path: str | Path, fps: int = 20) -> Path:
    """A valid action stats file from random LIBERO-like 7-D deltas, for serving a random model
    (whose actions mean nothing anyway) through the real adapter, which requires stats."""
    import numpy as np

    from rlinf_cosmos3.actions import compute_action_stats, write_action_stats
    from rlinf_cosmos3.config.libero_suites import ACTION_DIM

    rng = np.random.default_rng(0)
    episodes = []
    for _ in range(4):
        ep = np.clip(rng.normal(0.0, 0.3, size=(64, ACTION_DIM)), -1.0, 1.0)
        ep[:, 6] = rng.integers(0, 2, size=64)  # stored gripper g in {0, 1}
        episodes.append(ep)
    return write_action_stats(compute_action_stats(episodes, metadata={"fps": fps, "synthetic": True}), Path(path))

"""Training benchmark: the SFT worker's optimizer step on the Cosmos3 transformer at Nano width, one device.

Everything the SFT worker does comes from the library, configured from the reference recipe
(``examples/sft/config/libero_sft_cosmos3.yaml`` + ``model/cosmos3.yaml``, composed with Hydra as the
launcher does, then ``load_structured(SFTConfig, ...)`` with placeholder data paths): the policy
settings, loading and FSDP2 sharding (``build_sft_policy``: one-rank mesh, bf16 compute over fp32 master
weights on GPU, the recipe's trainable selection), AdamW + schedule + EMA (``build_sft_optimization``),
and the timed step itself,
``rlinf_cosmos3.components.train_step.train_step`` (zero grads, the micro-batches through ``sft_loss``
and backward, clip, AdamW step, schedule), whose own forward/backward and optimizer times are reported.
A variant is the recipe plus Hydra overrides (recorded in the JSON). What is the benchmark's own: a
model directory of ``--layers N`` of the 36 Nano decoder layers with random weights made on the device
and saved (as ``make_tiny_model.py --materialize-on`` writes it for the launcher), loaded per variant by
the worker's own ``components.sft_trainer.build_sft_policy`` (meta build, FSDP2 sharding, weights streamed
in), a random frozen VAE for the cached latents, and synthetic samples in the reader's layout (17 frames
of two 256x256 views, 16 normalised 10-D actions, one prompt).

The micro-batches are what the worker gets with ``data.latent_cache_dir``: cached-latent batches
(``x0_vision`` in the VAE's dtype, ``vision_frame_valid``, ``actions``, ``action_is_pad``,
``frame_is_pad``, ``state``, ``prompt``, ``index``; the latents from ``processor.encode_pixels``, as
the cache is built), so the VAE is outside the step; ``--with-encode`` feeds pixel batches instead
(the step encodes them, as without a cache). The VAE encode time per sample is reported beside.
One sample is 424 tokens: text (the chat-templated policy caption, 108 with the generated directory's
tokenizer) + vision (5 latent frames x 6 x 10 patches = 300: 60 clean, 240 noisy) + 16 action tokens.
A step is ``--global-batch`` samples (``actor.global_batch_size`` on this one rank) in micro-batches of
the variant's size; packed, a micro-batch is one transformer call (up to ``max_tokens_per_pack``).

The memory model (``est GiB`` in the table; ``--layers auto`` picks the most layers whose estimate fits
``--memory-target-gib`` for every variant) is :func:`estimate_peak_bytes`; docs/benchmarks.md ("The SFT
step's memory model") explains its terms and gives its figures at Nano width, among them why
``--layers 22`` is the default. Per-layer work is identical, so time and memory scale linearly with L.

Variants (``--variants``, comma-separated, each on a freshly built model, side by side: warm-up
steps, then the median of ``--steps``): a ``+``-joined list of ``fused`` (default) / ``foreach``
(``base``), ``ac`` (activation checkpointing; not with ``compile``: the SFT config rejects that pair),
``compile`` (``compile_blocks``), ``noreshard`` (``reshard_after_forward=false``), ``prefetch<N>``
(explicit N-layer FSDP prefetch, benchmark-only), ``ema``, ``pack`` (the recipe's
``max_tokens_per_pack``, default) / ``pack<N>`` / ``nopack`` (one transformer call per sample), and
``mb<N>`` (micro-batch N; default ``--micro-batch``), e.g. ``compile+noreshard+nopack+mb4``.

FLOPs per step are counted once with ``torch.utils.flop_counter.FlopCounterMode`` on one eager
per-sample forward + backward (matmuls and SDPA, here extended to GQA and the CPU flash kernel;
causal counted as full; no elementwise, optimizer or recompute FLOPs), x samples per step: packing
attends within samples, so every variant does the same model FLOPs. MFU = FLOPs/step / step time /
the bf16 matmul rate measured in the same run (8192^3 ``torch.matmul``, median of 10). ``6NT`` beside
it: N = layers x 192.9M (one tower per token), T = tokens per step.

    # CPU smoke run (tiny preset, fp32, gloo)
    .venv/bin/python benchmarks/gpu/sft_step.py --device cpu --preset tiny --steps 2 --warmup 1 \\
        --variants base+nopack,fused+pack+mb2
    # one H200 (~5 min; --time-budget-s skips variants not started by then): 22 layers, bf16, nccl
    PYTHONUNBUFFERED=1 python3 benchmarks/gpu/sft_step.py --out $OUT/sft_step.json
    # the small recipe's step (libero_sft_cosmos3_small.yaml: every parameter trains, micro-batch 128, EMA)
    PYTHONUNBUFFERED=1 python3 benchmarks/gpu/sft_step.py --preset small --trainable all --global-batch 128 \
        --variants pack+mb128+ema --warmup 3 --steps 20 --out $OUT/sft_step_small.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import itertools
import json
import logging
import math
import os
import re
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from rlinf_cosmos3.config.sft import DEFAULT_MAX_TOKENS_PER_PACK
from rlinf_cosmos3.tracking.flops import attention_flop_formulas, measure_matmul

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the scripts' shared _common
from _common import (  # noqa: E402
    GIB,
    Budget,
    device_memory_gib,
    device_name,
    device_slug,
    library_versions,
    one_rank_process_group,
    results_path,
    write_json,
)

logger = logging.getLogger("benchmarks.sft_step")

REPO = Path(__file__).resolve().parents[2]
RECIPE_DIR = REPO / "examples" / "sft" / "config"
RECIPE = "libero_sft_cosmos3"

NANO_DEFAULT_LAYERS = 22
"""Most layers at which every default variant's estimated peak fits the memory target (docs/benchmarks.md)."""
DEFAULT_VARIANTS = (
    "compile+noreshard+nopack+mb4,compile+noreshard+pack+mb4,ac+nopack+mb32,ac+pack+mb32,nopack+mb16,pack+mb16"
)
"""Per-sample vs packed at micro-batch 4 (the fastest per-sample setting measured), 32 (the recipe's:
needs ``ac``) and 16 (last: the first the time budget drops)."""
DEFAULT_MEMORY_TARGET_GIB = 130.0
DEFAULT_TIME_BUDGET_S = 240.0

ACT_BYTES_PER_HIDDEN_TOKEN_BF16 = 57.0
"""Saved activations of one decoder layer per token per hidden unit in bf16, eager (measured on CPU
with ``saved_tensors_hooks`` at 424 tokens; storages counted once)."""
ROOT_ACT_BYTES_PER_HIDDEN_TOKEN_BF16 = 32.0
"""Rough allowance for the root's activations (embeddings, packing, final norms, heads)."""
ALLOCATOR_SLACK_BYTES = GIB
PROMPT = "put the black bowl on the plate"
"""One prompt for every sample: equal sequence lengths, so a compiled block never recompiles."""


# --------------------------------------------------------------------------------------------
# Variants: the recipe plus overrides
# --------------------------------------------------------------------------------------------

OPTIMIZERS = {"base": "foreach", "foreach": "foreach", "fused": "fused"}


@dataclass(frozen=True)
class Variant:
    """One training configuration; everything else (model, data, steps) is shared."""

    name: str
    micro_batch: int
    optimizer: str = "fused"
    activation_checkpointing: bool = False
    compile: bool = False
    reshard_after_forward: bool = True
    prefetch: int = 0
    ema: bool = False
    max_tokens_per_pack: int | None = DEFAULT_MAX_TOKENS_PER_PACK

    @property
    def features(self) -> str:
        pack = self.max_tokens_per_pack
        parts = [self.optimizer] + [
            word
            for word, on in (
                ("ac", self.activation_checkpointing),
                ("compile", self.compile),
                ("noreshard", not self.reshard_after_forward),
                (f"prefetch{self.prefetch}", self.prefetch),
                ("ema", self.ema),
            )
            if on
        ]
        parts.append("nopack" if pack is None else "pack" if pack == DEFAULT_MAX_TOKENS_PER_PACK
                     else f"pack{pack}")
        return "+".join([*parts, f"mb{self.micro_batch}"])

    def samples_per_call(self, tokens_per_sample: int) -> int:
        """How many samples one transformer call holds (``split_into_packs`` of equal lengths)."""
        if self.max_tokens_per_pack is None:
            return 1
        return max(1, min(self.micro_batch, self.max_tokens_per_pack // tokens_per_sample))

    def overrides(self, global_batch: int) -> list[str]:
        """The Hydra overrides that make the recipe this variant (``prefetch`` is no config field)."""

        def flag(value: bool) -> str:
            return str(value).lower()

        pack = self.max_tokens_per_pack
        return [
            f"++actor.micro_batch_size={self.micro_batch}",
            f"++actor.global_batch_size={global_batch}",
            f"++actor.max_tokens_per_pack={'null' if pack is None else pack}",
            f"++actor.model.activation_checkpointing={flag(self.activation_checkpointing)}",
            f"++actor.model.compile_blocks={flag(self.compile)}",
            f"++actor.model.reshard_after_forward={flag(self.reshard_after_forward)}",
            f"++actor.model.ema_enabled={flag(self.ema)}",
        ]


def parse_variant(name: str, micro_batch: int = 1) -> Variant:
    """A ``+``-joined list of variant words (module docstring); each setting may be named once."""
    settings: dict[str, tuple[str, Any]] = {}
    for token in name.split("+"):
        if token in OPTIMIZERS:
            key, value = "optimizer", OPTIMIZERS[token]
        elif token in ("ac", "compile", "ema"):
            key, value = {"ac": "activation_checkpointing"}.get(token, token), True
        elif token == "noreshard":
            key, value = "reshard_after_forward", False
        elif token == "nopack":
            key, value = "max_tokens_per_pack", None
        elif (match := re.fullmatch(r"(prefetch|pack|mb)(\d*)", token)) and (match[2] or match[1] != "mb"):
            default = {"prefetch": 2, "pack": DEFAULT_MAX_TOKENS_PER_PACK}.get(match[1], 0)
            key = {"pack": "max_tokens_per_pack", "mb": "micro_batch"}.get(match[1], match[1])
            value = int(match[2] or default)
            if value < 1:
                raise ValueError(f"variant part {token!r} of {name!r} must be >= 1")
        else:
            raise ValueError(
                f"unknown variant part {token!r} in {name!r}; use a '+'-joined list of base/foreach/fused, "
                "ac, compile, noreshard, prefetch<N>, ema, pack/pack<N>/nopack, mb<N>"
            )
        if key in settings:
            raise ValueError(f"variant {name!r} sets {key} twice ({settings[key][0]!r} and {token!r})")
        settings[key] = (token, value)
    variant = Variant(name=name, micro_batch=micro_batch)
    variant = replace(variant, **{key: value for key, (_, value) in settings.items()})
    if variant.compile and variant.activation_checkpointing:
        raise ValueError(
            f"variant {name!r}: the SFT config rejects compile_blocks with activation_checkpointing "
            "(actor.model.compile_blocks: the first backward fails on GPU); drop 'ac' or 'compile'"
        )
    return variant


def parse_variants(spec: str, micro_batch: int, global_batch: int) -> list[Variant]:
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names or len(set(names)) != len(names):
        raise ValueError(f"--variants must list distinct variants, got {spec!r}")
    variants = [parse_variant(n, micro_batch) for n in names]
    for v in variants:
        if global_batch % v.micro_batch:
            raise ValueError(
                f"--global-batch {global_batch} is not a multiple of variant {v.name!r}'s micro-batch "
                f"{v.micro_batch} (actor.global_batch_size = micro-batch x accumulation on one rank)"
            )
    return variants


def recipe_config(model_dir: Path, seed: int, trainable: str, overrides: Sequence[str] = ()) -> Any:
    """The reference recipe's ``SFTConfig`` (Hydra compose, as the launcher) with placeholder data paths."""
    from hydra import compose, initialize_config_dir

    from rlinf_cosmos3.config.base import load_structured
    from rlinf_cosmos3.config.sft import SFTConfig

    fixed = [
        f"actor.model.model_path='{model_dir}'",
        "data.dataset.root=unused-by-the-benchmark",
        "data.dataset.stats_path=unused-by-the-benchmark",
        f"++runner.seed={seed}",
    ]
    if trainable == "all":
        fixed.append("++actor.model.keys_to_select=null")
    with initialize_config_dir(config_dir=str(RECIPE_DIR), version_base=None):
        raw = compose(config_name=RECIPE, overrides=[*fixed, *overrides])
    return load_structured(SFTConfig, raw)


# --------------------------------------------------------------------------------------------
# Layout, model counts, memory model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Tokens one sample puts in front of the transformer."""

    text_tokens: int
    vision_tokens: int
    noisy_vision_tokens: int
    action_tokens: int

    @property
    def tokens_per_sample(self) -> int:
        return self.text_tokens + self.vision_tokens + self.action_tokens


@dataclass(frozen=True)
class ModelCounts:
    """Parameter counts (global, not per shard) that the memory model and 6NT need."""

    layer_params: int
    layer_trainable: int
    root_params: int
    root_trainable: int
    vae_params: int
    hidden_size: int
    config_layers: int

    def total(self, layers: int) -> int:
        return layers * self.layer_params + self.root_params

    def trainable(self, layers: int) -> int:
        return layers * self.layer_trainable + self.root_trainable


def estimate_peak_bytes(
    counts: ModelCounts, layers: int, layout: Layout, variant: Variant, compute_bytes: int, vae_bytes: int
) -> float:
    """Peak allocated bytes of a training step on one rank: resident state + gathered copies + reduce
    gradients + activations (+ recompute, foreach temporary, allocator slack).

    * resident: an fp32 copy of every parameter (4 B), fp32 gradient and two AdamW moments (12 B) of every
      trainable one, the VAE at ``vae_bytes``; ``ema``: 4 B more per trainable parameter;
    * gathered in ``compute_bytes``: the root, and two layers (``1 + prefetch`` with prefetch), or all of
      them without resharding after forward;
    * one layer's and the root's trainable gradients in ``compute_bytes`` + fp32 while they are reduced;
    * activations: every sample of a micro-batch is held until its one backward, packed or not,
      :data:`ACT_BYTES_PER_HIDDEN_TOKEN_BF16` per hidden unit, token and layer (twice that in fp32), plus
      the root's :data:`ROOT_ACT_BYTES_PER_HIDDEN_TOKEN_BF16`; with ``ac`` only each layer's input
      (``compute_bytes`` x hidden x tokens) plus one layer recomputed in backward for one transformer
      call (one sample, or the whole pack);
    * ``foreach`` AdamW's ``sqrt(v)`` temporary, 4 B per trainable parameter (fused AdamW has none).

    Its figures at Nano width are in docs/benchmarks.md ("The SFT step's memory model").
    """
    params, trainable = counts.total(layers), counts.trainable(layers)
    resident = 4 * params + 12 * trainable + vae_bytes * counts.vae_params
    resident += 4 * trainable if variant.ema else 0
    gathered_layers = layers if not variant.reshard_after_forward else 1 + max(1, variant.prefetch)
    gathered = compute_bytes * (counts.root_params + gathered_layers * counts.layer_params)
    grads = (compute_bytes + 4) * (counts.layer_trainable + counts.root_trainable)
    scale = compute_bytes / 2  # fp32 activations are twice the bf16 ones
    hs = counts.hidden_size * layout.tokens_per_sample
    full_layer = ACT_BYTES_PER_HIDDEN_TOKEN_BF16 * scale * hs
    ac = variant.activation_checkpointing
    saved = compute_bytes * hs if ac else full_layer
    recompute = full_layer * variant.samples_per_call(layout.tokens_per_sample) if ac else 0.0
    activations = variant.micro_batch * (layers * saved + ROOT_ACT_BYTES_PER_HIDDEN_TOKEN_BF16 * scale * hs)
    foreach_tmp = 4 * trainable if variant.optimizer == "foreach" else 0
    return resident + gathered + grads + activations + recompute + foreach_tmp + ALLOCATOR_SLACK_BYTES


def auto_layers(
    counts: ModelCounts, layout: Layout, variants: Sequence[Variant], target_bytes: float, compute_bytes: int,
    vae_bytes: int,
) -> int:
    """The most layers (up to the config's) whose estimated peak fits ``target_bytes`` for every variant."""
    best = 1
    for layers in range(1, counts.config_layers + 1):
        peak = max(estimate_peak_bytes(counts, layers, layout, v, compute_bytes, vae_bytes) for v in variants)
        if peak <= target_bytes:
            best = layers
    return best


# --------------------------------------------------------------------------------------------
# Device, distributed, matmul rate
# --------------------------------------------------------------------------------------------


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


# --------------------------------------------------------------------------------------------
# FLOP counting
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Set-up, data, model
# --------------------------------------------------------------------------------------------


@dataclass
class Setup:
    """Everything the variants share: the frozen parts, the samples, the settings."""

    args: argparse.Namespace
    device: torch.device
    precision: str
    model_dir: Path
    base_config: Any
    encoder: Any
    """A policy over a meta transformer: the frozen VAE/tokenizer side, for encoding."""
    pixels: list[dict[str, Any]]
    cached: list[dict[str, Any]]
    layout: Layout
    counts: ModelCounts
    layers: int = 0
    first_encode_s_per_sample: float = math.nan
    budget: Budget = field(default_factory=lambda: Budget(None))
    """The run's: ``--time-budget-s`` from the start of :func:`main`."""

    @property
    def compute_bytes(self) -> int:
        return 2 if self.precision == "bf16" else 4

    @property
    def vae_bytes(self) -> int:
        return next(self.encoder.vae.parameters()).element_size()

    def elapsed(self) -> float:
        return self.budget.elapsed()

    def config(self, variant: Variant) -> Any:
        """The variant's ``SFTConfig``: the recipe plus :meth:`Variant.overrides`."""
        args = self.args
        return recipe_config(self.model_dir, args.seed, args.trainable, variant.overrides(args.global_batch))


def synthetic_samples(n: int, cfg: Any, seed: int) -> list[dict[str, Any]]:
    """``n`` samples as ``LiberoLeRobotDataset`` yields them (random pixels and actions, no padding)."""
    from rlinf_cosmos3.config.data import image_output_name
    from rlinf_cosmos3.config.libero_suites import STATE_DIM
    from rlinf_cosmos3.models.cosmos3.domains import get_action_domain

    data, g = cfg.data.dataset, torch.Generator().manual_seed(seed)
    action_dim = get_action_domain(cfg.actor.model.domain_name).raw_action_dim
    samples = []
    for i in range(n):
        views = {
            image_output_name(key): torch.randint(
                0, 256, (data.num_frames, 3, *data.image_size), dtype=torch.uint8, generator=g
            )
            for key in data.image_keys
        }
        samples.append({
            **views,
            "frame_is_pad": torch.zeros(data.num_frames, dtype=torch.bool),
            "actions": torch.rand(data.chunk_length, action_dim, generator=g) * 2 - 1,
            "action_is_pad": torch.zeros(data.chunk_length, dtype=torch.bool),
            "state": torch.zeros(STATE_DIM),
            "prompt": PROMPT,
            "episode_index": torch.tensor(0),
            "frame_index": torch.tensor(i),
            "index": torch.tensor(i),
        })
    return samples


def cache_latents(encoder: Any, pixels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The samples as ``data.latent_cache_dir`` serves them: latents (VAE dtype) instead of pixels."""
    from rlinf_cosmos3.data.collate import collate_samples
    from rlinf_cosmos3.models.cosmos3.processor import LATENT_KEY, LATENT_VALID_KEY

    latents, valid = encoder.processor.encode_pixels(collate_samples(pixels))
    latents = latents.to(encoder.vae.dtype).cpu()  # what the worker's cache build stores
    if not bool(torch.isfinite(latents).all()):  # a random bf16 VAE may overflow; values do not change speed
        logger.warning("random VAE latents not finite; using N(0, 1) latents of the same shape")
        latents = torch.randn_like(latents)
    views = {encoder.cfg.main_image_key, encoder.cfg.wrist_image_key}
    return [
        {LATENT_KEY: latents[i], LATENT_VALID_KEY: valid[i], **{k: v for k, v in s.items() if k not in views}}
        for i, s in enumerate(pixels)
    ]


def micro_batches(setup: Setup, micro_batch: int, *, pixels: bool | None = None) -> list[dict[str, Any]]:
    """One optimizer step's micro-batches (collated as the worker's DataLoader): sample j of the step
    has dataset index j (its noise seed) and the data of distinct sample ``j mod n``."""
    from rlinf_cosmos3.data.collate import collate_samples

    pool = setup.pixels if (setup.args.with_encode if pixels is None else pixels) else setup.cached
    starts = range(0, setup.args.global_batch, micro_batch)
    return [
        collate_samples([{**pool[j % len(pool)], "index": torch.tensor(j)} for j in range(a, a + micro_batch)])
        for a in starts
    ]


def count_model(model_dir: Path, keys_to_select: list[str] | None, vae: torch.nn.Module) -> ModelCounts:
    """Per-layer and root parameter counts of the real config, from its meta build (no memory)."""
    from diffusers import Cosmos3OmniTransformer

    from rlinf_cosmos3.components.optim import select_trainable
    from rlinf_cosmos3.models.cosmos3.loading import build_transformer_on_meta

    model = build_transformer_on_meta(model_dir)
    select_trainable(model, keys_to_select)
    layer = list(model.layers[0].parameters())
    in_layers = {id(p) for block in model.layers for p in block.parameters()}
    root = [p for p in model.parameters() if id(p) not in in_layers]
    config = Cosmos3OmniTransformer.load_config(model_dir / "transformer")
    return ModelCounts(
        layer_params=sum(p.numel() for p in layer),
        layer_trainable=sum(p.numel() for p in layer if p.requires_grad),
        root_params=sum(p.numel() for p in root),
        root_trainable=sum(p.numel() for p in root if p.requires_grad),
        vae_params=sum(p.numel() for p in vae.parameters()),
        hidden_size=int(config["hidden_size"]),
        config_layers=int(config["num_hidden_layers"]),
    )


def weights_dir(model_dir: Path, layers: int, workdir: Path, device: torch.device, seed: int) -> Path:
    """A model directory with ``layers`` decoder layers and weights on disk, loaded as the worker loads it.

    ``model_dir`` itself when it holds transformer weights of that depth; otherwise a copy of its configs
    (tokenizer, scheduler, VAE config) cut to ``layers`` with random weights made on ``device``
    (``write_random_weights``, what ``make_tiny_model.py --materialize-on`` writes for the launcher).
    """
    from rlinf_cosmos3.models.cosmos3.loading import transformer_weight_files
    from rlinf_cosmos3.models.cosmos3.tiny import write_random_weights

    config = json.loads((model_dir / "transformer" / "config.json").read_text())
    try:
        has_weights = bool(transformer_weight_files(model_dir))
    except FileNotFoundError:
        has_weights = False
    if has_weights and int(config["num_hidden_layers"]) == layers:
        return model_dir
    out = workdir / f"weights_{layers}l"
    shutil.copytree(model_dir, out, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json"))
    config["num_hidden_layers"] = layers
    (out / "transformer" / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    t0 = time.perf_counter()
    write_random_weights(out, device=device, seed=seed)
    free_memory(device)  # the whole model was on the device once: give its blocks back before measuring
    logger.info("random weights of %d layers written to %s in %.1f s", layers, out, time.perf_counter() - t0)
    return out


@dataclass
class Trainer:
    """What the SFT worker holds for a step: config, policy, optimizer, schedule, EMA, its data."""

    cfg: Any
    policy: Any
    optimizer: Any = None
    scheduler: Any = None
    ema: Any = None
    next_batch: Callable[[], dict[str, Any]] | None = None

    @property
    def grad_accum(self) -> int:
        actor = self.cfg.actor
        return actor.global_batch_size // actor.micro_batch_size  # one rank, as the worker divides


def build(setup: Setup, variant: Variant, *, train: bool = True) -> Trainer:
    """A fresh policy for ``variant`` built as ``FSDPSFTWorker.setup`` builds it (the library's
    ``build_sft_policy`` + ``build_sft_optimization`` on the weights directory)."""
    from rlinf_cosmos3.components.sft_trainer import build_sft_optimization, build_sft_policy

    cfg = setup.config(variant)
    policy, _ = build_sft_policy(cfg, setup.device, world_size=1)
    if variant.prefetch:
        layers = list(policy.transformer.layers)
        for i, layer in enumerate(layers):
            layer.set_modules_to_forward_prefetch(layers[i + 1 : i + 1 + variant.prefetch])
            layer.set_modules_to_backward_prefetch(layers[max(0, i - variant.prefetch) : i][::-1])
    trainer = Trainer(cfg, policy)
    if train:
        optimization = build_sft_optimization(policy.transformer, cfg, implementation=variant.optimizer)
        trainer.optimizer, trainer.scheduler = optimization.optimizer, optimization.scheduler
        trainer.ema = optimization.ema
        trainer.next_batch = itertools.cycle(micro_batches(setup, cfg.actor.micro_batch_size)).__next__
    return trainer


def timed_step(setup: Setup, trainer: Trainer, global_step: int) -> Any:
    """One optimizer step: the library's ``train_step``, called as ``FSDPSFTWorker.train_step`` calls it."""
    from rlinf_cosmos3.components.train_step import train_step

    cfg = trainer.cfg
    return train_step(
        trainer.policy, trainer.optimizer, trainer.next_batch,
        grad_accum_steps=trainer.grad_accum, seed=cfg.runner.seed, global_step=global_step,
        clip_grad=cfg.actor.optim.clip_grad, scheduler=trainer.scheduler, ema=trainer.ema,
        synchronize=lambda: synchronize(setup.device),
    )


def profile_steps(setup: Setup, trainer: Trainer, variant: Variant, first_step: int, steps: int = 3) -> None:
    """``steps`` more steps under ``torch.profiler``: where a step's time goes (self time per op, on the
    GPU and on the CPU, and how busy the GPU was) -> ``<--profile>/<variant>.txt``."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if setup.device.type == "cuda" else [])
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        for step in range(first_step, first_step + steps):
            timed_step(setup, trainer, step)
    wall = time.perf_counter() - t0
    events = prof.key_averages()
    # kernels only: an op's row repeats its kernels' time as its own "self" device time
    gpu_us = sum(e.self_device_time_total for e in events if e.device_type != DeviceType.CPU)
    busy = f"; GPU kernels busy {gpu_us / 1e6:.3f} s ({100 * gpu_us / 1e6 / wall:.0f} % of the wall time)" \
        if setup.device.type == "cuda" else ""
    lines = [f"{variant.name}: {steps} steps in {wall:.3f} s under the profiler{busy}"]
    for key in (["self_device_time_total"] if setup.device.type == "cuda" else []) + ["self_cpu_time_total"]:
        lines += ["", f"sorted by {key}:", events.table(sort_by=key, row_limit=30, max_name_column_width=70)]
    out = setup.args.profile / f"{variant.name}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    logger.info("[%6.1fs] %s: %s -> %s", setup.elapsed(), variant.name, lines[0], out)


@contextmanager
def watch_transformer_calls(transformer: torch.nn.Module) -> Iterator[list[dict[str, int]]]:
    """Record the sequence layout of every transformer call (what it really sees)."""
    seen: list[dict[str, int]] = []

    def hook(_module: torch.nn.Module, _args: tuple, kwargs: dict[str, Any]) -> None:
        seen.append({
            "sequence_length": int(kwargs["sequence_length"]),
            "text": int(kwargs["und_len"]),
            "vision": int(kwargs["vision_sequence_indexes"].numel()),
            "action": int(kwargs["action_sequence_indexes"].numel()),
        })

    handle = transformer.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


# --------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------


def count_flops(setup: Setup) -> dict[str, Any]:
    """FLOPs of one eager sample's forward + backward (FlopCounterMode), scaled to a step."""
    from torch.utils.flop_counter import FlopCounterMode

    from rlinf_cosmos3.components.train_step import sample_generators

    policy = build(setup, Variant(name="flops", micro_batch=1, max_tokens_per_pack=None), train=False).policy
    batch = micro_batches(setup, 1, pixels=False)[0]
    mode = FlopCounterMode(display=False, custom_mapping=attention_flop_formulas())
    with watch_transformer_calls(policy.transformer) as seen, mode:
        loss, _ = policy.sft_loss(batch, sample_generators(setup.args.seed, 0, batch["index"]))
        loss.backward()
    synchronize(setup.device)
    value = float(loss.detach())
    if not math.isfinite(value):
        raise FloatingPointError(f"the FLOP-count sample's loss is {value}")
    per_sample = int(mode.get_total_flops())
    by_op = {str(op): int(v) for op, v in mode.get_flop_counts().get("Global", {}).items()}
    del policy, loss
    free_memory(setup.device)
    if seen[0]["sequence_length"] != setup.layout.tokens_per_sample:
        raise AssertionError(f"transformer saw {seen[0]} but the layout says {setup.layout}")
    return {
        "per_sample": per_sample,
        "per_step": per_sample * setup.args.global_batch,
        "by_op_per_sample": by_op,
        "six_nt_per_step": six_nt(setup),
        "transformer_call": seen[0],
        "note": "FlopCounterMode on one eager sample (forward+backward), x samples/step; matmuls and SDPA "
        "(GQA-expanded), causal counted as full; no elementwise, optimizer or recompute FLOPs",
    }


def six_nt(setup: Setup) -> int:
    tokens_per_step = setup.layout.tokens_per_sample * setup.args.global_batch
    return 6 * setup.layers * (setup.counts.layer_params // 2) * tokens_per_step


def count_flops_or_estimate(setup: Setup) -> dict[str, Any]:
    """:func:`count_flops`, or the 6NT estimate if counting fails (the one-shot GPU run goes on)."""
    try:
        flops = {**count_flops(setup), "source": "FlopCounterMode"}
    except Exception as exc:  # noqa: BLE001 - MFU from 6NT beats losing the whole run
        logger.exception("[%6.1fs] FLOP counting failed; MFU falls back to 6NT", setup.elapsed())
        free_memory(setup.device)
        flops = {"per_step": six_nt(setup), "six_nt_per_step": six_nt(setup), "source": "6NT fallback",
                 "error": f"{type(exc).__name__}: {exc}"[:300]}
    logger.info("[%6.1fs] FLOPs/step %s (%s), 6NT %s", setup.elapsed(), si(flops["per_step"]),
                flops["source"], si(flops["six_nt_per_step"]))
    return flops


def measure_encode(setup: Setup) -> float:
    """Seconds per sample of the frozen VAE encode (``processor.encode_pixels``, as the cache build runs it).

    On GPU a second, warm pass over up to ``vae_batch_size`` samples; on CPU the set-up's encode.
    """
    if setup.device.type != "cuda":
        return setup.first_encode_s_per_sample
    from rlinf_cosmos3.data.collate import collate_samples

    samples = setup.pixels[: setup.encoder.cfg.vae_batch_size]
    synchronize(setup.device)
    t0 = time.perf_counter()
    setup.encoder.processor.encode_pixels(collate_samples(samples))
    synchronize(setup.device)
    return (time.perf_counter() - t0) / len(samples)


def run_variant(setup: Setup, variant: Variant, flops_per_step: int, matmul_rate: float) -> dict[str, Any]:
    """Build, warm up, time; the measured figures of one variant."""
    device, args, layout = setup.device, setup.args, setup.layout
    t0 = time.perf_counter()
    trainer = build(setup, variant)
    synchronize(device)
    build_s = time.perf_counter() - t0
    static_gib = torch.cuda.memory_allocated(device) / GIB if device.type == "cuda" else None
    free_memory(device)
    warmup = args.warmup + (1 if variant.compile else 0)  # compiled backward settles a step later
    t0 = time.perf_counter()
    with watch_transformer_calls(trainer.policy.transformer) as seen:
        for step in range(warmup):
            timed_step(setup, trainer, step)
            logger.info("[%6.1fs] %s: warm-up step %d/%d", setup.elapsed(), variant.name, step + 1, warmup)
        warmup_s = time.perf_counter() - t0
        results = [timed_step(setup, trainer, step) for step in range(warmup, warmup + args.steps)]
    if args.profile:
        profile_steps(setup, trainer, variant, warmup + args.steps)
    totals = [r.forward_backward_s + r.optimizer_s for r in results]
    step_s = statistics.median(totals)
    samples = args.global_batch
    tokens = layout.tokens_per_sample * samples
    losses = [r.loss for r in results]
    result: dict[str, Any] = {
        "name": variant.name,
        "features": variant.features,
        "variant": asdict(variant),
        "overrides": variant.overrides(samples),
        "status": "ok",
        "micro_batch": trainer.cfg.actor.micro_batch_size,
        "grad_accum": trainer.grad_accum,
        "max_tokens_per_pack": trainer.cfg.actor.max_tokens_per_pack,
        "transformer_calls_per_step": len(seen) / (warmup + args.steps),
        "tokens_per_call": sorted({call["sequence_length"] for call in seen}),
        "build_s": build_s,
        "warmup_s": warmup_s,
        "step_times_s": totals,
        "step_time_s": step_s,
        "fwd_bwd_s": statistics.median(r.forward_backward_s for r in results),
        "optimizer_s": statistics.median(r.optimizer_s for r in results),
        "samples_per_step": samples,
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / step_s,
        "samples_per_s": samples / step_s,
        "flops_per_step": flops_per_step,
        "achieved_flops_per_s": flops_per_step / step_s,
        "mfu": flops_per_step / step_s / matmul_rate,
        "losses": losses,
        "loss_finite": all(math.isfinite(x) for x in losses),
        "estimated_peak_gib": estimate_peak_bytes(
            setup.counts, setup.layers, layout, variant, setup.compute_bytes, setup.vae_bytes
        ) / GIB,
    }
    if device.type == "cuda":
        result["static_allocated_gib"] = static_gib
        result["peak_allocated_gib"] = torch.cuda.max_memory_allocated(device) / GIB
        result["peak_reserved_gib"] = torch.cuda.max_memory_reserved(device) / GIB
        result["peak_memory_gib"] = result["peak_allocated_gib"]
    else:
        result["peak_memory_gib"] = peak_rss_gib()  # process peak RSS: cumulative over variants on CPU
    return result


def run_variants(setup: Setup, variants: Sequence[Variant], flops_per_step: int, rate: float) -> list[dict]:
    """Every variant in turn on a fresh model; a failure (OOM, compile error) is recorded, not fatal."""
    results: list[dict[str, Any]] = []
    for variant in variants:
        head = {"name": variant.name, "features": variant.features, "micro_batch": variant.micro_batch}
        if setup.budget.spent():
            logger.info("[%6.1fs] %s: skipped (time budget)", setup.elapsed(), variant.name)
            error = f"time budget {setup.args.time_budget_s:.0f}s spent"
            results.append({**head, "status": "skipped", "error": error})
            continue
        logger.info("[%6.1fs] %s (%s): building", setup.elapsed(), variant.name, variant.features)
        try:
            result = run_variant(setup, variant, flops_per_step, rate)
        except Exception as exc:  # noqa: BLE001 - one failed variant must not lose the others' numbers
            logger.exception("[%6.1fs] %s failed", setup.elapsed(), variant.name)
            status = "oom" if isinstance(exc, torch.OutOfMemoryError) else "error"
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            result = {**head, "status": status, "error": f"{type(exc).__name__}: {first_line}"[:300]}
        if variant.compile:
            from torch import _dynamo

            _dynamo.reset()  # drop the compiled graphs with the model
        free_memory(setup.device)
        results.append(result)
        if result["status"] == "ok":
            logger.info(
                "[%6.1fs] %s: step %.3f s, %s tokens/s, MFU %.1f%%, peak %.1f GiB", setup.elapsed(),
                variant.name, result["step_time_s"], si(result["tokens_per_s"]), 100 * result["mfu"],
                result["peak_memory_gib"],
            )
    return results


def measure(setup: Setup, variants: Sequence[Variant]) -> dict[str, Any]:
    """Matmul rate, encode time, FLOPs per step, then the variants: the report's measured part."""
    estimates = {
        v.name: estimate_peak_bytes(setup.counts, setup.layers, setup.layout, v, setup.compute_bytes,
                                    setup.vae_bytes) / GIB
        for v in variants
    }
    logger.info(
        "[%6.1fs] %d layers, %d tokens/sample, %d samples/step; estimated peak GiB: %s", setup.elapsed(),
        setup.layers, setup.layout.tokens_per_sample, setup.args.global_batch,
        ", ".join(f"{name} {gib:.1f}" for name, gib in estimates.items()),
    )
    dtype = torch.bfloat16 if setup.precision == "bf16" else torch.float32
    matmul = measure_matmul(setup.device, dtype, setup.args.matmul_size)
    logger.info("[%6.1fs] matmul %s", setup.elapsed(), si(matmul["flops_per_s"], "FLOP/s"))
    encode_s = measure_encode(setup)
    logger.info("[%6.1fs] VAE encode %.3f s/sample", setup.elapsed(), encode_s)
    flops = count_flops_or_estimate(setup)
    results = run_variants(setup, variants, flops["per_step"], matmul["flops_per_s"])
    return {"matmul": matmul, "encode_s_per_sample": encode_s, "flops": flops, "variants": results}


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def si(value: float, unit: str = "") -> str:
    """``412.3T``-style numbers, so GPU and CPU runs read in one format."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{prefix}{unit}"
    return f"{value:.3g}{unit}"


def format_table(report: dict[str, Any]) -> str:
    """The short summary printed last (the remote call returns only the tail of the output)."""
    m, lay, fl, mm = report["model"], report["layout"], report["flops"], report["matmul"]
    width = max([7] + [len(v["name"]) for v in report["variants"]])
    batches = "pixel batches, VAE in the step" if lay["with_encode"] else "cached-latent batches"
    lines = [
        f"sft_step | {report['device']['name']} | torch {report['versions']['torch']} | "
        f"{report['precision']} | {m['preset']} width, {m['layers']}/{m['config_layers']} layers, "
        f"{si(m['params'])} params, {si(m['trainable'])} trainable ({m['trainable_mode']})",
        f"step = {lay['samples_per_step']} samples ({batches}), {lay['tokens_per_step']} tokens; "
        f"tokens/sample {lay['tokens_per_sample']} = text {lay['text_tokens']} + vision "
        f"{lay['vision_tokens']} ({lay['noisy_vision_tokens']} noisy) + action {lay['action_tokens']}",
        f"matmul {mm['size']}^3 {mm['dtype']}: {si(mm['flops_per_s'], 'FLOP/s')} | FLOPs/step "
        f"{si(fl['per_step'])} ({fl['source']}), 6NT {si(fl['six_nt_per_step'])} | VAE encode "
        f"{report['encode_s_per_sample']:.3f} s/sample",
        "",
        f"{'variant':<{width}} {'mb':>3} {'acc':>3} {'calls':>5} {'step s':>7} {'fwd+bwd':>7} {'optim':>6} "
        f"{'tok/s':>7} {'smp/s':>6} {'FLOP/s':>7} {'MFU':>6} {'peak GiB':>8} {'rsv GiB':>7} {'est GiB':>7}",
    ]
    for v in report["variants"]:
        head = f"{v['name']:<{width}} {v['micro_batch']:>3}"
        if v["status"] != "ok":
            lines.append(f"{head} {v['status']}: {v.get('error', '')[:80]}")
            continue
        reserved = v.get("peak_reserved_gib")
        lines.append(
            f"{head} {v['grad_accum']:>3} {v['transformer_calls_per_step']:>5.0f} {v['step_time_s']:>7.3f} "
            f"{v['fwd_bwd_s']:>7.3f} {v['optimizer_s']:>6.3f} {si(v['tokens_per_s']):>7} "
            f"{v['samples_per_s']:>6.2f} {si(v['achieved_flops_per_s']):>7} {v['mfu']:>6.1%} "
            f"{v['peak_memory_gib']:>8.1f} {'-' if reserved is None else f'{reserved:.1f}':>7} "
            f"{v['estimated_peak_gib']:>7.1f}" + ("" if v["loss_finite"] else "  (loss not finite)")
        )
    if report["device"]["type"] != "cuda":
        lines.append("(CPU: peak GiB is the process's peak RSS so far; est GiB models a GPU's allocated peak)")
    lines.append(f"json: {report['out']}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    add = p.add_argument
    add("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    add("--preset", default="nano", choices=["nano", "small", "tiny"],
        help="architecture of the generated model dir (small: the learning proof's 7.85M, all its layers)")
    add("--model-dir", type=Path, help="an existing diffusers Cosmos3 dir (configs are enough)")
    add("--layers", help=f"decoder layers, or 'auto' (default: nano {NANO_DEFAULT_LAYERS}, tiny its 2)")
    add("--variants", default=DEFAULT_VARIANTS, help=f"comma-separated, see above (default {DEFAULT_VARIANTS})")
    add("--trainable", default="recipe", choices=["recipe", "all"], help="all: keys_to_select=null")
    add("--micro-batch", type=int, help="micro-batch of variants without mb<N> (default: 4 on GPU, 1 on CPU)")
    add("--global-batch", type=int, help="samples per optimizer step (default: 32 on GPU, 2 on CPU)")
    add("--distinct-samples", type=int, help="samples encoded and cycled (default: largest micro-batch; CPU 1)")
    add("--warmup", type=int, default=1, help="untimed steps per variant (compiled ones: one more)")
    add("--steps", type=int, default=3, help="timed steps per variant (the median is reported)")
    add("--with-encode", action="store_true", help="pixel batches: the VAE encode is in the step")
    add("--matmul-size", type=int, help="default 8192 on GPU, 1024 on CPU")
    add("--memory-target-gib", type=float, default=DEFAULT_MEMORY_TARGET_GIB, help="for --layers auto")
    add("--time-budget-s", type=float, default=DEFAULT_TIME_BUDGET_S, help="skip variants not started by then")
    add("--cpu-threads", type=int, help="torch intra-op threads (default: the recipe's cluster.cpus_per_rank, "
        "what Ray gives the worker as OMP_NUM_THREADS, at most the host's cores)")
    add("--seed", type=int, default=0)
    add("--profile", type=Path, help="after the timed steps, 3 more under torch.profiler; tables -> DIR/<variant>.txt")
    add("--out", type=Path, help="JSON path (default benchmarks/results/sft_step_<device>_<date>.json)")
    args = p.parse_args(argv)
    on_gpu = args.device == "cuda"
    args.micro_batch = args.micro_batch or (4 if on_gpu else 1)
    args.global_batch = args.global_batch or (32 if on_gpu else 2)
    args.matmul_size = args.matmul_size or (8192 if on_gpu else 1024)
    counts = [args.micro_batch, args.global_batch, args.steps, args.distinct_samples or 1]
    if min(counts) < 1 or (args.cpu_threads is not None and args.cpu_threads < 1) or args.warmup < 0:
        p.error("--micro-batch, --global-batch, --distinct-samples, --cpu-threads and --steps must be >= 1, "
                "--warmup >= 0")
    try:
        args.variant_list = parse_variants(args.variants, args.micro_batch, args.global_batch)
    except ValueError as err:
        p.error(str(err))
    largest = max(v.micro_batch for v in args.variant_list)
    args.distinct_samples = min(args.distinct_samples or (largest if on_gpu else 1), args.global_batch)
    return args


def prepare(
    args: argparse.Namespace, device: torch.device, variants: Sequence[Variant], workdir: Path
) -> Setup:
    """Model dir, recipe config, frozen parts, samples, layout, counts, layer count, weights."""
    from diffusers import AutoencoderKLWan

    from rlinf_cosmos3.components.sft_trainer import sft_precision
    from rlinf_cosmos3.data.collate import collate_samples
    from rlinf_cosmos3.models.cosmos3 import loading
    from rlinf_cosmos3.models.cosmos3.configuration import policy_config_from_sft, sft_vae_dtype
    from rlinf_cosmos3.models.cosmos3.policy import Cosmos3Policy
    from rlinf_cosmos3.models.cosmos3.tiny import random_vae, write_model_dir

    on_gpu = device.type == "cuda"
    model_dir = args.model_dir or write_model_dir(workdir / args.preset, preset=args.preset, seed=args.seed)
    base = recipe_config(model_dir, args.seed, args.trainable)
    precision = sft_precision(base, device)  # as the worker picks it
    # As many intra-op threads as the worker's Ray actor gets (OMP_NUM_THREADS = its num_cpus): with one
    # per core (16 on the H200 host) the step ran 0.31 s instead of 0.14 s in 3 of 4 processes.
    torch.set_num_threads(args.cpu_threads or max(1, min(int(base.cluster.cpus_per_rank), os.cpu_count() or 1)))
    vae_config = AutoencoderKLWan.load_config(model_dir / "vae")
    vae = random_vae(vae_config, device=device, dtype=sft_vae_dtype(on_gpu), seed=args.seed)
    encoder = Cosmos3Policy(
        loading.build_transformer_on_meta(model_dir), vae, loading.load_tokenizer(model_dir),
        loading.load_scheduler(model_dir),
        policy_config_from_sft(base, precision=precision),
    )
    pixels = synthetic_samples(args.distinct_samples, base, args.seed)
    t0 = time.perf_counter()
    cached = cache_latents(encoder, pixels)
    first_encode_s = (time.perf_counter() - t0) / len(pixels)
    first = encoder.encode_batch(collate_samples(cached[:1]))[0]
    inputs = encoder.transformer_inputs(first.input_ids, first.x0_vision, first.x0_action, 500.0)
    layout = Layout(
        text_tokens=int(inputs["und_len"]),
        vision_tokens=int(inputs["vision_sequence_indexes"].numel()),
        noisy_vision_tokens=int(inputs["vision_mse_loss_indexes"].numel()),
        action_tokens=int(inputs["action_sequence_indexes"].numel()),
    )
    if layout.tokens_per_sample != int(inputs["sequence_length"]):
        raise AssertionError(f"layout {layout} does not add up to {inputs['sequence_length']} tokens")
    counts = count_model(model_dir, base.actor.model.keys_to_select, vae)
    setup = Setup(
        args=args, device=device, precision=precision, model_dir=model_dir, base_config=base, encoder=encoder,
        pixels=pixels, cached=cached, layout=layout, counts=counts,
        first_encode_s_per_sample=first_encode_s,
    )
    if args.layers in (None, ""):
        setup.layers = NANO_DEFAULT_LAYERS if args.preset == "nano" else counts.config_layers
    elif args.layers == "auto":
        target = args.memory_target_gib * GIB
        setup.layers = auto_layers(counts, layout, variants, target, setup.compute_bytes, setup.vae_bytes)
    else:
        setup.layers = int(args.layers)
        if setup.layers < 1:
            raise ValueError(f"--layers must be >= 1 or 'auto', got {args.layers}")
    setup.model_dir = weights_dir(model_dir, setup.layers, workdir, device, args.seed)
    return setup


def build_report(
    setup: Setup, measured: dict[str, Any], out: Path, argv: Sequence[str] | None
) -> dict[str, Any]:
    """The JSON document: settings, model, layout, recipe, and everything measured."""
    args, device, counts, layout, base = setup.args, setup.device, setup.counts, setup.layout, setup.base_config
    return {
        "benchmark": "sft_step",
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "argv": list(argv) if argv is not None else sys.argv[1:],
        "device": {
            "type": device.type,
            "name": device_name(device),
            "total_memory_gib": device_memory_gib(device),
            "cpu_threads": torch.get_num_threads(),
        },
        "versions": library_versions(),
        "precision": setup.precision,
        "allocator": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "model": {
            "preset": args.preset,
            "model_dir": str(args.model_dir) if args.model_dir else None,
            "layers": setup.layers,
            "params": counts.total(setup.layers),
            "trainable": counts.trainable(setup.layers),
            "trainable_mode": args.trainable,
            **asdict(counts),
        },
        "layout": {
            **asdict(layout),
            "tokens_per_sample": layout.tokens_per_sample,
            "samples_per_step": args.global_batch,
            "tokens_per_step": layout.tokens_per_sample * args.global_batch,
            "distinct_samples": len(setup.cached),
            "with_encode": args.with_encode,
            "batch_keys": sorted(setup.pixels[0] if args.with_encode else setup.cached[0]),
        },
        "recipe": {
            "config": str((RECIPE_DIR / f"{RECIPE}.yaml").relative_to(REPO)),
            "optim": asdict(base.actor.optim),
            "keys_to_select": base.actor.model.keys_to_select,
            "lr_multipliers": base.actor.model.lr_multipliers,
            "seed": base.runner.seed,
        },
        **measured,
        "wall_s": setup.elapsed(),
        "out": str(out),
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; returns the report (also written as JSON and printed as a table, last)."""
    args = parse_args(argv)
    budget = Budget(args.time_budget_s)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr
    )
    logging.getLogger("rlinf_cosmos3").setLevel(logging.WARNING)
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # before CUDA starts
    torch.manual_seed(args.seed)
    with one_rank_process_group(device), tempfile.TemporaryDirectory(prefix="sft_step_") as workdir:
        setup = prepare(args, device, args.variant_list, Path(workdir))
        setup.budget = budget
        measured = measure(setup, args.variant_list)

    out = args.out or results_path("sft_step", device_slug(device))
    report = build_report(setup, measured, out, argv)
    write_json(out, report)
    sys.stderr.flush()
    print(format_table(report), flush=True)
    return report


if __name__ == "__main__":
    main()

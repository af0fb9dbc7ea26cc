"""Training benchmark: FSDP2 SFT steps of the Cosmos3 transformer at Nano width on one device.

What runs is the project's SFT step, not a stand-in: a ``Cosmos3OmniTransformer`` with the Nano
config (hidden 4096, 32/8 heads, MLP 12288) and ``--layers N`` of its 36 decoder layers is built on
the meta device, sharded by the project's :func:`parallelize` (FSDP2 per decoder layer, then the
root; bf16 compute, fp32 master weights and gradient reduction) over a one-rank mesh, then
materialised on the device with random weights (never the whole model on the host). The loss is
:class:`Cosmos3Policy`'s (``sft_loss`` = ``encode_batch`` + ``loss_from_encoded``) on a synthetic
batch in the layout the LeRobot reader yields for the reference recipe
(``examples/sft/config/libero_sft_cosmos3.yaml``: 17 frames of two 256x256 views, 16 normalised
10-D actions, one task prompt per sample), composed into the 320x192 canvas. One sample is one
packed sequence: text (the chat-templated policy caption, 108 tokens with the generated
directory's tokenizer) + vision (5 latent frames x 6 x 10 patches = 300: 60 clean condition
tokens, 240 noisy) + 16 action tokens = 424 tokens. Trainable parameters, optimizer settings and
LR multipliers are the recipe's (``--trainable recipe``: the generation tower and heads train, the
understanding tower and the embeddings are frozen) or everything (``--trainable all``).

The timed step is what the SFT worker does per optimizer step, minus the frozen part: zero grads,
``--grad-accum`` micro-batches of ``--micro-batch`` samples through ``loss_from_encoded`` and
backward, the project's ``clip_grad_norm``, AdamW step. The VAE encode of ``sft_loss`` (frozen,
no gradients) is timed separately per sample and reported beside it (``--with-encode`` puts it in
the timed step). EMA and the LR schedule are left out (both elementwise, not matmul).

How many layers fit (``--layers auto`` computes it for the chosen variants; Nano width, B =
micro-batch, S = 424 tokens, H = 4096):

* parameters: 385.9M per decoder layer (two towers of 192.9M: q/k/v/o + SwiGLU MLP + norms); root
  1281M (embed_tokens and the unused lm_head 622M each, time embedder, patch and action heads).
  Recipe-trainable: 192.9M per layer (the generation tower) + 36.3M in the root;
* resident, FSDP2 mixed precision + AdamW: fp32 parameter (4 B) for every parameter, fp32 gradient
  and two fp32 moments (12 B) for every trainable one: recipe 4 x 385.9M + 12 x 192.9M = 3.59 GiB
  per layer (all trainable: 16 B x 385.9M = 5.75 GiB), root 5.2 GiB, VAE 1.3 GiB (bf16);
* transient: the root's bf16 gathered copy 2.4 GiB (kept from forward to backward); two gathered
  layers 1.4 GiB, or all L of them (0.72 GiB each) with ``noreshard``; one layer's unsharded bf16
  and fp32 reduce gradients 1.1 GiB; foreach AdamW's ``sqrt(v)`` temporary, 4 B per trainable
  parameter (0.72 GiB per layer), which fused AdamW does not allocate;
* activations live for all B samples of a micro-batch (``loss_from_encoded`` runs them one after
  the other, then one backward): ~57 B per hidden unit, token and layer in bf16 (measured with
  saved-tensor hooks), 0.093 GiB per layer and sample; with checkpointing only the layer inputs,
  2 B x H x S = 3.5 MB.

At B = 4 that is 3.59 + 0.37 GiB per layer (+0.72 with foreach or ``noreshard``) over ~13 GiB: at
22 layers the estimated peaks are 115.9 GiB (base), 114.4 (noreshard), 100.7 (prefetch), 100.0
(fused, compile), 92.2 (ac); 23 layers would put base at 120.6. So the default, ``--layers 22``, is the most that
fits 120 GiB for every default variant (fused alone fits 27, fused + checkpointing 29); all 36
layers need 143 GiB even with fused AdamW and checkpointing, more than an H200's ~140 GiB. Per-layer
work is identical, so time and memory scale linearly with L. The ``est GiB`` column is this
estimate, beside the measured peak.

The text count (108) comes from the generated directory's small BPE tokenizer; ``--model-dir`` of
a real checkpoint's directory (only configs and the tokenizer are read) gives the real one.

Variants (``--variants``, comma-separated, side by side in one run, each on a freshly built model:
a few warm-up steps, then the median of timed steps): ``base`` (foreach AdamW), ``fused`` (fused
AdamW, what ``build_optimizer`` picks on GPU), ``ac`` (fused + activation checkpointing),
``compile`` (fused + ``torch.compile`` of each decoder block before sharding, torchtitan's order),
``noreshard`` (fused + ``reshard_after_forward=False``: each layer is gathered once per
micro-batch instead of once per sample and again in backward), ``prefetch`` (fused + explicit
2-layer forward/backward prefetch), or any ``+``-joined combination of ``foreach``/``fused``,
``ac``, ``compile``, ``noreshard``, ``prefetch<N>`` (e.g. ``fused+compile+noreshard``).

FLOPs per step are measured once with ``torch.utils.flop_counter.FlopCounterMode`` on one eager
sample (forward + backward, no checkpointing; every sample has the same shapes, so x B x accum).
It counts matmuls (mm/addmm/bmm) and attention (SDPA flash/efficient/cuDNN, here extended to GQA
key/value heads and to the CPU flash kernel); it counts causal attention as full, and ignores
elementwise work (norms, RoPE, SiLU, optimizer) and recomputation (so MFU is model FLOPs, not
hardware FLOPs). MFU = FLOPs/step / step time / the bf16 matmul rate measured in the same run
(8192^3 ``torch.matmul``, median of 10 after 3 warm-ups). ``6NT`` beside it is the dense rule with
N = layers x 192.9M (each token goes through one tower of the Mixture-of-Transformers) and T the
tokens per step; it ignores attention and the frozen tower's missing weight gradients.

    # CPU smoke run (~1 min): tiny preset, fp32, gloo
    .venv/bin/python benchmarks/gpu/sft_step.py --device cpu --preset tiny --steps 2 --warmup 1 --variants base,fused
    # one H200 (~4-5 min; --time-budget-s 300 skips variants not started by then): Nano width,
    # 22 layers, bf16, nccl
    PYTHONUNBUFFERED=1 .venv/bin/python benchmarks/gpu/sft_step.py --out $OUT/sft_step.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import logging
import math
import os
import platform
import re
import resource
import socket
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
import yaml

logger = logging.getLogger("benchmarks.sft_step")

REPO = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO / "benchmarks" / "results"
RECIPE_DIR = REPO / "examples" / "sft" / "config"
GIB = 2**30

NANO_DEFAULT_LAYERS = 22
"""Largest layer count whose estimated peak fits 120 GiB for every default variant (docstring)."""
DEFAULT_VARIANTS = "base,fused,ac,noreshard,prefetch,compile,compile+noreshard"
DEFAULT_MEMORY_TARGET_GIB = 120.0
DEFAULT_TIME_BUDGET_S = 300.0

ACT_BYTES_PER_HIDDEN_TOKEN_BF16 = 57.0
"""Saved activations of one decoder layer per token per hidden unit in bf16, eager (measured on CPU
with ``saved_tensors_hooks`` at 424 tokens; storages counted once)."""
ROOT_ACT_BYTES_PER_HIDDEN_TOKEN_BF16 = 32.0
"""Rough allowance for the root's activations (embeddings, packing, final norms, heads)."""
ALLOCATOR_SLACK_BYTES = GIB
IMAGE_SIZE = 256
"""LIBERO views as the reader returns them (``LiberoDataConfig.image_size`` default, 256x256)."""
PROMPT = "put the black bowl on the plate"
"""One prompt for every sample: equal sequence lengths, so a compiled block never recompiles."""


# --------------------------------------------------------------------------------------------
# Variants
# --------------------------------------------------------------------------------------------

OPTIMIZERS = {"base": "foreach", "foreach": "foreach", "fused": "fused"}
"""Variant words that pick the AdamW implementation (``base`` is the foreach baseline)."""


@dataclass(frozen=True)
class Variant:
    """One training configuration; everything else (model, batch, steps) is shared."""

    name: str
    optimizer: str = "fused"
    activation_checkpointing: bool = False
    compile: bool = False
    reshard_after_forward: bool = True
    prefetch: int = 0

    @property
    def features(self) -> str:
        parts = [self.optimizer]
        parts += ["ac"] if self.activation_checkpointing else []
        parts += ["compile"] if self.compile else []
        parts += ["noreshard"] if not self.reshard_after_forward else []
        parts += [f"prefetch{self.prefetch}"] if self.prefetch else []
        return "+".join(parts)


def parse_variant(name: str) -> Variant:
    """``base``, ``fused``, ``ac``, ``compile``, ``noreshard``, ``prefetch`` or a ``+``-joined list of
    them (``prefetch<N>`` for N layers); the optimizer is fused unless ``base``/``foreach`` is named."""
    variant, optimizers = Variant(name=name), set()
    for token in name.split("+"):
        if token in OPTIMIZERS:
            optimizers.add(OPTIMIZERS[token])
        elif token == "ac":
            variant = replace(variant, activation_checkpointing=True)
        elif token == "compile":
            variant = replace(variant, compile=True)
        elif token == "noreshard":
            variant = replace(variant, reshard_after_forward=False)
        elif (match := re.fullmatch(r"prefetch(\d*)", token)) and int(match.group(1) or 2) > 0:
            variant = replace(variant, prefetch=int(match.group(1) or 2))
        else:
            raise ValueError(
                f"unknown variant part {token!r} in {name!r}; use a '+'-joined list of base/foreach/fused, "
                "ac, compile, noreshard, prefetch<N>"
            )
    if len(optimizers) > 1:
        raise ValueError(f"variant {name!r} names two optimizers: {sorted(optimizers)}")
    return replace(variant, optimizer=optimizers.pop() if optimizers else "fused")


def parse_variants(spec: str) -> list[Variant]:
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names or len(set(names)) != len(names):
        raise ValueError(f"--variants must list distinct variants, got {spec!r}")
    return [parse_variant(n) for n in names]


# --------------------------------------------------------------------------------------------
# Recipe, layout, model counts, memory model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recipe:
    """The reference SFT recipe's values this benchmark uses (read from the YAML, one source)."""

    keys_to_select: list[str]
    lr_multipliers: dict[str, float]
    lr: float
    weight_decay: float
    betas: tuple[float, float]
    eps: float
    clip_grad: float
    fps: float
    num_frames: int
    action_horizon: int
    canvas_height: int
    canvas_width: int
    loss_scale: float
    action_loss_weight: float


def load_recipe(recipe_dir: Path = RECIPE_DIR) -> Recipe:
    model = yaml.safe_load((recipe_dir / "model" / "cosmos3.yaml").read_text())
    top = yaml.safe_load((recipe_dir / "libero_sft_cosmos3.yaml").read_text())
    optim, dataset = top["actor"]["optim"], top["data"]["dataset"]
    if dataset["num_frames"] != model["num_frames"] or dataset["chunk_length"] != model["action_horizon"]:
        raise ValueError(f"recipe data and model disagree: {dataset} vs {model}")
    return Recipe(
        keys_to_select=list(model["keys_to_select"]),
        lr_multipliers={k: float(v) for k, v in model["lr_multipliers"].items()},
        lr=float(optim["lr"]),
        weight_decay=float(optim["weight_decay"]),
        betas=(float(optim["betas"][0]), float(optim["betas"][1])),
        eps=float(optim["eps"]),
        clip_grad=float(optim["clip_grad"]),
        fps=float(model["fps"]),
        num_frames=int(model["num_frames"]),
        action_horizon=int(model["action_horizon"]),
        canvas_height=int(model["canvas_height"]),
        canvas_width=int(model["canvas_width"]),
        loss_scale=float(model["loss_scale"]),
        action_loss_weight=float(model["action_loss_weight"]),
    )


@dataclass(frozen=True)
class Layout:
    """Tokens one sample puts in front of the transformer, and samples per optimizer step."""

    text_tokens: int
    vision_tokens: int
    noisy_vision_tokens: int
    action_tokens: int
    micro_batch: int
    grad_accum: int

    @property
    def tokens_per_sample(self) -> int:
        return self.text_tokens + self.vision_tokens + self.action_tokens

    @property
    def samples_per_step(self) -> int:
        return self.micro_batch * self.grad_accum

    @property
    def tokens_per_step(self) -> int:
        return self.tokens_per_sample * self.samples_per_step


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
    """Peak allocated bytes of a training step (the model of the module docstring)."""
    params, trainable = counts.total(layers), counts.trainable(layers)
    resident = 4 * params + 12 * trainable + vae_bytes * counts.vae_params
    gathered_layers = layers if not variant.reshard_after_forward else 1 + max(1, variant.prefetch)
    gathered = compute_bytes * (counts.root_params + gathered_layers * counts.layer_params)
    grads = (compute_bytes + 4) * (counts.layer_trainable + counts.root_trainable)
    scale = compute_bytes / 2  # fp32 activations are twice the bf16 ones
    hs = counts.hidden_size * layout.tokens_per_sample
    per_layer = (
        compute_bytes * hs
        if variant.activation_checkpointing
        else ACT_BYTES_PER_HIDDEN_TOKEN_BF16 * scale * hs
    )
    recompute = ACT_BYTES_PER_HIDDEN_TOKEN_BF16 * scale * hs if variant.activation_checkpointing else 0.0
    activations = layout.micro_batch * (
        layers * per_layer + ROOT_ACT_BYTES_PER_HIDDEN_TOKEN_BF16 * scale * hs
    )
    foreach_tmp = 4 * trainable if variant.optimizer == "foreach" else 0
    return resident + gathered + grads + activations + recompute + foreach_tmp + ALLOCATOR_SLACK_BYTES


def auto_layers(
    counts: ModelCounts,
    layout: Layout,
    variants: Sequence[Variant],
    target_bytes: float,
    compute_bytes: int,
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
# Device, distributed, timing
# --------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def init_distributed(device: torch.device) -> None:
    """A one-rank process group (nccl on GPU, gloo on CPU) so FSDP2 runs its real code path."""
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    else:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", rank=0, world_size=1)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepTimer:
    """Wall time of a step between device syncs, split at one mark (CUDA events on GPU)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"

    def start(self) -> None:
        synchronize(self.device)
        self._t0 = time.perf_counter()
        if self.cuda:
            self._events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            self._events[0].record()

    def mark(self) -> None:
        if self.cuda:
            self._events[1].record()
        else:
            self._t1 = time.perf_counter()

    def stop(self) -> tuple[float, float, float]:
        """(total, before the mark, after the mark) in seconds."""
        if self.cuda:
            self._events[2].record()
        synchronize(self.device)
        total = time.perf_counter() - self._t0
        if self.cuda:
            first = self._events[0].elapsed_time(self._events[1]) / 1e3
            second = self._events[1].elapsed_time(self._events[2]) / 1e3
        else:
            first, second = self._t1 - self._t0, total - (self._t1 - self._t0)
        return total, first, second


def measure_matmul(
    device: torch.device, dtype: torch.dtype, size: int, reps: int = 10, warmup: int = 3
) -> dict:
    """Median rate of a ``size``^3 ``torch.matmul`` on random data: the MFU denominator."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=gen)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=gen)
    times = []
    for i in range(warmup + reps):
        synchronize(device)
        t0 = time.perf_counter()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.matmul(a, b)
            end.record()
            synchronize(device)
            elapsed = start.elapsed_time(end) / 1e3
        else:
            torch.matmul(a, b)
            elapsed = time.perf_counter() - t0
        if i >= warmup:
            times.append(elapsed)
    flops = 2.0 * size**3
    median = statistics.median(times)
    del a, b
    return {
        "size": size,
        "dtype": str(dtype).removeprefix("torch."),
        "median_s": median,
        "flops_per_s": flops / median,
    }


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


def _expand_kv(query_shape: Sequence[int], kv_shape: Sequence[int]) -> tuple[int, ...]:
    """GQA: count attention as if the key/value heads were repeated to the query heads."""
    b, _, s, d = kv_shape
    return (b, query_shape[1], s, d)


def _sdpa_forward_flops(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, **kwargs: Any) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(
        query_shape, _expand_kv(query_shape, key_shape), _expand_kv(query_shape, value_shape)
    )


def _sdpa_backward_flops(
    grad_out_shape: Any, query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, **kwargs: Any
) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(
        grad_out_shape, query_shape, _expand_kv(query_shape, key_shape), _expand_kv(query_shape, value_shape)
    )


def attention_flop_formulas() -> dict[Any, Callable[..., int]]:
    """FlopCounterMode's SDPA formulas reject GQA (8 key/value heads vs 32 query heads) and do not
    know the CPU flash kernel; these count both."""
    aten = torch.ops.aten
    forward = [
        aten._scaled_dot_product_flash_attention,
        aten._scaled_dot_product_efficient_attention,
        aten._scaled_dot_product_cudnn_attention,
        aten._scaled_dot_product_flash_attention_for_cpu,
    ]
    backward = [
        aten._scaled_dot_product_flash_attention_backward,
        aten._scaled_dot_product_efficient_attention_backward,
        aten._scaled_dot_product_cudnn_attention_backward,
        aten._scaled_dot_product_flash_attention_for_cpu_backward,
    ]
    return {**dict.fromkeys(forward, _sdpa_forward_flops), **dict.fromkeys(backward, _sdpa_backward_flops)}


# --------------------------------------------------------------------------------------------
# Model, batch, step
# --------------------------------------------------------------------------------------------


@dataclass
class Setup:
    """Everything the variants share: the frozen parts, the encoded batch, the settings."""

    args: argparse.Namespace
    device: torch.device
    precision: str
    recipe: Recipe
    model_dir: Path
    layers: int
    vae: torch.nn.Module
    tokenizer: Any
    scheduler: Any
    policy_cfg: Any
    raw: dict[str, Any]
    encoded: list[Any]
    layout: Layout
    counts: ModelCounts
    mesh: Any = None
    first_encode_s_per_sample: float = math.nan
    t_start: float = field(default_factory=time.monotonic)

    @property
    def compute_bytes(self) -> int:
        return 2 if self.precision == "bf16" else 4

    @property
    def vae_bytes(self) -> int:
        return next(self.vae.parameters()).element_size()

    def elapsed(self) -> float:
        return time.monotonic() - self.t_start


def synthetic_batch(n: int, recipe: Recipe, seed: int) -> dict[str, Any]:
    """``n`` samples in the layout ``rlinf_cosmos3.data`` yields (collated): random pixels/actions."""
    g = torch.Generator().manual_seed(seed)
    frames = recipe.num_frames
    shape = (n, frames, 3, IMAGE_SIZE, IMAGE_SIZE)
    return {
        "image": torch.randint(0, 256, shape, dtype=torch.uint8, generator=g),
        "wrist_image": torch.randint(0, 256, shape, dtype=torch.uint8, generator=g),
        "actions": torch.rand(n, recipe.action_horizon, 10, generator=g) * 2 - 1,
        "action_is_pad": torch.zeros(n, recipe.action_horizon, dtype=torch.bool),
        "frame_is_pad": torch.zeros(n, frames, dtype=torch.bool),
        "state": torch.zeros(n, 8),
        "prompt": [PROMPT] * n,
        "index": torch.arange(n),
    }


def _read_component_config(model_dir: Path, component: str) -> dict[str, Any]:
    config = json.loads((model_dir / component / "config.json").read_text())
    return {k: v for k, v in config.items() if not k.startswith("_")}


def meta_transformer(model_dir: Path, layers: int) -> torch.nn.Module:
    """The directory's transformer config with ``num_hidden_layers=layers``, parameters on meta.

    As ``loading.build_transformer_on_meta`` builds it (accelerate's ``init_empty_weights``, real
    buffers), with the layer count overridden.
    """
    from accelerate import init_empty_weights
    from diffusers import Cosmos3OmniTransformer

    config = Cosmos3OmniTransformer.load_config(model_dir / "transformer")
    config["num_hidden_layers"] = layers
    with init_empty_weights(include_buffers=False):
        return Cosmos3OmniTransformer.from_config(config)


def count_model(
    model_dir: Path, trainable: str, keys_to_select: list[str], vae: torch.nn.Module
) -> ModelCounts:
    """Per-layer and root parameter counts of the real config, from a one-layer meta build."""
    from diffusers import Cosmos3OmniTransformer

    from rlinf_cosmos3.workers.actor.optim import select_trainable

    model = meta_transformer(model_dir, 1)
    if trainable == "recipe":
        select_trainable(model, keys_to_select)
    layer = list(model.layers[0].parameters())
    everything = list(model.parameters())
    layer_ids = {id(p) for p in layer}
    root = [p for p in everything if id(p) not in layer_ids]
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


@torch.no_grad()
def init_random_(transformer: torch.nn.Module, device: torch.device, seed: int) -> None:
    """Allocate the (sharded) meta parameters on ``device`` and fill them with sane random values.

    Values do not change the speed; the scale keeps a bf16 loss finite: weights N(0, 1/fan_in),
    norm weights 1, biases and other vectors 0. Written into each DTensor's local shard, so no
    DTensor random-number machinery is involved (the whole tensor at world size 1).
    """
    from torch.distributed.tensor import DTensor

    buffers = {name: b.detach().clone() for name, b in transformer.named_buffers() if not b.is_meta}
    transformer.to_empty(device=device)
    for name, value in buffers.items():
        transformer.get_buffer(name).copy_(value)
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, param in transformer.named_parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        if param.dim() >= 2:
            local.normal_(0.0, param.shape[-1] ** -0.5, generator=gen)
        elif name.endswith("weight"):
            local.fill_(1.0)
        else:
            local.zero_()


def build_policy(setup: Setup, variant: Variant, *, with_optimizer: bool = True) -> tuple[Any, Any]:
    """A freshly built, sharded, materialised policy for ``variant`` and its AdamW (or None)."""
    from rlinf_cosmos3.models.cosmos3.parallelize import ParallelizeConfig, parallelize
    from rlinf_cosmos3.models.cosmos3.policy import Cosmos3Policy
    from rlinf_cosmos3.workers.actor.optim import build_param_groups, select_trainable

    transformer = meta_transformer(setup.model_dir, setup.layers)
    policy = Cosmos3Policy(transformer, setup.vae, setup.tokenizer, setup.scheduler, setup.policy_cfg)
    parallelize(
        policy,
        setup.mesh,
        ParallelizeConfig(
            precision=setup.precision,
            activation_checkpointing=variant.activation_checkpointing,
            reshard_after_forward=variant.reshard_after_forward,
            compile_blocks=variant.compile,  # torchtitan's order: compile each block, then shard it
        ),
    )
    if variant.prefetch:
        layers = list(transformer.layers)
        for i, layer in enumerate(layers):
            layer.set_modules_to_forward_prefetch(layers[i + 1 : i + 1 + variant.prefetch])
            layer.set_modules_to_backward_prefetch(layers[max(0, i - variant.prefetch) : i][::-1])
    init_random_(transformer, setup.device, setup.args.seed)
    policy.train()
    if setup.args.trainable == "recipe":
        select_trainable(transformer, setup.recipe.keys_to_select)
    if not with_optimizer:
        return policy, None
    recipe = setup.recipe
    multipliers = recipe.lr_multipliers if setup.args.trainable == "recipe" else {}
    groups = build_param_groups(transformer, recipe.lr, recipe.weight_decay, multipliers)
    impl = {"fused": True} if variant.optimizer == "fused" else {"foreach": True}
    optimizer = torch.optim.AdamW(
        groups, lr=recipe.lr, betas=recipe.betas, eps=recipe.eps, weight_decay=recipe.weight_decay, **impl
    )
    return policy, optimizer


def slot_indexes(setup: Setup) -> list[list[int]]:
    """Which encoded sample each slot of each micro-batch uses (distinct samples cycled)."""
    n, b = len(setup.encoded), setup.layout.micro_batch
    return [[(a * b + i) % n for i in range(b)] for a in range(setup.layout.grad_accum)]


def _raw_subset(raw: dict[str, Any], indexes: list[int]) -> dict[str, Any]:
    index = torch.tensor(indexes)
    return {k: [v[i] for i in indexes] if isinstance(v, list) else v[index] for k, v in raw.items()}


def _generators(seed: int, step: int, slots: int, offset: int) -> list[torch.Generator]:
    """One CPU generator per sample, as the SFT worker seeds them (draws independent of the device)."""
    return [
        torch.Generator().manual_seed((seed * 1_000_003 + step) * 1_000_003 + offset + i)
        for i in range(slots)
    ]


def micro_batch_loss(setup: Setup, policy: Any, indexes: list[int], step: int, offset: int) -> torch.Tensor:
    """``sft_loss`` of one micro-batch: from the cached encoding, or encoding too (``--with-encode``)."""
    generators = _generators(setup.args.seed, step, len(indexes), offset)
    if setup.args.with_encode:
        loss, _ = policy.sft_loss(_raw_subset(setup.raw, indexes), generators)
    else:
        loss, _ = policy.loss_from_encoded([setup.encoded[i] for i in indexes], generators)
    return loss


def train_step(setup: Setup, policy: Any, optimizer: Any, step: int, timer: StepTimer) -> torch.Tensor:
    """One optimizer step as the SFT worker takes it (without EMA and LR schedule)."""
    from rlinf_cosmos3.workers.actor.optim import clip_grad_norm

    micro_batches = slot_indexes(setup)
    optimizer.zero_grad(set_to_none=True)
    losses = []
    for a, indexes in enumerate(micro_batches):
        loss = micro_batch_loss(setup, policy, indexes, step, a * len(indexes))
        (loss / len(micro_batches)).backward()
        losses.append(loss.detach())
    timer.mark()
    clip_grad_norm(policy.transformer, setup.recipe.clip_grad)
    optimizer.step()
    return torch.stack(losses).mean()


@contextmanager
def watch_transformer_calls(transformer: torch.nn.Module) -> Iterator[list[dict[str, int]]]:
    """Record the sequence layout of every transformer call (what it really sees)."""
    seen: list[dict[str, int]] = []

    def hook(_module: torch.nn.Module, _args: tuple, kwargs: dict[str, Any]) -> None:
        seen.append(
            {
                "sequence_length": int(kwargs["sequence_length"]),
                "text": int(kwargs["und_len"]),
                "vision": int(kwargs["vision_sequence_indexes"].numel()),
                "action": int(kwargs["action_sequence_indexes"].numel()),
            }
        )

    handle = transformer.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def count_flops(setup: Setup) -> dict[str, Any]:
    """FLOPs of one eager sample's forward + backward (FlopCounterMode), scaled to a step."""
    from torch.utils.flop_counter import FlopCounterMode

    policy, _ = build_policy(setup, Variant(name="flops"), with_optimizer=False)
    mode = FlopCounterMode(display=False, custom_mapping=attention_flop_formulas())
    with watch_transformer_calls(policy.transformer) as seen, mode:
        loss, _ = policy.loss_from_encoded([setup.encoded[0]], _generators(setup.args.seed, 0, 1, 0))
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
    layout, counts = setup.layout, setup.counts
    six_nt = 6 * setup.layers * (counts.layer_params // 2) * layout.tokens_per_step
    return {
        "per_sample": per_sample,
        "per_step": per_sample * layout.samples_per_step,
        "by_op_per_sample": by_op,
        "six_nt_per_step": six_nt,
        "transformer_call": seen[0],
        "note": "FlopCounterMode on one eager sample (forward+backward), x samples/step; matmuls and SDPA "
        "(GQA-expanded), causal counted as full; no elementwise, optimizer or recompute FLOPs",
    }


def measure_encode(setup: Setup, policy_cls: Any) -> float:
    """Seconds per sample of ``encode_batch`` (the frozen VAE/tokenizer part of ``sft_loss``).

    On GPU a second, warm pass over one micro-batch; on CPU the set-up's encode (minutes otherwise).
    """
    if setup.device.type != "cuda":
        return setup.first_encode_s_per_sample
    transformer = meta_transformer(setup.model_dir, 1)
    policy = policy_cls(transformer, setup.vae, setup.tokenizer, setup.scheduler, setup.policy_cfg)
    n = min(len(setup.encoded), setup.layout.micro_batch)
    synchronize(setup.device)
    t0 = time.perf_counter()
    policy.encode_batch(_raw_subset(setup.raw, list(range(n))))
    synchronize(setup.device)
    return (time.perf_counter() - t0) / n


def run_variant(setup: Setup, variant: Variant, flops_per_step: int, matmul_rate: float) -> dict[str, Any]:
    """Build, warm up, time; the measured figures of one variant."""
    device, args, layout = setup.device, setup.args, setup.layout
    t0 = time.perf_counter()
    policy, optimizer = build_policy(setup, variant)
    synchronize(device)
    build_s = time.perf_counter() - t0
    static_gib = torch.cuda.memory_allocated(device) / GIB if device.type == "cuda" else None
    free_memory(device)
    timer = StepTimer(device)
    t0 = time.perf_counter()
    warmup = args.warmup + (1 if variant.compile else 0)  # compiled backward settles a step later
    for step in range(warmup):
        timer.start()
        train_step(setup, policy, optimizer, step, timer)
        timer.stop()
        logger.info("[%6.1fs] %s: warm-up step %d/%d done", setup.elapsed(), variant.name, step + 1, warmup)
    warmup_s = time.perf_counter() - t0
    totals, fwd_bwd, optim, losses = [], [], [], []
    for step in range(warmup, warmup + args.steps):
        timer.start()
        loss = train_step(setup, policy, optimizer, step, timer)
        total, first, second = timer.stop()
        totals.append(total)
        fwd_bwd.append(first)
        optim.append(second)
        losses.append(float(loss))
    step_s = statistics.median(totals)
    result: dict[str, Any] = {
        "name": variant.name,
        "features": variant.features,
        "variant": asdict(variant),
        "status": "ok",
        "build_s": build_s,
        "warmup_s": warmup_s,
        "step_times_s": totals,
        "step_time_s": step_s,
        "fwd_bwd_s": statistics.median(fwd_bwd),
        "optimizer_s": statistics.median(optim),
        "tokens_per_step": layout.tokens_per_step,
        "tokens_per_s": layout.tokens_per_step / step_s,
        "samples_per_s": layout.samples_per_step / step_s,
        "flops_per_step": flops_per_step,
        "achieved_flops_per_s": flops_per_step / step_s,
        "mfu": flops_per_step / step_s / matmul_rate,
        "losses": losses,
        "loss_finite": all(math.isfinite(x) for x in losses),
        "estimated_peak_gib": estimate_peak_bytes(
            setup.counts, setup.layers, layout, variant, setup.compute_bytes, setup.vae_bytes
        )
        / GIB,
    }
    if device.type == "cuda":
        result["static_allocated_gib"] = static_gib
        result["peak_allocated_gib"] = torch.cuda.max_memory_allocated(device) / GIB
        result["peak_reserved_gib"] = torch.cuda.max_memory_reserved(device) / GIB
        result["peak_memory_gib"] = result["peak_allocated_gib"]
    else:
        result["peak_memory_gib"] = peak_rss_gib()  # process peak RSS: cumulative over variants on CPU
    return result


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def si(value: float, unit: str = "") -> str:
    """``412.3T``-style numbers, so GPU and CPU runs read in one format."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{prefix}{unit}"
    return f"{value:.3g}{unit}"


def format_table(report: dict[str, Any]) -> str:
    """The short summary printed last (the remote call returns only the tail of the output)."""
    m, lay, fl, mm = report["model"], report["layout"], report["flops"], report["matmul"]
    lines = [
        f"sft_step | {report['device']['name']} | torch {report['versions']['torch']} | {report['precision']} | "
        f"{m['preset']} width, {m['layers']}/{m['config_layers']} layers, {si(m['params'])} params, "
        f"{si(m['trainable'])} trainable ({m['trainable_mode']})",
        f"step = {lay['micro_batch']} samples x {lay['grad_accum']} accum = {lay['samples_per_step']} samples; "
        f"tokens/sample {lay['tokens_per_sample']} = text {lay['text_tokens']} + vision {lay['vision_tokens']} "
        f"({lay['noisy_vision_tokens']} noisy) + action {lay['action_tokens']}; {lay['tokens_per_step']} tokens/step",
        f"matmul {mm['size']}^3 {mm['dtype']}: {si(mm['flops_per_s'], 'FLOP/s')} | FLOPs/step {si(fl['per_step'])} "
        f"({fl['source']}), 6NT {si(fl['six_nt_per_step'])} | VAE encode (not in the step unless --with-encode) "
        f"{report['encode_s_per_sample']:.3f} s/sample",
        "",
        f"{'variant':<18} {'features':<24} {'step s':>7} {'fwd+bwd':>7} {'optim':>6} {'tok/s':>7} {'smp/s':>6} "
        f"{'FLOP/s':>7} {'MFU':>6} {'peak GiB':>8} {'rsv GiB':>7} {'est GiB':>7}",
    ]
    for v in report["variants"]:
        head = f"{v['name']:<18} {v['features']:<24}"
        if v["status"] != "ok":
            lines.append(f"{head} {v['status']}: {v.get('error', '')[:70]}")
            continue
        lines.append(
            f"{head} {v['step_time_s']:>7.3f} {v['fwd_bwd_s']:>7.3f} {v['optimizer_s']:>6.3f} "
            f"{si(v['tokens_per_s']):>7} {v['samples_per_s']:>6.2f} {si(v['achieved_flops_per_s']):>7} "
            f"{v['mfu']:>6.1%} {v['peak_memory_gib']:>8.1f} {_fmt(v.get('peak_reserved_gib'), '.1f'):>7} "
            f"{v['estimated_peak_gib']:>7.1f}" + ("" if v["loss_finite"] else "  (loss not finite)")
        )
    if report["device"]["type"] != "cuda":
        lines.append(
            "(CPU: peak GiB is the process's peak RSS so far; est GiB models a GPU's allocated peak)"
        )
    lines.append(f"json: {report['out']}")
    return "\n".join(lines)


def _device_slug(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device).lower().replace("nvidia", "")
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "cuda"


def _versions() -> dict[str, str]:
    import diffusers

    return {
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "cuda": str(torch.version.cuda),
        "python": platform.python_version(),
    }


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"]
    )
    p.add_argument(
        "--preset", default="nano", choices=["nano", "tiny"], help="architecture of the generated model dir"
    )
    p.add_argument("--model-dir", type=Path, help="an existing diffusers Cosmos3 dir (configs are enough)")
    p.add_argument(
        "--layers",
        default=None,
        help=f"decoder layers, or 'auto' (default: nano {NANO_DEFAULT_LAYERS}, tiny its 2)",
    )
    p.add_argument(
        "--variants",
        default=DEFAULT_VARIANTS,
        help="comma-separated: base (foreach AdamW), fused, ac, compile, noreshard, prefetch[N], or '+'-joined "
        f"(default {DEFAULT_VARIANTS})",
    )
    p.add_argument("--trainable", default="recipe", choices=["recipe", "all"])
    p.add_argument(
        "--micro-batch", type=int, help="samples per forward/backward (default: 4 on GPU, 1 on CPU)"
    )
    p.add_argument(
        "--grad-accum", type=int, help="micro-batches per optimizer step (default: 4 on GPU, 2 on CPU)"
    )
    p.add_argument(
        "--distinct-samples", type=int, help="samples encoded and cycled (default: all on GPU, 1 on CPU)"
    )
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--with-encode", action="store_true", help="time the whole sft_loss, VAE encode included")
    p.add_argument("--matmul-size", type=int, help="default 8192 on GPU, 1024 on CPU")
    p.add_argument(
        "--memory-target-gib", type=float, default=DEFAULT_MEMORY_TARGET_GIB, help="for --layers auto"
    )
    p.add_argument(
        "--time-budget-s", type=float, default=DEFAULT_TIME_BUDGET_S, help="skip variants not started by then"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--out", type=Path, help="JSON path (default benchmarks/results/sft_step_<device>_<date>.json)"
    )
    args = p.parse_args(argv)
    on_gpu = args.device == "cuda"
    args.micro_batch = args.micro_batch or (4 if on_gpu else 1)
    args.grad_accum = args.grad_accum or (4 if on_gpu else 2)
    args.matmul_size = args.matmul_size or (8192 if on_gpu else 1024)
    samples = args.micro_batch * args.grad_accum
    args.distinct_samples = min(args.distinct_samples or (samples if on_gpu else 1), samples)
    if min(args.micro_batch, args.grad_accum, args.distinct_samples, args.steps) < 1 or args.warmup < 0:
        p.error("--micro-batch, --grad-accum, --distinct-samples and --steps must be >= 1, --warmup >= 0")
    return args


def prepare(args: argparse.Namespace, device: torch.device, variants: list[Variant], workdir: Path) -> Setup:
    """Model dir, frozen parts, encoded batch, layout, counts, layer count, mesh."""
    from torch.distributed.device_mesh import init_device_mesh

    from rlinf_cosmos3.models.cosmos3 import loading
    from rlinf_cosmos3.models.cosmos3.policy import Cosmos3Policy, PolicyConfig
    from rlinf_cosmos3.models.cosmos3.tiny import random_vae, write_model_dir

    recipe = load_recipe()
    precision = "bf16" if device.type == "cuda" else "fp32"
    model_dir = args.model_dir or write_model_dir(workdir / args.preset, preset=args.preset, seed=args.seed)
    vae_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # as the SFT worker loads it
    vae = random_vae(_read_component_config(model_dir, "vae"), device=device, dtype=vae_dtype, seed=args.seed)
    vae.requires_grad_(False)
    policy_cfg = PolicyConfig(
        fps=recipe.fps,
        action_horizon=recipe.action_horizon,
        canvas_height=recipe.canvas_height,
        canvas_width=recipe.canvas_width,
        loss_scale=recipe.loss_scale,
        action_loss_weight=recipe.action_loss_weight,
        precision="bf16" if precision == "bf16" else None,
    )
    tokenizer, scheduler = loading.load_tokenizer(model_dir), loading.load_scheduler(model_dir)
    encoder = Cosmos3Policy(meta_transformer(model_dir, 1), vae, tokenizer, scheduler, policy_cfg)
    raw = synthetic_batch(args.distinct_samples, recipe, args.seed)
    t0 = time.perf_counter()
    encoded = encoder.encode_batch(raw)
    first_encode_s = (time.perf_counter() - t0) / len(encoded)
    for sample in encoded:  # a random bf16 VAE may overflow; the values do not change the speed
        if not bool(torch.isfinite(sample.x0_vision).all()):
            logger.warning("random VAE latents not finite; using N(0, 1) latents of the same shape")
            sample.x0_vision = torch.randn_like(sample.x0_vision)
    first = encoded[0]
    inputs = encoder.transformer_inputs(first.input_ids, first.x0_vision, first.x0_action, 500.0)
    layout = Layout(
        text_tokens=int(inputs["und_len"]),
        vision_tokens=int(inputs["vision_sequence_indexes"].numel()),
        noisy_vision_tokens=int(inputs["vision_mse_loss_indexes"].numel()),
        action_tokens=int(inputs["action_sequence_indexes"].numel()),
        micro_batch=args.micro_batch,
        grad_accum=args.grad_accum,
    )
    if layout.tokens_per_sample != int(inputs["sequence_length"]):
        raise AssertionError(
            f"layout {layout} does not add up to sequence_length {inputs['sequence_length']}"
        )
    counts = count_model(model_dir, args.trainable, recipe.keys_to_select, vae)
    del encoder, inputs
    setup = Setup(
        args=args,
        device=device,
        precision=precision,
        recipe=recipe,
        model_dir=model_dir,
        layers=0,
        vae=vae,
        tokenizer=tokenizer,
        scheduler=scheduler,
        policy_cfg=policy_cfg,
        raw=raw,
        encoded=encoded,
        layout=layout,
        counts=counts,
        mesh=init_device_mesh(device.type, (1,)),
        first_encode_s_per_sample=first_encode_s,
    )
    if args.layers in (None, ""):
        setup.layers = NANO_DEFAULT_LAYERS if args.preset == "nano" else counts.config_layers
    elif args.layers == "auto":
        setup.layers = auto_layers(
            counts, layout, variants, args.memory_target_gib * GIB, setup.compute_bytes, setup.vae_bytes
        )
    else:
        setup.layers = int(args.layers)
        if setup.layers < 1:
            raise ValueError(f"--layers must be >= 1 or 'auto', got {args.layers}")
    return setup


def count_flops_or_estimate(setup: Setup) -> dict[str, Any]:
    """:func:`count_flops`, or the 6NT estimate if counting fails (the one-shot GPU run goes on)."""
    try:
        flops = count_flops(setup)
        flops["source"] = "FlopCounterMode"
    except Exception as exc:  # noqa: BLE001 - MFU from 6NT beats losing the whole run
        logger.exception("[%6.1fs] FLOP counting failed; MFU falls back to 6NT", setup.elapsed())
        free_memory(setup.device)
        six_nt = 6 * setup.layers * (setup.counts.layer_params // 2) * setup.layout.tokens_per_step
        flops = {
            "per_step": six_nt,
            "six_nt_per_step": six_nt,
            "source": "6NT fallback",
            "error": f"{type(exc).__name__}: {exc}"[:300],
        }
    logger.info(
        "[%6.1fs] FLOPs/step %s (%s), 6NT %s",
        setup.elapsed(),
        si(flops["per_step"]),
        flops["source"],
        si(flops["six_nt_per_step"]),
    )
    return flops


def run_variants(setup: Setup, variants: Sequence[Variant], flops_per_step: int, rate: float) -> list[dict]:
    """Every variant in turn on a fresh model; a failure (OOM, compile error) is recorded, not fatal."""
    results: list[dict[str, Any]] = []
    for variant in variants:
        head = {"name": variant.name, "features": variant.features}
        if setup.elapsed() > setup.args.time_budget_s:
            logger.info("[%6.1fs] %s: skipped (time budget)", setup.elapsed(), variant.name)
            results.append(
                {**head, "status": "skipped", "error": f"time budget {setup.args.time_budget_s:.0f}s spent"}
            )
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
                "[%6.1fs] %s: step %.3f s, %s tokens/s, MFU %.1f%%, peak %.1f GiB",
                setup.elapsed(),
                variant.name,
                result["step_time_s"],
                si(result["tokens_per_s"]),
                100 * result["mfu"],
                result["peak_memory_gib"],
            )
    return results


def measure(setup: Setup, variants: Sequence[Variant]) -> dict[str, Any]:
    """Matmul rate, encode time, FLOPs per step, then the variants: the report's measured part."""
    from rlinf_cosmos3.models.cosmos3.policy import Cosmos3Policy

    layout, counts = setup.layout, setup.counts
    estimates = {
        v.name: estimate_peak_bytes(counts, setup.layers, layout, v, setup.compute_bytes, setup.vae_bytes)
        / GIB
        for v in variants
    }
    logger.info(
        "[%6.1fs] %d layers, %d tokens/sample, %d samples/step; estimated peak GiB: %s",
        setup.elapsed(),
        setup.layers,
        layout.tokens_per_sample,
        layout.samples_per_step,
        ", ".join(f"{name} {gib:.1f}" for name, gib in estimates.items()),
    )
    dtype = torch.bfloat16 if setup.precision == "bf16" else torch.float32
    matmul = measure_matmul(setup.device, dtype, setup.args.matmul_size)
    logger.info("[%6.1fs] matmul %s", setup.elapsed(), si(matmul["flops_per_s"], "FLOP/s"))
    encode_s = measure_encode(setup, Cosmos3Policy)
    logger.info("[%6.1fs] VAE encode %.3f s/sample", setup.elapsed(), encode_s)
    flops = count_flops_or_estimate(setup)
    results = run_variants(setup, variants, flops["per_step"], matmul["flops_per_s"])
    return {"matmul": matmul, "encode_s_per_sample": encode_s, "flops": flops, "variants": results}


def build_report(
    setup: Setup, measured: dict[str, Any], out: Path, argv: Sequence[str] | None
) -> dict[str, Any]:
    """The JSON document: settings, model, layout, and everything measured."""
    args, device, counts, layout = setup.args, setup.device, setup.counts, setup.layout
    cuda = device.type == "cuda"
    return {
        "benchmark": "sft_step",
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "argv": list(argv) if argv is not None else sys.argv[1:],
        "device": {
            "type": device.type,
            "name": torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu",
            "total_memory_gib": torch.cuda.get_device_properties(device).total_memory / GIB if cuda else None,
            "cpu_threads": torch.get_num_threads(),
        },
        "versions": _versions(),
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
            "samples_per_step": layout.samples_per_step,
            "tokens_per_step": layout.tokens_per_step,
            "distinct_samples": len(setup.encoded),
            "with_encode": args.with_encode,
        },
        "recipe": asdict(setup.recipe),
        **measured,
        "wall_s": setup.elapsed(),
        "out": str(out),
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; returns the report (also written as JSON and printed as a table, last)."""
    t_start = time.monotonic()
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr
    )
    logging.getLogger("rlinf_cosmos3").setLevel(logging.WARNING)
    variants = parse_variants(args.variants)
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # before CUDA starts
    torch.manual_seed(args.seed)
    init_distributed(device)
    import torch.distributed as dist

    try:
        with tempfile.TemporaryDirectory(prefix="sft_step_") as workdir:
            setup = prepare(args, device, variants, Path(workdir))
            setup.t_start = t_start
            measured = measure(setup, variants)
    finally:
        dist.destroy_process_group()

    date = dt.datetime.now().strftime("%Y%m%d")
    out = args.out or RESULTS_DIR / f"sft_step_{_device_slug(device)}_{date}.json"
    report = build_report(setup, measured, out, argv)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    sys.stderr.flush()
    print(format_table(report), flush=True)
    return report


if __name__ == "__main__":
    main()

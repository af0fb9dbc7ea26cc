"""Load the pieces of a diffusers Cosmos3 directory, including a transformer that never sits whole on a GPU.

A diffusers Cosmos3 directory holds ``transformer/``, ``vae/``, ``text_tokenizer/`` and
``scheduler/``. The small pieces load with their classes' own ``from_pretrained``. The
transformer (15B for Nano) has two ways in:

* :func:`load_transformer` - diffusers' ``from_pretrained``, whole, on one device (tests, the
  embedded eval backend, single-GPU runs);
* ``load_to_device: false`` - :func:`build_transformer_on_meta` builds it from its config with
  parameters on the meta device, the caller shards it (FSDP2 ``fully_shard``), then
  :func:`load_transformer_weights` materialises each rank's shards and fills them: rank 0 reads
  the safetensors file by file and ``set_model_state_dict(..., full_state_dict=True,
  broadcast_from_rank0=True)`` broadcasts tensor by tensor, every rank keeping only its shard.
  No rank ever holds the whole model on its device, and rank 0's host holds one safetensors file
  at a time.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from diffusers import AutoencoderKLWan, Cosmos3OmniTransformer, UniPCMultistepScheduler
from safetensors import safe_open
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.tensor import DTensor
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from rlinf_cosmos3.models.cosmos3.components import (  # the names are re-exported: callers import them from here
    SCHEDULER_DIR,
    TOKENIZER_DIR,
    TRANSFORMER_DIR,
    VAE_DIR,
    missing_components,
)

logger = logging.getLogger(__name__)

WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"
WEIGHTS_INDEX_NAME = "diffusion_pytorch_model.safetensors.index.json"


def check_model_dir(model_dir: str | Path) -> Path:
    """The directory, after checking it has every component; the error lists what is missing."""
    root = Path(model_dir).expanduser()
    missing = missing_components(root, transformer_config=False)  # the components, as before
    if missing:
        raise FileNotFoundError(f"'{root}' is not a complete diffusers Cosmos3 directory: missing {missing}")
    return root


def load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerBase:
    """The text tokenizer (Qwen-style, with a chat template) the pipeline tokenizes prompts with."""
    return AutoTokenizer.from_pretrained(check_model_dir(model_dir) / TOKENIZER_DIR)


def load_scheduler(model_dir: str | Path) -> UniPCMultistepScheduler:
    """The inference scheduler, as the pipeline loads it (its config also names the flow shift)."""
    return UniPCMultistepScheduler.from_pretrained(check_model_dir(model_dir) / SCHEDULER_DIR)


def load_vae(
    model_dir: str | Path, *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> AutoencoderKLWan:
    """The frozen video VAE: eval mode, no gradients, replicated on every rank (never sharded)."""
    vae = AutoencoderKLWan.from_pretrained(check_model_dir(model_dir) / VAE_DIR, torch_dtype=dtype)
    vae.to(device).eval().requires_grad_(False)
    return vae


def load_transformer(
    model_dir: str | Path, *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> Cosmos3OmniTransformer:
    """The whole transformer via diffusers (``time_embedder`` stays fp32, as diffusers keeps it)."""
    transformer = Cosmos3OmniTransformer.from_pretrained(
        check_model_dir(model_dir) / TRANSFORMER_DIR, torch_dtype=dtype
    )
    return transformer.to(device)


def build_transformer_on_meta(model_dir: str | Path) -> Cosmos3OmniTransformer:
    """The transformer from its config with parameters on ``meta`` (no memory), buffers real on CPU.

    accelerate's ``init_empty_weights`` (the context diffusers itself uses for low-memory loads)
    puts only parameters on meta, so the non-persistent rotary ``inv_freq`` buffer - which no
    checkpoint carries - keeps its computed values; :func:`load_transformer_weights` restores it
    after materialising.
    """
    from accelerate import init_empty_weights

    config = Cosmos3OmniTransformer.load_config(check_model_dir(model_dir) / TRANSFORMER_DIR)
    with init_empty_weights(include_buffers=False):
        transformer = Cosmos3OmniTransformer.from_config(config)
    return transformer


def transformer_weight_files(model_dir: str | Path) -> list[Path]:
    """The transformer's safetensors files: one file, or the shards its index lists."""
    folder = check_model_dir(model_dir) / TRANSFORMER_DIR
    index = folder / WEIGHTS_INDEX_NAME
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [folder / name for name in sorted(set(weight_map.values()))]
    single = folder / WEIGHTS_NAME
    if not single.is_file():
        raise FileNotFoundError(f"no transformer weights in '{folder}' ({WEIGHTS_NAME} or {WEIGHTS_INDEX_NAME})")
    return [single]


def iter_weight_files(files: list[Path]) -> Iterator[dict[str, torch.Tensor]]:
    """The state dict one safetensors file at a time (CPU tensors, saved dtype)."""
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            yield {key: handle.get_tensor(key) for key in handle.keys()}


def _checkpoint_keys(files: list[Path]) -> set[str]:
    keys: set[str] = set()
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            keys.update(handle.keys())
    return keys


def _key_mismatch(model_keys: set[str], checkpoint_keys: set[str]) -> str | None:
    missing, unexpected = sorted(model_keys - checkpoint_keys), sorted(checkpoint_keys - model_keys)
    if not missing and not unexpected:
        return None
    return f"transformer checkpoint does not match the model: missing {missing[:8]}, unexpected {unexpected[:8]}"


def _materialize(model: nn.Module, device: torch.device) -> None:
    """Allocate meta parameters on ``device`` and put back the buffers the build computed."""
    buffers = {name: b.detach().clone() for name, b in model.named_buffers() if not b.is_meta}
    model.to_empty(device=device)
    with torch.no_grad():
        for name, value in buffers.items():
            model.get_buffer(name).copy_(value)


def load_transformer_weights(
    model: nn.Module, model_dir: str | Path, *, device: torch.device | str | None = None
) -> None:
    """Fill a (possibly meta, possibly FSDP2-sharded) transformer with the directory's weights.

    Every rank calls this. Tensors are cast to each parameter's dtype (e.g. bf16 files into fp32
    master weights). Without ``torch.distributed`` it loads the same way in one process. The key
    sets must match exactly; a mismatch raises on every rank.
    """
    files = transformer_weight_files(model_dir)
    distributed = dist.is_available() and dist.is_initialized()
    is_source = not distributed or dist.get_rank() == 0
    if any(p.is_meta for p in model.parameters()):
        target = torch.device(device) if device is not None else torch.device("cpu")
        _materialize(model, target)

    local = model.state_dict()
    model_keys = set(local)
    error = _key_mismatch(model_keys, _checkpoint_keys(files)) if is_source else None
    if distributed:
        box = [error]
        dist.broadcast_object_list(box, src=0)
        error = box[0]
    if error is not None:
        raise KeyError(error)

    sharded = distributed and any(isinstance(p, DTensor) for p in model.parameters())
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    num_files = len(files) if is_source else 0
    if distributed:  # an object broadcast: NCCL groups take no CPU tensors
        box = [num_files]
        dist.broadcast_object_list(box, src=0)
        num_files = box[0]
    shards = iter_weight_files(files) if is_source else iter([])
    for _ in range(int(num_files)):
        shard = next(shards) if is_source else {}
        shard = {key: value.to(local[key].dtype) for key, value in shard.items()}
        if sharded:
            set_model_state_dict(model, shard, options=options)
        elif distributed:
            # Replicated (unsharded) model on several ranks: everyone loads rank 0's tensors.
            box = [shard]
            dist.broadcast_object_list(box, src=0)
            model.load_state_dict(box[0], strict=False)
        else:
            model.load_state_dict(shard, strict=False)
        del shard
    logger.info("loaded transformer weights from %d file(s) in '%s'", len(files), model_dir)

"""SFT checkpoint -> servable diffusers directory (what SGLang and diffusers load).

The trained transformer replaces the base directory's ``transformer/``; every other component
(VAE, tokenizer, scheduler, ``model_index.json``) is copied from the base unchanged. Unlike the
reference's four-step route through cosmos-framework (strip prefixes, DCP, HF export, split),
our checkpoints already hold diffusers' own state-dict keys, so this is one step.

The training identity the SFT run wrote into the checkpoint (``global_step_<N>/model_identity.json``:
fps, horizon, frames, canvas, view point, normalisation, stats hash, domain) goes to the root of the
output, where evaluation checks its settings against it. A checkpoint made before identities were
recorded converts with a warning, and the output has no identity (never the base's: a base
directory's own ``model_identity.json`` is not copied).
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from pathlib import Path

import torch

from rlinf_cosmos3.checkpoint.layout import FULL_WEIGHTS, FULL_WEIGHTS_EMA, parse_step
from rlinf_cosmos3.checkpoint.load import load_full_weights
from rlinf_cosmos3.models.cosmos3.identity import IDENTITY_FILE, ModelIdentity, read_identity, write_identity

logger = logging.getLogger(__name__)

TRANSFORMER_DIR = "transformer"
DTYPES = {"as-trained": None, "bf16": torch.bfloat16, "fp32": torch.float32}


def export_diffusers(
    full_weights: str | Path,
    base_dir: str | Path,
    out_dir: str | Path,
    *,
    use_ema: bool = False,
    dtype: str = "as-trained",
    overwrite: bool = False,
) -> Path:
    """Write ``out_dir`` (complete or absent: built under a temporary name, renamed last)."""
    from diffusers import Cosmos3OmniTransformer

    base_dir, out_dir = Path(base_dir), Path(out_dir)
    if not (base_dir / "model_index.json").is_file():
        raise FileNotFoundError(f"base '{base_dir}' is not a diffusers model directory (no model_index.json)")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"'{out_dir}' exists; pass overwrite=True (--overwrite) to replace it")
    identity = checkpoint_identity(full_weights)
    state = load_full_weights(resolve_weights_file(full_weights, use_ema), ema=use_ema)
    target = DTYPES[dtype]
    if target is not None:
        state = {k: v.to(target) if v.is_floating_point() else v for k, v in state.items()}

    config = Cosmos3OmniTransformer.load_config(base_dir / TRANSFORMER_DIR)
    with torch.device("meta"):
        transformer = Cosmos3OmniTransformer.from_config(config)
    missing, unexpected = transformer.load_state_dict(state, strict=False, assign=True)
    # Non-persistent buffers (rotary inv_freq) are not in any state dict: rebuild them on CPU.
    missing = [k for k in missing if k in dict(transformer.named_parameters())]
    if missing or unexpected:
        raise KeyError(
            f"checkpoint does not match the base transformer: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    _rebuild_meta_buffers(transformer, config)

    tmp = out_dir.parent / f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        shutil.copytree(base_dir, tmp, ignore=shutil.ignore_patterns(TRANSFORMER_DIR, IDENTITY_FILE))
        transformer.save_pretrained(tmp / TRANSFORMER_DIR, safe_serialization=True, max_shard_size="5GB")
        if identity is not None:
            write_identity(tmp, identity)
        if out_dir.exists():
            old = out_dir.parent / f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(out_dir, old)
            os.rename(tmp, out_dir)
            shutil.rmtree(old)
        else:
            os.rename(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    logger.info(
        "exported %s (%s weights, %d tensors) -> %s",
        full_weights,
        "EMA" if use_ema else "regular",
        len(state),
        out_dir,
    )
    return out_dir


def checkpoint_identity(src: str | Path) -> ModelIdentity | None:
    """The training identity of the checkpoint holding ``src`` (a ``global_step_<N>`` dir or a weights
    file inside one); ``None``, with a warning, when it has none."""
    src = Path(src).resolve()
    step_dir = next((p for p in (src, *src.parents[:3]) if parse_step(p) is not None and p.is_dir()), None)
    identity = read_identity(step_dir) if step_dir is not None else None
    if identity is None:
        where = f"checkpoint {step_dir}" if step_dir is not None else f"'{src}' (not inside a global_step_<N> dir)"
        logger.warning("%s has no %s (made before identities were recorded?): the converted model gets none, so "
                       "evaluation cannot check its settings against the training", where, IDENTITY_FILE)
    return identity


def resolve_weights_file(src: str | Path, use_ema: bool) -> Path:
    """``full_weights.pt`` -> its ``full_weights_ema.pt`` sibling when the EMA is asked for."""
    src = Path(src)
    if use_ema and src.is_file() and src.name == FULL_WEIGHTS:
        ema = src.with_name(FULL_WEIGHTS_EMA)
        if not ema.is_file():
            raise FileNotFoundError(
                f"--use-ema-weights: no {FULL_WEIGHTS_EMA} beside {src} (was EMA disabled?)"
            )
        return ema
    return src


def _rebuild_meta_buffers(transformer: torch.nn.Module, config: dict) -> None:
    """Buffers still on meta after ``assign`` loading come from a CPU build of the same config."""
    meta = {name for name, buf in transformer.named_buffers() if buf.is_meta}
    if not meta:
        return
    from accelerate import init_empty_weights
    from diffusers import Cosmos3OmniTransformer

    with init_empty_weights(include_buffers=False):
        reference = Cosmos3OmniTransformer.from_config(config)
    buffers = dict(reference.named_buffers())
    for name in meta:
        module_name, _, buf_name = name.rpartition(".")
        module = transformer.get_submodule(module_name) if module_name else transformer
        module.register_buffer(buf_name, buffers[name].clone(), persistent=name in transformer.state_dict())

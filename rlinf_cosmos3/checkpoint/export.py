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
import pickle
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from rlinf_cosmos3.checkpoint import disk
from rlinf_cosmos3.checkpoint.errors import CheckpointError, InsufficientSpaceError
from rlinf_cosmos3.checkpoint.layout import (
    FULL_WEIGHTS,
    FULL_WEIGHTS_EMA,
    is_complete_checkpoint,
    list_checkpoints,
    parse_step,
)
from rlinf_cosmos3.checkpoint.load import load_full_weights
from rlinf_cosmos3.models.cosmos3.components import MODEL_INDEX, TRANSFORMER_DIR, missing_components
from rlinf_cosmos3.models.cosmos3.identity import IDENTITY_FILE, ModelIdentity, read_identity, write_identity

logger = logging.getLogger(__name__)

DTYPES = {"as-trained": None, "bf16": torch.bfloat16, "fp32": torch.float32}
BASE_FIX = "pass as --base the diffusers directory the SFT run started from (its actor.model.model_path)"
OUT_FIX = "free space on that filesystem, or pass an --out on one with room"


class ConversionError(ValueError):
    """An input the converter cannot use: says which one, why, and what to pass instead."""


@dataclass
class _ExportPlan:
    """Everything checked and built before a byte is written: what goes where, and the room it needs."""

    source: Path
    base_dir: Path
    out_dir: Path
    transformer: torch.nn.Module
    identity: ModelIdentity | None
    needed: int
    tensors: int


def _plan_export(full_weights: str | Path, base_dir: Path, out_dir: Path, use_ema: bool, dtype: str,
                 overwrite: bool) -> _ExportPlan:
    """The inputs checked (base, dtype, output, source), the trained transformer built on the base's config
    (another model's weights refused), and the room on ``out_dir``'s filesystem checked."""
    from diffusers import Cosmos3OmniTransformer

    if not (base_dir / MODEL_INDEX).is_file():
        raise FileNotFoundError(f"base '{base_dir}' is not a diffusers model directory (no {MODEL_INDEX}); {BASE_FIX}")
    missing_parts = missing_components(base_dir)  # the output is a copy of the base: it would lack them too
    if missing_parts:
        raise FileNotFoundError(f"base '{base_dir}' is not a complete diffusers Cosmos3 directory: it lacks "
                                f"{missing_parts}; {BASE_FIX}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"'{out_dir}' exists; pass overwrite=True (--overwrite) to replace it")
    source = check_source(full_weights, use_ema)
    weights_file = resolve_weights_file(source, use_ema)
    identity = checkpoint_identity(source)
    state = _load_state(weights_file, use_ema)
    target = DTYPES[dtype]
    if target is not None:
        state = {k: v.to(target) if v.is_floating_point() else v for k, v in state.items()}

    config = Cosmos3OmniTransformer.load_config(base_dir / TRANSFORMER_DIR)
    with torch.device("meta"):
        transformer = Cosmos3OmniTransformer.from_config(config)
    other_model = f"the checkpoint '{source}' is of another model than the base '{base_dir}'"
    try:
        missing, unexpected = transformer.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as err:  # same names, other shapes: another width or head size
        shapes = [line.strip() for line in str(err).splitlines() if "size mismatch" in line]
        raise ConversionError(f"{other_model}: {'; '.join(shapes[:3]) or err}; {BASE_FIX}") from err
    # Non-persistent buffers (rotary inv_freq) are not in any state dict: rebuild them on CPU.
    missing = [k for k in missing if k in dict(transformer.named_parameters())]
    if missing or unexpected:
        raise ConversionError(f"{other_model} (checkpoint does not match the base transformer: missing "
                              f"{missing[:5]}, unexpected {unexpected[:5]}); {BASE_FIX}")
    _rebuild_meta_buffers(transformer, config)
    needed = output_bytes(base_dir, state)
    try:  # before anything is written: a disk without room refuses here, not halfway through the copy
        disk.require_free_space(out_dir.parent, needed, what=f"the converted model '{out_dir.name}'", fix=OUT_FIX)
    except InsufficientSpaceError as err:
        raise ConversionError(f"--out: {err}") from err
    return _ExportPlan(source, base_dir, out_dir, transformer, identity, needed, len(state))


@contextmanager
def _temp_output(plan: _ExportPlan) -> Iterator[Path]:
    """A temporary directory beside the output, removed whatever happens (after the rename it no longer
    exists): so ``out_dir`` is complete or untouched. A disk that filled up meanwhile (another writer) is an
    input error, :class:`ConversionError`; any other failure propagates as it is."""
    out_dir = plan.out_dir
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        yield tmp
    except Exception as err:
        if not disk.is_proven_full(err):
            raise
        raise ConversionError(
            f"--out: the filesystem of '{out_dir.parent}' filled up while writing the converted model "
            f"({disk.full_disk_cause(err)}; about {disk.format_bytes(plan.needed)} needed); the partial copy is "
            f"removed and '{out_dir}' is {'unchanged' if out_dir.exists() else 'not created'}. Fix: {OUT_FIX}"
        ) from err
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _write_output(plan: _ExportPlan, tmp: Path) -> None:
    """The base's files but its transformer and identity, the trained transformer, the checkpoint's identity."""
    shutil.copytree(plan.base_dir, tmp, ignore=shutil.ignore_patterns(TRANSFORMER_DIR, IDENTITY_FILE))
    plan.transformer.save_pretrained(tmp / TRANSFORMER_DIR, safe_serialization=True, max_shard_size="5GB")
    if plan.identity is not None:
        write_identity(tmp, plan.identity)


def _publish_output(tmp: Path, out_dir: Path) -> None:
    """Rename the finished directory into place; an existing output is moved aside first and deleted after."""
    if out_dir.exists():
        old = out_dir.parent / f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(out_dir, old)
        os.rename(tmp, out_dir)
        shutil.rmtree(old)
    else:
        os.rename(tmp, out_dir)


def export_diffusers(
    full_weights: str | Path,
    base_dir: str | Path,
    out_dir: str | Path,
    *,
    use_ema: bool = False,
    dtype: str = "as-trained",
    overwrite: bool = False,
) -> Path:
    """Write ``out_dir`` (complete or absent: built under a temporary name, renamed last).

    Plan (every check, the transformer built, the room checked), write (into a temporary directory),
    publish (the rename); :func:`_temp_output` removes the temporary directory whatever happens."""
    plan = _plan_export(full_weights, Path(base_dir), Path(out_dir), use_ema, dtype, overwrite)
    with _temp_output(plan) as tmp:
        _write_output(plan, tmp)
        _publish_output(tmp, plan.out_dir)
    logger.info("exported %s (%s weights, %d tensors) -> %s", plan.source, "EMA" if use_ema else "regular",
                plan.tensors, plan.out_dir)
    return plan.out_dir


def output_bytes(base_dir: Path, state: dict[str, torch.Tensor]) -> int:
    """What the converted directory takes: the base's files but its transformer (symlinks followed, as the
    copy does), the new weights, and 1 MiB for configs and safetensors headers."""
    skip = {base_dir / TRANSFORMER_DIR, base_dir / IDENTITY_FILE}
    copied = sum(f.stat().st_size for f in base_dir.rglob("*")
                 if f.is_file() and not any(f == s or s in f.parents for s in skip))
    return copied + sum(t.numel() * t.element_size() for t in state.values()) + 2**20


def check_source(src: str | Path, use_ema: bool) -> Path:
    """``--src`` must be a complete ``global_step_<N>`` directory, a weights file, or a run's
    ``checkpoints/`` directory (its newest complete checkpoint by step); returns what is converted.

    The newest is chosen here, by the step number, because choosing it by name in a shell
    (``ls | sort``) puts ``global_step_880`` after ``global_step_1760``.
    """
    src = Path(src)
    fix = ("pass a complete checkpoint directory .../checkpoints/global_step_<N> (one with a COMPLETE file), "
           "its actor/model_state_dict/full_weights.pt, or the checkpoints/ directory that holds them")
    if not src.exists():
        raise FileNotFoundError(f"--src '{src}' does not exist; {fix}")
    if src.is_dir() and parse_step(src) is None:
        found = list_checkpoints(src)
        if not found:
            raise ConversionError(f"--src '{src}' is not a global_step_<N> directory, nor a directory holding "
                                  f"a complete one; {fix}")
        src = found[-1]
        logger.info("converting the newest complete checkpoint of %d: %s", len(found), src)
    if src.is_dir():
        if not is_complete_checkpoint(src):
            raise ConversionError(f"--src '{src}' is an incomplete checkpoint (no COMPLETE marker: its save did "
                                  f"not finish); {fix}")
        if use_ema:
            return src
        weights = src / "actor" / "model_state_dict" / FULL_WEIGHTS
        if not weights.is_file():
            raise FileNotFoundError(f"--src '{src}' has no exported weights ({weights}); it was saved with "
                                    "save_full_weights=False: export them from a run that writes them")
    return src


def _load_state(path: Path, use_ema: bool) -> dict[str, torch.Tensor]:
    """The consolidated state dict; a file that is not one (not torch's zip format, not a dict of tensors)
    is a :class:`ConversionError` naming it."""
    try:
        state = load_full_weights(path, ema=use_ema)
    except CheckpointError as err:
        raise ConversionError(str(err)) from err
    except (RuntimeError, OSError, EOFError, pickle.UnpicklingError) as err:
        raise ConversionError(f"--src '{path}' is not a weights file written by an SFT run (torch.load: "
                              f"{str(err).splitlines()[0]}); pass a global_step_<N> directory or its "
                              f"{FULL_WEIGHTS}") from err
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConversionError(f"--src '{path}' holds a {type(state).__name__}, not a state dict of tensors; pass "
                              f"a global_step_<N> directory or its {FULL_WEIGHTS}")
    return state


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

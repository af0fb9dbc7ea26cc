"""The parts of a diffusers Cosmos3 directory, named once; imports nothing heavy (configs check them).

Training reads ``transformer/`` (weights and config), ``vae/``, ``text_tokenizer/`` and
``scheduler/``; SGLang and the embedded pipeline load all of them through ``model_index.json``. A
directory that lacks one fails late and obscurely (diffusers falls back to the Hugging Face hub,
SGLang fails inside its server), so every entry point checks the list up front.
"""

from __future__ import annotations

from pathlib import Path

MODEL_INDEX = "model_index.json"
TRANSFORMER_DIR = "transformer"
VAE_DIR = "vae"
TOKENIZER_DIR = "text_tokenizer"
SCHEDULER_DIR = "scheduler"
MODEL_COMPONENTS = (MODEL_INDEX, TRANSFORMER_DIR, VAE_DIR, TOKENIZER_DIR, SCHEDULER_DIR)
TRANSFORMER_CONFIG = f"{TRANSFORMER_DIR}/config.json"


def missing_components(model_dir: str | Path, *, transformer_config: bool = True) -> list[str]:
    """The parts of a complete Cosmos3 diffusers directory that ``model_dir`` lacks (``[]``: none).

    ``transformer_config``: also require ``transformer/config.json`` (the configs check it; the
    loaders read it themselves and report a missing weights file more precisely)."""
    root = Path(model_dir).expanduser()
    missing = [name for name in MODEL_COMPONENTS if not (root / name).exists()]
    if transformer_config and TRANSFORMER_DIR not in missing and not (root / TRANSFORMER_CONFIG).is_file():
        missing.append(TRANSFORMER_CONFIG)
    return missing

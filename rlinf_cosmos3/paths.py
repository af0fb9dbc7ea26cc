"""Where the project's three environments live, so every entry point agrees.

``requirements/install.sh`` builds them at these default places; each can be overridden
with an environment variable (useful when the environments live outside the checkout).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def _interpreter(env_var: str, venv_dir: str) -> Path:
    override = os.environ.get(env_var)
    if override:
        return Path(override)
    return REPO_ROOT / venv_dir / "bin" / "python"


def libero_python() -> Path:
    """Interpreter of the simulator environment (LIBERO, numpy < 2)."""
    return _interpreter("RLINF_COSMOS3_LIBERO_PYTHON", ".venv-libero")


def sglang_python() -> Path:
    """Interpreter of the SGLang server environment."""
    return _interpreter("RLINF_COSMOS3_SGLANG_PYTHON", ".venv-sglang")


def libero_config_dir() -> Path:
    """LIBERO's config folder (LIBERO_CONFIG_PATH), kept inside the simulator environment.

    LIBERO defaults to ~/.libero, which would tie every checkout to whichever one ran first.
    """
    override = os.environ.get("LIBERO_CONFIG_PATH")
    if override:
        return Path(override)
    return libero_python().parent.parent / "libero_config"

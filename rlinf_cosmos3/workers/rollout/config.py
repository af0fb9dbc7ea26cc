"""Old import path of the rollout sections, kept for ``benchmarks/gpu/serve_actions.py`` only.

The sections are :mod:`rlinf_cosmos3.config.rollout`; the checks that read the model directory, its
identity and the stats file are :func:`rlinf_cosmos3.validation.rollout.validate_rollout_model`. Delete
this module once that benchmark imports from there.
"""

from __future__ import annotations

from rlinf_cosmos3.config.rollout import RolloutModelConfig, SGLangConfig

__all__ = ["RolloutModelConfig", "SGLangConfig"]

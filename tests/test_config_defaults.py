"""The typed schemas' defaults are the reference recipe's values, and the reference YAMLs state only changes.

Code that builds a config directly (tests, benchmarks, library users) gets the schema defaults; the
launchers get the reference YAMLs composed over the same schema. When the two disagreed, both ran,
silently differently (35 vs 30 inference steps, padded vs complete windows, ...). So: every key a
reference YAML states must differ from the schema default (a restated default hides which settings a
run really changes), and the settings that once disagreed are checked against the composed recipe.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlinf_cosmos3.config.eval import EvalConfig
from rlinf_cosmos3.config.rl import RLConfig
from rlinf_cosmos3.config.sft import SFTConfig

REPO = Path(__file__).resolve().parent.parent
SFT_DIR = REPO / "examples/sft/config"
EVAL_DIR = REPO / "evaluations/libero"
RL_DIR = REPO / "examples/rl/config"
MISSING = "???"
"""A required value (path, stats file): the YAML names it so that a user sees what to supply; not a default."""

REFERENCE_YAMLS = {
    "sft": (SFTConfig, [(SFT_DIR / "libero_sft_cosmos3.yaml", ""), (SFT_DIR / "model/cosmos3.yaml", "actor.model")]),
    "eval": (EvalConfig, [(EVAL_DIR / "libero_spatial_cosmos3_eval_sglang.yaml", "")]),
    "rl": (RLConfig, [(RL_DIR / "libero_rl_cosmos3.yaml", "")]),
}
"""Schema and the reference recipe's own files (with the key each is mounted at)."""

REFERENCE_VALUES = {
    "sft": (SFTConfig, SFT_DIR, "libero_sft_cosmos3", {
        "actor.model.activation_checkpointing": True,
        "data.dataset.complete_chunks_only": True,
        "data.num_workers": 4,
        "data.prefetch_factor": 4,
    }),
    "eval": (EvalConfig, EVAL_DIR, "libero_spatial_cosmos3_eval_sglang", {
        "rollout.model.num_inference_steps": 30,
        "rollout.pipeline_stage_num": 2,
        "rollout.sglang.batching_max_size": 8,
        "rollout.embedded.batching_max_size": 8,
    }),
}
"""Settings whose schema default once disagreed with the recipe, and the recipe's value (docs/sft.md, docs/eval.md)."""


def _restated(schema_node: Any, yaml_node: Any, key: str) -> list[str]:
    """Keys under ``key`` whose YAML value equals the schema default at the same place."""
    if dataclasses.is_dataclass(schema_node) and isinstance(yaml_node, dict):
        found = []
        for name, value in yaml_node.items():
            assert hasattr(schema_node, name), f"{key}.{name}: not a field of {type(schema_node).__name__}"
            found += _restated(getattr(schema_node, name), value, f"{key}.{name}" if key else name)
        return found
    return [key] if yaml_node != MISSING and yaml_node == schema_node else []


def _at(node: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


@pytest.mark.parametrize("name", sorted(REFERENCE_YAMLS))
def test_reference_yamls_restate_no_default(name: str) -> None:
    schema, files = REFERENCE_YAMLS[name]
    defaults = schema()
    offending = []
    for path, mount in files:
        raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        body = {k: v for k, v in raw.items() if k not in ("defaults", "hydra")}
        node = _at(defaults, mount) if mount else defaults
        offending += [f"{path.relative_to(REPO)}: {key}" for key in _restated(node, body, mount)]
    assert not offending, ("these keys restate the schema default (remove them, so the YAML states only what "
                           "the run changes):\n  " + "\n  ".join(offending))


@pytest.mark.parametrize("name", sorted(REFERENCE_VALUES))
def test_schema_defaults_are_the_recipes(name: str) -> None:
    schema, config_dir, config_name, expected = REFERENCE_VALUES[name]
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):  # as the launchers compose
        composed = OmegaConf.to_container(compose(config_name=config_name), resolve=False)
    defaults = schema()
    wrong = {key: (_at(defaults, key), _at(composed, key)) for key, value in expected.items()
             if not (_at(defaults, key) == _at(composed, key) == value)}
    assert not wrong, "schema default vs composed reference (both must be the recipe's value): " + repr(wrong)


def test_policy_predict_samples_with_the_rollout_default() -> None:
    """``Cosmos3Policy.predict`` (SFT-side checks, open-loop error) samples as the eval does."""
    from rlinf_cosmos3.models.cosmos3.policy import Cosmos3Policy

    steps = inspect.signature(Cosmos3Policy.predict).parameters["num_inference_steps"].default
    assert steps == EvalConfig().rollout.model.num_inference_steps == 30

"""docs/models.md's diffusers example builds the prompt training builds.

The example block is read from the page and run as written (a tiny random Cosmos3 on CPU stands in
for ``model_dir``); a forward pre-hook observes the transformer's ``input_ids`` (it changes nothing),
which must be the caption ids training tokenizes for the same task (``PolicyProcessor.prompt_ids``).
A copy that drops ``view_point`` or ``use_system_prompt=False`` gives another caption and fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rlinf_cosmos3.models.cosmos3.configuration import PolicyConfig
from rlinf_cosmos3.models.cosmos3.processor import PolicyProcessor
from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir

DOC = Path(__file__).resolve().parent.parent / "docs" / "models.md"
TASK = "put the black bowl on the plate"


def example_block() -> str:
    """The page's python block that loads the pipeline and calls it."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    matching = [b for b in blocks if "Cosmos3OmniPipeline.from_pretrained" in b and "pipe(" in b]
    assert len(matching) == 1, f"expected one diffusers example in {DOC}, found {len(matching)}"
    return matching[0]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("cosmos3") / "tiny", preset="tiny", seed=0)


def run_example(model_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the block statement by statement; observe the transformer as soon as ``pipe`` exists."""
    rng = np.random.default_rng(0)
    namespace: dict[str, Any] = {
        "model_dir": str(model_dir),
        "task": TASK,
        "main": rng.integers(0, 256, (256, 256, 3), dtype=np.uint8),
        "wrist": rng.integers(0, 256, (256, 256, 3), dtype=np.uint8),
    }
    calls: list[dict[str, Any]] = []
    handle = None
    try:
        for statement in ast.parse(example_block()).body:
            exec(compile(ast.Module([statement], []), str(DOC), "exec"), namespace)  # noqa: S102
            if handle is None and "pipe" in namespace:
                handle = namespace["pipe"].transformer.register_forward_pre_hook(
                    lambda _m, _args, kwargs: calls.append(dict(kwargs)), with_kwargs=True)
    finally:
        if handle is not None:
            handle.remove()
    return namespace, calls


def test_example_prompt_is_the_training_prompt(model_dir: Path) -> None:
    namespace, calls = run_example(model_dir)
    assert calls, "the example never called the transformer"
    out = namespace["out"]
    assert tuple(out.action[0].shape) == (16, 10) and torch.isfinite(out.action[0]).all()

    training_ids, _ = PolicyProcessor(namespace["pipe"], PolicyConfig(), raw_action_dim=10).prompt_ids(TASK)
    tokenizer = namespace["pipe"].text_tokenizer
    served_ids = calls[0]["input_ids"].tolist()
    assert served_ids == training_ids, (
        "docs/models.md's example builds another prompt than training:\n"
        f"example:  {tokenizer.decode(served_ids)!r}\ntraining: {tokenizer.decode(training_ids)!r}"
    )

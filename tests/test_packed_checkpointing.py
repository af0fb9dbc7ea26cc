"""Activation checkpointing of a packed micro-batch: the backward recomputation keeps samples apart too.

The packed layout is set only while the packed forward runs; a checkpointed decoder layer recomputes in
``backward()``, after that. ``parallelize(activation_checkpointing=True)`` must recompute it under the same
layout, or the recomputation is diffusers' unmasked attention over the whole pack (the reference recipe:
checkpointing on, 32 samples per packed call). Real tiny random Cosmos3 on CPU (``loop`` backend).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlinf_cosmos3.models.cosmos3.packed_attention import packed_processor_of
from rlinf_cosmos3.models.cosmos3.parallelize import ParallelizeConfig, parallelize
from rlinf_cosmos3.models.cosmos3.policy import Cosmos3Policy, PolicyConfig
from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir

PROMPTS = ["put the mug on the plate", "pick up the alphabet soup and place it in the basket", "push the plate"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("cosmos3") / "tiny", preset="tiny", seed=0)


def _loss_and_grads(policy: Cosmos3Policy) -> tuple[float, dict[str, torch.Tensor], list[int]]:
    g = torch.Generator().manual_seed(0)
    n = len(PROMPTS)
    batch = {
        "x0_vision": torch.randn(n, 48, 5, 12, 20, generator=g) * 0.2,
        "vision_frame_valid": torch.ones(n, 5, dtype=torch.bool),
        "actions": torch.rand(n, 16, 10, generator=g) * 2 - 1,
        "action_is_pad": torch.zeros(n, 16, dtype=torch.bool),
        "prompt": PROMPTS,
    }
    calls: list[int] = []
    handle = policy.transformer.register_forward_pre_hook(
        lambda _m, _a, kw: calls.append(kw["sequence_length"]), with_kwargs=True
    )
    try:
        loss, _ = policy.sft_loss(batch, [torch.Generator().manual_seed(10 + i) for i in range(n)])
    finally:
        handle.remove()
    loss.backward()
    grads = {name: p.grad.clone() for name, p in policy.transformer.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads, calls


def test_checkpointed_packed_step_gives_the_plain_packed_loss_and_gradients(model_dir: Path) -> None:
    plain = Cosmos3Policy.from_pretrained(model_dir, PolicyConfig())  # packs: max_tokens_per_pack 74,000
    checkpointed = parallelize(
        Cosmos3Policy.from_pretrained(model_dir, PolicyConfig()), None,
        ParallelizeConfig(activation_checkpointing=True),
    )
    assert checkpointed.transformer.is_gradient_checkpointing and not plain.transformer.is_gradient_checkpointing

    ref_loss, ref_grads, ref_calls = _loss_and_grads(plain)
    loss, grads, calls = _loss_and_grads(checkpointed)
    assert len(calls) == 1 and calls == ref_calls, "the three samples went through one packed call"
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    assert sorted(grads) == sorted(ref_grads) and ref_grads
    for name, ref in ref_grads.items():
        assert torch.allclose(grads[name], ref, rtol=1e-4, atol=1e-6 * float(ref.abs().max())), name
    assert packed_processor_of(checkpointed.transformer).layout is None  # nothing stays packed afterwards

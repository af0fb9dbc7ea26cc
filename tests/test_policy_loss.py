"""The flow-matching SFT loss on a real (tiny, random) diffusers Cosmos3: finite, deterministic, trainable, masked.

Masking is checked by perturbing the real transformer's outputs with a forward hook: a perturbation
where the loss must not look leaves it bit-identical, one where it must look changes it.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from rlinf_cosmos3.config.objective import ObjectiveConfig
from rlinf_cosmos3.models.cosmos3.policy import (
    Cosmos3Policy,
    EncodedSample,
    PolicyConfig,
    canvas_tier,
    latent_frame_valid,
    prepare_actions,
    sample_sigma,
)
from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir

B = 2


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Cosmos3Policy:
    model_dir = write_model_dir(tmp_path_factory.mktemp("cosmos3") / "tiny", preset="tiny", seed=0)
    return Cosmos3Policy.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def batch() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {
        "image": torch.randint(0, 256, (B, 17, 3, 256, 256), dtype=torch.uint8, generator=g),
        "wrist_image": torch.randint(0, 256, (B, 17, 3, 256, 256), dtype=torch.uint8, generator=g),
        "actions": torch.rand(B, 16, 10, generator=g) * 2 - 1,
        "action_is_pad": torch.zeros(B, 16, dtype=torch.bool),
        "frame_is_pad": torch.zeros(B, 17, dtype=torch.bool),
        "prompt": ["pick up the black bowl", "put the mug on the plate"],
    }


@pytest.fixture(scope="module")
def encoded(policy: Cosmos3Policy, batch: dict[str, Any]) -> list[EncodedSample]:
    return policy.encode_batch(batch)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@contextmanager
def _perturb_outputs(policy: Cosmos3Policy, edit: Callable[[torch.Tensor, torch.Tensor], None]) -> Iterator[None]:
    """Add to every sample's predictions: ``edit(preds_vision[i], preds_action[i])`` (one call may hold
    several packed samples)."""

    def hook(_module: torch.nn.Module, _args: Any, _kwargs: Any, output: tuple) -> tuple:
        vision, sound, action = output
        vision, action = [v.clone() for v in vision], [a.clone() for a in action]
        for v, a in zip(vision, action, strict=True):
            edit(v, a)
        return vision, sound, action

    handle = policy.transformer.register_forward_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


# ----------------------------------------------------------------------------- the pieces


def test_recipe_defaults() -> None:
    cfg = PolicyConfig()
    objective = cfg.objective
    assert (objective.sigma_distribution, cfg.training_shift, objective.loss_scale, objective.action_loss_weight) == (
        "waver", 3.0, 10.0, 1.0)
    assert (canvas_tier(192, 320), canvas_tier(480, 832), canvas_tier(720, 1280)) == ("256", "480", "720")
    with pytest.raises(ValueError, match="sigma_distribution"):
        PolicyConfig(objective=ObjectiveConfig(sigma_distribution="cosine"))
    with pytest.raises(ValueError, match="caption_dropout"):
        PolicyConfig(objective=ObjectiveConfig(caption_dropout=1.0))
    with pytest.raises(ValueError, match="domains.py"):
        PolicyConfig(domain_name="not_a_robot")


def test_sigma_sampling() -> None:
    """NVIDIA's waver draw and shift: sigma in [0, 1], larger with a larger shift, replayable by seed."""
    draws = {s: torch.stack([sample_sigma("waver", s, g) for g in [_gen(0)] * 2000]) for s in (1.0, 3.0)}
    for sigmas in draws.values():
        assert sigmas.dtype == torch.float32 and 0.0 <= sigmas.min() and sigmas.max() <= 1.0
        assert sigmas.std() > 0.15  # spread over the range, not a constant
    assert draws[3.0].median() > draws[1.0].median() + 0.1
    # Same stream -> the shift is the only difference, sample by sample: s t / (1 + (s - 1) t).
    t = draws[1.0]
    torch.testing.assert_close(draws[3.0], 3 * t / (1 + 2 * t))
    assert torch.equal(sample_sigma("waver", 3.0, _gen(5)), sample_sigma("waver", 3.0, _gen(5)))
    u = torch.rand((1,), generator=_gen(9))[0]
    assert torch.equal(sample_sigma("uniform", 1.0, _gen(9)), u)


def test_prepare_actions_pads_channels_and_forward_fills_steps() -> None:
    actions = torch.arange(16 * 10, dtype=torch.float32).reshape(16, 10)
    pad = torch.zeros(16, dtype=torch.bool)
    pad[12:] = True
    x0, valid = prepare_actions(actions, pad, action_dim=64)
    assert x0.shape == (16, 64) and (x0[:, 10:] == 0).all()
    assert torch.equal(x0[:12, :10], actions[:12])
    assert all(torch.equal(x0[k, :10], actions[11]) for k in range(12, 16))
    assert valid.tolist() == [True] * 12 + [False] * 4
    with pytest.raises(ValueError, match="first action"):
        prepare_actions(actions, torch.ones(16, dtype=torch.bool), action_dim=64)


def test_latent_frame_validity() -> None:
    """Latent frame k covers pixel frames 4k-3..4k; it is left out only when all of them are padding."""
    pad = torch.zeros(17, dtype=torch.bool)
    assert latent_frame_valid(pad, 4).tolist() == [True] * 5
    pad[14:] = True
    assert latent_frame_valid(pad, 4).tolist() == [True] * 5
    pad[13:] = True
    assert latent_frame_valid(pad, 4).tolist() == [True, True, True, True, False]
    pad[5:] = True
    assert latent_frame_valid(pad, 4).tolist() == [True, True, False, False, False]


def test_malformed_batches_are_rejected(policy: Cosmos3Policy, batch: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="batch sizes differ"):
        policy.encode_batch({**batch, "prompt": batch["prompt"][:1]})
    with pytest.raises(ValueError, match="17"):
        policy.encode_batch({**batch, "image": batch["image"][:, :9], "wrist_image": batch["wrist_image"][:, :9]})
    with pytest.raises(ValueError, match="actions"):
        policy.encode_batch({**batch, "actions": batch["actions"][..., :7]})


# ----------------------------------------------------------------------------- the loss


def test_sft_loss_is_finite_and_composed(policy: Cosmos3Policy, batch: dict[str, Any], encoded: list) -> None:
    loss, metrics = policy.sft_loss(batch, _gen(0))
    assert set(metrics) == {"loss", "vision_loss", "action_loss"}
    assert loss.requires_grad and torch.isfinite(loss)
    assert all(torch.isfinite(v) and v > 0 and not v.requires_grad for v in metrics.values())
    torch.testing.assert_close(metrics["loss"], 10.0 * (metrics["vision_loss"] + metrics["action_loss"]))
    # Encoding is deterministic, so the cached path gives the same number.
    again, _ = policy.loss_from_encoded(encoded, _gen(0))
    assert torch.equal(loss, again)


def test_seeded_generator_gives_identical_loss(policy: Cosmos3Policy, encoded: list) -> None:
    first, _ = policy.loss_from_encoded(encoded, _gen(11))
    second, _ = policy.loss_from_encoded(encoded, _gen(11))
    other, _ = policy.loss_from_encoded(encoded, _gen(12))
    assert torch.equal(first, second)
    assert not torch.equal(first, other)


def test_per_sample_generators_make_the_loss_split_invariant(policy: Cosmos3Policy, encoded: list) -> None:
    """With one generator per sample, a batch's loss is the mean of its parts' losses (what data parallel needs)."""
    whole, whole_m = policy.loss_from_encoded(encoded, [_gen(100), _gen(101)])
    first, first_m = policy.loss_from_encoded(encoded[:1], [_gen(100)])
    second, second_m = policy.loss_from_encoded(encoded[1:], [_gen(101)])
    assert torch.equal(whole, (first + second) / 2)
    for key in ("vision_loss", "action_loss"):
        assert torch.equal(whole_m[key], (first_m[key] + second_m[key]) / 2)
    with pytest.raises(ValueError, match="generators"):
        policy.loss_from_encoded(encoded, [_gen(1)])


def test_loss_decreases_with_adamw(policy: Cosmos3Policy, encoded: list) -> None:
    trainee = Cosmos3Policy(
        copy.deepcopy(policy.transformer), policy.vae, policy.pipeline.text_tokenizer, policy.pipeline.scheduler
    )
    trainee.transformer.train()
    optimizer = torch.optim.AdamW(trainee.transformer.parameters(), lr=1e-3, weight_decay=0.0)
    losses = []
    for _ in range(20):
        loss, _ = trainee.loss_from_encoded(encoded[:1], _gen(3))  # the same draws every step: a fixed objective
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses
    # Training moved the copy, not the fixture.
    assert not torch.equal(trainee.transformer.proj_in.weight, policy.transformer.proj_in.weight)


def _with_actions(sample: EncodedSample, actions: torch.Tensor, pad: torch.Tensor) -> EncodedSample:
    x0_action, valid = prepare_actions(actions, pad, action_dim=64)
    return dataclasses.replace(sample, x0_action=x0_action, action_valid=valid)


def test_padded_actions_do_not_change_the_loss(policy: Cosmos3Policy, encoded: list) -> None:
    sample = encoded[0]
    raw = sample.x0_action[:, :10]
    pad = torch.zeros(16, dtype=torch.bool)
    pad[10:] = True
    padded = _with_actions(sample, raw, pad)
    garbage = raw.clone()
    garbage[10:] = torch.randn(6, 10, generator=_gen(1)) * 5
    with_garbage = _with_actions(sample, garbage, pad)
    base, _ = policy.loss_from_encoded([padded], _gen(4))
    assert torch.equal(base, policy.loss_from_encoded([with_garbage], _gen(4))[0])
    # A real step does count.
    real_changed = garbage.clone()
    real_changed[3] += 1.0
    changed = _with_actions(sample, real_changed, pad)
    assert not torch.equal(base, policy.loss_from_encoded([changed], _gen(4))[0])

    # Predictions at padded steps are not scored; at real steps they are.
    def at_padded_step(_v: torch.Tensor, a: torch.Tensor) -> None:
        a[12] += 100.0

    def at_real_step(_v: torch.Tensor, a: torch.Tensor) -> None:
        a[2] += 100.0

    with _perturb_outputs(policy, at_padded_step):
        assert torch.equal(base, policy.loss_from_encoded([padded], _gen(4))[0])
    with _perturb_outputs(policy, at_real_step):
        assert not torch.equal(base, policy.loss_from_encoded([padded], _gen(4))[0])


def test_padded_action_channels_never_contribute(policy: Cosmos3Policy, encoded: list) -> None:
    base, base_m = policy.loss_from_encoded(encoded, _gen(6))

    def beyond_raw(_v: torch.Tensor, a: torch.Tensor) -> None:
        a[:, 10:] += 1e3

    def within_raw(_v: torch.Tensor, a: torch.Tensor) -> None:
        a[:, 9] += 1.0

    with _perturb_outputs(policy, beyond_raw):
        assert torch.equal(base, policy.loss_from_encoded(encoded, _gen(6))[0])
    with _perturb_outputs(policy, within_raw):
        _, within_m = policy.loss_from_encoded(encoded, _gen(6))
    assert within_m["action_loss"] > base_m["action_loss"] and torch.equal(within_m["vision_loss"], base_m["vision_loss"])
    # The gradient of the loss leaves the padded channels' output weights of the libero head alone.
    policy.transformer.zero_grad()
    loss, _ = policy.loss_from_encoded(encoded, _gen(6))
    loss.backward()
    head = policy.transformer.action_proj_out
    grad = head.fc.weight.grad.view(head.num_domains, head.input_size, head.output_size)
    assert (grad[5, :, 10:] == 0).all() and (grad[5, :, :10] != 0).any()
    assert (head.bias.weight.grad[5, 10:] == 0).all()
    policy.transformer.zero_grad()


def test_condition_frame_and_padded_frames_are_not_scored(policy: Cosmos3Policy, encoded: list) -> None:
    sample = encoded[0]
    tail_padded = dataclasses.replace(sample, vision_frame_valid=torch.tensor([True, True, True, True, False]))
    base, _ = policy.loss_from_encoded([tail_padded], _gen(8))

    def frame(k: int) -> Callable[[torch.Tensor, torch.Tensor], None]:
        def edit(v: torch.Tensor, _a: torch.Tensor) -> None:
            v[:, :, k] += 10.0

        return edit

    for k, scored in ((0, False), (4, False), (2, True)):
        with _perturb_outputs(policy, frame(k)):
            perturbed, _ = policy.loss_from_encoded([tail_padded], _gen(8))
        assert torch.equal(perturbed, base) != scored, k


def test_caption_dropout_trains_on_the_unconditional_prompt(policy: Cosmos3Policy, encoded: list) -> None:
    cfg = dataclasses.replace(policy.cfg, objective=ObjectiveConfig(caption_dropout=0.999))
    dropping = Cosmos3Policy(policy.transformer, policy.vae, policy.pipeline.text_tokenizer, policy.pipeline.scheduler, cfg)
    seen: list[list[int]] = []
    handle = policy.transformer.register_forward_pre_hook(
        lambda _m, _a, kwargs: seen.append(kwargs["input_ids"].tolist()), with_kwargs=True
    )
    try:
        dropping.loss_from_encoded(encoded[:1], _gen(0))
        policy.loss_from_encoded(encoded[:1], _gen(0))
    finally:
        handle.remove()
    assert seen == [encoded[0].uncond_input_ids, encoded[0].input_ids]
    assert len(encoded[0].uncond_input_ids) < len(encoded[0].input_ids)


def test_actions_share_the_vision_sigma_unless_given_their_own(policy: Cosmos3Policy, encoded: list) -> None:
    """The recipe (``independent_action_schedule=False``): one timestep for vision and action tokens.
    ``action_sigma_distribution`` draws the actions' own, right after the vision sigma (which stays the same)."""
    def timesteps(p: Cosmos3Policy) -> tuple[set[float], set[float]]:
        seen: list[dict] = []
        handle = p.transformer.register_forward_pre_hook(lambda _m, _a, kw: seen.append(kw), with_kwargs=True)
        try:
            p.loss_from_encoded(encoded[:1], _gen(3))
        finally:
            handle.remove()
        (kwargs,) = seen
        return set(kwargs["vision_timesteps"].tolist()), set(kwargs["action_timesteps"].tolist())

    vision, action = timesteps(policy)
    assert vision == action and len(vision) == 1
    cfg = dataclasses.replace(policy.cfg, objective=ObjectiveConfig(action_sigma_distribution="uniform"))
    own = Cosmos3Policy(policy.transformer, policy.vae, policy.pipeline.text_tokenizer, policy.pipeline.scheduler, cfg)
    vision_own, (action_own,) = timesteps(own)
    assert vision_own == vision, "the vision sigma is drawn first, as before"
    gen = _gen(3)
    sample_sigma("waver", cfg.training_shift, gen)
    expected = float(sample_sigma("uniform", cfg.training_shift, gen)) * 1000
    assert action_own == pytest.approx(expected, rel=1e-6) and action_own not in vision
    with pytest.raises(ValueError, match="action_sigma_distribution"):
        PolicyConfig(objective=ObjectiveConfig(action_sigma_distribution="cosine"))
    with pytest.raises(ValueError, match=r"resolution_tier 480 sizes canvases to .* not the 192x320 canvas"):
        PolicyConfig(objective=ObjectiveConfig(resolution_tier=480))

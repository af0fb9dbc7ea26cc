"""The optimised SFT step computes the objective it always did: ``train_step`` against the loss written out by hand.

``train_step`` (packed micro-batches, keyed noise drawn for the whole batch on the device, losses kept as
tensors, clipping without reading the norm back, the EMA as one ``lerp``) runs two optimizer steps of two
micro-batches on a real tiny random Cosmos3 (CPU). Before each, a copy of the transformer computes the reference
independently: every sample alone, through diffusers' own attention (``transformer_inputs``, one call per
sample), its draws taken from the keyed-noise layout as documented (stream, word order, Box-Muller) rather
than from the code under test, noised and scored as ``docs/sft_objective.md`` writes the objective, the
micro-batch losses averaged and back-propagated by hand. Losses, gradient norm, clipped gradients and the
EMA shadow must agree: any change to the maths (noising, masks, denominators, timesteps, reduction,
clipping, EMA) or to which noise a sample gets fails it.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from rlinf_cosmos3.components.ema import PowerEMA, power_ema_exponent
from rlinf_cosmos3.components.optim import build_optimizer, lambda_linear_schedule
from rlinf_cosmos3.components.train_step import train_step
from rlinf_cosmos3.config.objective import ObjectiveConfig
from rlinf_cosmos3.models.cosmos3.configuration import NUM_TRAIN_TIMESTEPS, sigma_from_draw
from rlinf_cosmos3.models.cosmos3.keyed_noise import (
    STREAM_ACTION,
    STREAM_DROPOUT,
    STREAM_SIGMA,
    STREAM_VISION,
    NoiseKeys,
    keyed_words,
    normal_from_words,
    uniform_from_words,
)
from rlinf_cosmos3.models.cosmos3.policy import Cosmos3Policy, EncodedSample, PolicyConfig
from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir

SEED = 7
PROMPTS = ["pick up the black bowl and place it on the plate", "put the mug on the plate", "push the plate"]
CLIP = 1.0


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Cosmos3Policy:
    model_dir: Path = write_model_dir(tmp_path_factory.mktemp("cosmos3") / "tiny", preset="tiny", seed=0)
    return Cosmos3Policy.from_pretrained(model_dir, PolicyConfig(objective=ObjectiveConfig(caption_dropout=0.5)))


def _batch(first_index: int, seed: int) -> dict[str, Any]:
    """Three cached-latent samples (the worker's batches with ``data.latent_cache_dir``), padded frames and steps."""
    g = torch.Generator().manual_seed(seed)
    batch = {
        "x0_vision": torch.randn(3, 48, 5, 12, 20, generator=g) * 0.3,
        "vision_frame_valid": torch.ones(3, 5, dtype=torch.bool),
        "actions": torch.rand(3, 16, 10, generator=g) * 2 - 1,
        "action_is_pad": torch.zeros(3, 16, dtype=torch.bool),
        "prompt": list(PROMPTS),
        "index": torch.arange(first_index, first_index + 3) * 37 + 5,
    }
    batch["vision_frame_valid"][1, 4:] = False
    batch["action_is_pad"][2, 11:] = True
    return batch


def _reference_draws(index: int, step: int, sample: EncodedSample, cfg: PolicyConfig) -> dict[str, Any]:
    """One sample's draws as the keyed layout defines them: counter (block, stream, index, step), key = seed."""
    keys = NoiseKeys(SEED, step, torch.tensor([index]))
    n_v, n_a = sample.x0_vision.numel(), sample.x0_action.numel()
    sigma_w, vision_w, action_w, drop_w = keyed_words(
        keys, [(STREAM_SIGMA, 2), (STREAM_VISION, n_v), (STREAM_ACTION, n_a), (STREAM_DROPOUT, 1)], "cpu")
    sigma = float(sigma_from_draw("waver", cfg.training_shift, uniform_from_words(sigma_w[0, :1]))[0])
    return {
        "sigma": sigma,
        "eps_vision": normal_from_words(vision_w[0]).reshape(sample.x0_vision.shape),
        "eps_action": normal_from_words(action_w[0]).reshape(sample.x0_action.shape),
        "dropped": float(uniform_from_words(drop_w[0, 0])) < cfg.objective.caption_dropout,
    }


def _reference_sample_loss(policy: Cosmos3Policy, transformer: torch.nn.Module, sample: EncodedSample,
                           draws: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(vision MSE, action MSE) of one sample alone, the objective written out (docs/sft_objective.md)."""
    raw = policy.domain.raw_action_dim
    sigma, eps_v, eps_a = draws["sigma"], draws["eps_vision"], draws["eps_action"]
    x0_v, x0_a = sample.x0_vision, sample.x0_action
    xt_v = sigma * eps_v + (1 - sigma) * x0_v
    xt_v[:, :, 0] = x0_v[:, :, 0]  # the first latent frame is the clean condition
    xt_a = sigma * eps_a + (1 - sigma) * x0_a
    xt_a[:, raw:] = 0
    ids = sample.uncond_input_ids if draws["dropped"] else sample.input_ids
    inputs = policy.transformer_inputs(ids, xt_v, xt_a, sigma * NUM_TRAIN_TIMESTEPS)
    (pred_v,), _, (pred_a,) = transformer(**inputs, return_dict=False)
    frame_weight = sample.vision_frame_valid.float()
    frame_weight[0] = 0.0
    vision = ((pred_v - (eps_v - x0_v)) ** 2 * frame_weight.view(1, 1, -1, 1, 1)).sum() / x0_v.numel()
    action_err = (pred_a[:, :raw] - (eps_a - x0_a)[:, :raw]) ** 2
    action = (action_err * sample.action_valid.float()[:, None]).sum() / (x0_a.shape[0] * raw)
    return vision, action


def _reference_step(policy: Cosmos3Policy, transformer: torch.nn.Module, batches: list[dict[str, Any]],
                    step: int) -> dict[str, Any]:
    """Loss parts, gradients and their norm of one step of ``batches``, every sample on its own."""
    cfg = policy.cfg
    transformer.zero_grad(set_to_none=True)
    parts, dropped = torch.zeros(3, dtype=torch.float64), []
    for batch in batches:
        samples = policy.encode_batch(batch)
        losses = []
        for index, sample in zip(batch["index"].tolist(), samples, strict=True):
            draws = _reference_draws(index, step, sample, cfg)
            dropped.append(draws["dropped"])
            losses.append(_reference_sample_loss(policy, transformer, sample, draws))
        vision = torch.stack([v for v, _ in losses]).mean()
        action = torch.stack([a for _, a in losses]).mean()
        loss = cfg.objective.loss_scale * (vision + cfg.objective.action_loss_weight * action)
        (loss / len(batches)).backward()
        parts += torch.stack([loss, vision, action]).detach().double() / len(batches)
    grads = {n: p.grad.detach().clone() for n, p in transformer.named_parameters() if p.grad is not None}
    norm = float(torch.linalg.vector_norm(torch.cat([g.flatten().double() for g in grads.values()])))
    return {"parts": parts.tolist(), "grads": grads, "norm": norm, "dropped": dropped}


def test_train_step_matches_the_objective_computed_sample_by_sample(policy: Cosmos3Policy) -> None:
    transformer = policy.transformer
    transformer.train()
    optimizer = build_optimizer(transformer, lr=1e-3, weight_decay=0.05, lr_multipliers={"action_proj_in": 5.0})
    scheduler = lambda_linear_schedule(optimizer, 0, 10)
    ema = PowerEMA(transformer, rate=0.1)
    gamma = power_ema_exponent(0.1)
    seen_dropped: list[bool] = []
    for step in range(2):
        batches = [_batch(6 * step, 10 * step), _batch(6 * step + 3, 10 * step + 1)]
        reference = _reference_step(policy, copy.deepcopy(transformer), batches, step)
        seen_dropped += reference["dropped"]
        shadow_before = {k: v.clone() for k, v in ema.shadow.items()}
        stream = iter(batches)
        result = train_step(policy, optimizer, stream.__next__, grad_accum_steps=2, seed=SEED, global_step=step,
                            clip_grad=CLIP, scheduler=scheduler, ema=ema)

        loss, vision, action = reference["parts"]
        assert result.loss == pytest.approx(loss, rel=1e-5)
        assert result.vision_loss == pytest.approx(vision, rel=1e-5)
        assert result.action_loss == pytest.approx(action, rel=1e-5)
        assert result.grad_norm == pytest.approx(reference["norm"], rel=1e-4) and result.grad_norm > CLIP
        # The gradients train_step leaves are the reference's, clipped to the global norm CLIP.
        coefficient = min(1.0, CLIP / (reference["norm"] + 1e-6))
        grads = {n: p.grad for n, p in transformer.named_parameters() if p.grad is not None}
        assert sorted(grads) == sorted(reference["grads"])
        for name, grad in reference["grads"].items():
            expected = grad * coefficient
            scale = float(expected.abs().max()) + 1e-12
            assert float((grads[name] - expected).abs().max()) <= 1e-4 * scale, name
        # EMA after optimizer step `step + 1`: beta 0 first (a copy), then the power schedule.
        beta = 0.0 if step == 0 else (1 - 1 / (step + 1)) ** (gamma + 1)
        params = dict(transformer.named_parameters())
        for name, shadow in ema.shadow.items():
            expected = beta * shadow_before[name].double() + (1 - beta) * params[name].detach().double()
            torch.testing.assert_close(shadow.double(), expected, rtol=1e-6, atol=1e-7)
    assert any(seen_dropped) and not all(seen_dropped), "caption dropout is exercised both ways"

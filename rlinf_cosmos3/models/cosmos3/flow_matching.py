"""The flow-matching noising and losses of a pack of samples, as a few whole-pack tensor operations.

Why whole-pack: with a small model on a GPU a training step costs what the host dispatches, one
kernel launch per operation. Noising each sample and scoring each one alone cost ~57 operations per
sample (plus their backward), so the samples of a pack are handled together: their latent frames are
concatenated along time (``[1, C, sum T_i, h, w]``) and their action tokens along the token axis
(``[sum H_i, D]``), which is also the layout the transformer takes as one vision and one action item
(:func:`~rlinf_cosmos3.models.cosmos3.packing.merge_items`).

Only the random draws stay per sample (:func:`draw_noise`), on each sample's own generator (CPU by
default), in a fixed order: sigma, [the actions' own sigma], vision noise, action noise, caption
dropout. That keeps a sample's noise a function of its generator alone, whatever pack or rank it
lands in.

Objective (cosmos-framework ``omni_mot_model.py`` ``_add_noise_to_input``/``_compute_losses`` and
``algorithm/loss/flow_matching.py``): ``x_t = sigma * eps + (1 - sigma) * x0`` on every latent frame
but each sample's first (the clean condition, sigma 0) and on its action tokens, target ``eps - x0``;
per sample the vision MSE is the mean over all its latent elements with the condition frame and
padded frames zeroed (they stay in the denominator), the action MSE the mean over its
``horizon x raw_action_dim`` real channels with padded steps zeroed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlinf_cosmos3.models.cosmos3.configuration import (
    NUM_TRAIN_TIMESTEPS,
    PolicyConfig,
    generator_device,
    sample_sigma,
)
from rlinf_cosmos3.models.cosmos3.processor import EncodedSample


@dataclass
class NoiseDraw:
    """One sample's random draws, on its generator's device."""

    sigma: float
    sigma_action: float
    """= ``sigma`` unless ``PolicyConfig.action_sigma_distribution`` draws the actions' own."""
    eps_vision: torch.Tensor
    """``[1, C, T, h, w]`` like the sample's ``x0_vision``."""
    eps_action: torch.Tensor
    """``[H, D]`` like the sample's ``x0_action``."""
    dropped: bool
    """Caption dropout: the sample trains on its unconditional prompt."""

    @property
    def timestep(self) -> float:
        return self.sigma * NUM_TRAIN_TIMESTEPS

    @property
    def action_timestep(self) -> float:
        return self.sigma_action * NUM_TRAIN_TIMESTEPS


def draw_noise(cfg: PolicyConfig, sample: EncodedSample, generator: torch.Generator | None) -> NoiseDraw:
    """Draw sigma, noise and caption dropout for one sample (the order is fixed, for reproducibility)."""
    sigma = sample_sigma(cfg.sigma_distribution, cfg.training_shift, generator)
    sigma_action = (sigma if cfg.action_sigma_distribution is None
                    else sample_sigma(cfg.action_sigma_distribution, cfg.training_shift, generator))
    device = generator_device(generator)
    eps_v = torch.randn(sample.x0_vision.shape, generator=generator, device=device)
    eps_a = torch.randn(sample.x0_action.shape, generator=generator, device=device)
    dropped = cfg.caption_dropout > 0 and float(torch.rand((), generator=generator, device=device)) < cfg.caption_dropout
    return NoiseDraw(sigma=float(sigma), sigma_action=float(sigma_action), eps_vision=eps_v, eps_action=eps_a,
                     dropped=dropped)


@dataclass
class NoisyPack:
    """A pack's noisy inputs and velocity targets, samples concatenated (frames along time, action tokens
    along the token axis), with what scores each sample on its own."""

    xt_vision: torch.Tensor
    """``[1, C, sum T_i, h, w]`` float32."""
    xt_action: torch.Tensor
    """``[sum H_i, D]`` float32, zero beyond ``raw_action_dim``."""
    target_vision: torch.Tensor
    target_action: torch.Tensor
    frame_weight: torch.Tensor
    """``[sum T_i]``: 1 for a noised, valid latent frame; 0 for condition and padded frames."""
    token_weight: torch.Tensor
    """``[sum H_i]``: 1 for a real action step, 0 past the episode end."""
    frame_owner: torch.Tensor
    """``[sum T_i]`` long: which sample each latent frame belongs to."""
    token_owner: torch.Tensor
    vision_numel: torch.Tensor
    """``[n]``: the denominator of each sample's vision MSE (all its latent elements)."""
    action_numel: torch.Tensor
    """``[n]``: ``H_i x raw_action_dim``."""


def noise_pack(samples: Sequence[EncodedSample], draws: Sequence[NoiseDraw], raw_action_dim: int,
               device: torch.device) -> NoisyPack:
    """Noise a pack of samples with their draws: the same numbers as noising each one alone."""
    n = len(samples)
    frames = [int(s.x0_vision.shape[2]) for s in samples]
    tokens = [int(s.x0_action.shape[0]) for s in samples]
    # Per latent frame / action token sigma, built on the CPU and moved once; the condition frame is clean.
    first = _first_frames_mask(frames)
    frame_sigma = torch.repeat_interleave(torch.tensor([d.sigma for d in draws], dtype=torch.float32),
                                          torch.tensor(frames))
    frame_sigma[first] = 0.0
    noised = first.logical_not()
    token_sigma = torch.repeat_interleave(torch.tensor([d.sigma_action for d in draws], dtype=torch.float32),
                                          torch.tensor(tokens))
    owner_f = torch.repeat_interleave(torch.arange(n), torch.tensor(frames))
    owner_t = torch.repeat_interleave(torch.arange(n), torch.tensor(tokens))
    numel_v = torch.tensor([s.x0_vision[0].numel() for s in samples], dtype=torch.float32)
    numel_a = torch.tensor(tokens, dtype=torch.float32) * raw_action_dim
    cpu = (frame_sigma, token_sigma, noised.float(), owner_f, owner_t, numel_v, numel_a)
    frame_sigma, token_sigma, noised, owner_f, owner_t, numel_v, numel_a = (t.to(device) for t in cpu)

    x0_v = torch.cat([s.x0_vision for s in samples], dim=2) if n > 1 else samples[0].x0_vision
    x0_a = torch.cat([s.x0_action for s in samples]) if n > 1 else samples[0].x0_action
    eps_v = (torch.cat([d.eps_vision for d in draws], dim=2) if n > 1 else draws[0].eps_vision).to(device)
    eps_a = (torch.cat([d.eps_action for d in draws]) if n > 1 else draws[0].eps_action).to(device)
    valid_f = torch.cat([s.vision_frame_valid for s in samples]) if n > 1 else samples[0].vision_frame_valid
    valid_t = torch.cat([s.action_valid for s in samples]) if n > 1 else samples[0].action_valid

    s_v = frame_sigma.view(1, 1, -1, 1, 1)
    xt_v = eps_v * s_v + x0_v * (1 - s_v)
    s_a = token_sigma.view(-1, 1)
    xt_a = eps_a * s_a + x0_a * (1 - s_a)
    xt_a[:, raw_action_dim:] = 0  # omni_mot_model.py L2060: padded channels are zero, as the pipeline keeps them
    return NoisyPack(
        xt_vision=xt_v, xt_action=xt_a, target_vision=eps_v - x0_v, target_action=eps_a - x0_a,
        frame_weight=noised * valid_f.to(torch.float32), token_weight=valid_t.to(torch.float32),
        frame_owner=owner_f, token_owner=owner_t, vision_numel=numel_v, action_numel=numel_a,
    )


def _first_frames_mask(frames: Sequence[int]) -> torch.Tensor:
    """``[sum T_i]`` bool, True at each sample's first (condition) latent frame."""
    mask = torch.zeros(sum(frames), dtype=torch.bool)
    mask[torch.tensor([0, *frames[:-1]]).cumsum(0)] = True
    return mask


def pack_losses(noisy: NoisyPack, pred_vision: torch.Tensor, pred_action: torch.Tensor,
                raw_action_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample (vision MSE ``[n]``, action MSE ``[n]``), unscaled, from the pack's predictions
    (``[1, C, sum T_i, h, w]`` and ``[sum H_i, D]``)."""
    n = noisy.vision_numel.shape[0]
    sq_v = (pred_vision.float() - noisy.target_vision) ** 2
    per_frame = sq_v.sum(dim=(0, 1, 3, 4)) * noisy.frame_weight
    vision = per_frame.new_zeros(n).index_add(0, noisy.frame_owner, per_frame) / noisy.vision_numel
    sq_a = (pred_action.float()[:, :raw_action_dim] - noisy.target_action[:, :raw_action_dim]) ** 2
    per_token = sq_a.sum(dim=1) * noisy.token_weight
    action = per_token.new_zeros(n).index_add(0, noisy.token_owner, per_token) / noisy.action_numel
    return vision, action

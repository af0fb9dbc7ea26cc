"""The flow-matching noising and losses of a pack of samples, as a few whole-pack tensor operations.

Why whole-pack: with a small model on a GPU a training step costs what the host dispatches, one
kernel launch per operation. Noising each sample and scoring each one alone cost ~57 operations per
sample (plus their backward), so the samples of a pack are handled together: their latent frames are
concatenated along time (``[1, C, sum T_i, h, w]``) and their action tokens along the token axis
(``[sum H_i, D]``), which is also the layout the transformer takes as one vision and one action item
(:func:`~rlinf_cosmos3.models.cosmos3.packing.merge_items`).

The random draws are per sample either way, so a sample's noise never depends on the pack or rank it
lands in. Two sources: :func:`keyed_draws` (what training uses) computes every sample's draws from its
:class:`~rlinf_cosmos3.models.cosmos3.keyed_noise.NoiseKeys` (run seed, step, dataset index) in one
counter-based pass on the device, a constant number of operations per micro-batch; :func:`draw_noise`
draws one sample at a time from a ``torch.Generator`` (CPU by default), in a fixed order: sigma, [the
actions' own sigma], vision noise, action noise, caption dropout. Both end as :class:`PackDraws`; what
depends only on the pack's shapes (owners, masks, denominators: :class:`PackIndex`) is built once per
pack composition.

Objective (cosmos-framework ``omni_mot_model.py`` ``_add_noise_to_input``/``_compute_losses`` and
``algorithm/loss/flow_matching.py``): ``x_t = sigma * eps + (1 - sigma) * x0`` on every latent frame
but each sample's first (the clean condition, sigma 0) and on its action tokens, target ``eps - x0``;
per sample the vision MSE is the mean over all its latent elements with the condition frame and
padded frames zeroed (they stay in the denominator), the action MSE the mean over its
``horizon x raw_action_dim`` real channels with padded steps zeroed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from rlinf_cosmos3.models.cosmos3.configuration import (
    NUM_TRAIN_TIMESTEPS,
    PolicyConfig,
    generator_device,
    sample_sigma,
    sigma_from_draw,
)
from rlinf_cosmos3.models.cosmos3.keyed_noise import (
    STREAM_ACTION,
    STREAM_ACTION_SIGMA,
    STREAM_DROPOUT,
    STREAM_SIGMA,
    STREAM_VISION,
    NoiseKeys,
    keyed_words,
    normal_from_words,
    uniform_from_words,
)
from rlinf_cosmos3.models.cosmos3.processor import EncodedSample


@dataclass
class NoiseDraw:
    """One sample's random draws, on its generator's device."""

    sigma: float
    sigma_action: float
    """= ``sigma`` unless ``PolicyConfig.objective.action_sigma_distribution`` draws the actions' own."""
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
    sigma = sample_sigma(cfg.objective.sigma_distribution, cfg.training_shift, generator)
    sigma_action = (sigma if cfg.objective.action_sigma_distribution is None
                    else sample_sigma(cfg.objective.action_sigma_distribution, cfg.training_shift, generator))
    device = generator_device(generator)
    eps_v = torch.randn(sample.x0_vision.shape, generator=generator, device=device)
    eps_a = torch.randn(sample.x0_action.shape, generator=generator, device=device)
    dropped = cfg.objective.caption_dropout > 0 and float(torch.rand((), generator=generator, device=device)) < cfg.objective.caption_dropout
    return NoiseDraw(sigma=float(sigma), sigma_action=float(sigma_action), eps_vision=eps_v, eps_action=eps_a,
                     dropped=dropped)


@dataclass
class KeyedDraws:
    """The draws of a micro-batch from :class:`~rlinf_cosmos3.models.cosmos3.keyed_noise.NoiseKeys`, as
    device tensors with one row per sample (sample ``i``'s draws depend on its key alone)."""

    sigma: torch.Tensor
    """``[n]`` float32."""
    sigma_action: torch.Tensor
    eps_vision: torch.Tensor | list[torch.Tensor]
    """``[n, C, T, h, w]``; or, when the samples' shapes differ, one ``[1, C, T_i, h, w]`` per sample."""
    eps_action: torch.Tensor | list[torch.Tensor]
    """``[n, H, D]``; or one ``[H_i, D]`` per sample."""
    dropped: list[bool]
    """Caption dropout, on the host (it picks each sample's prompt, so the sequence layout)."""

    def for_pack(self, rows: Sequence[int]) -> PackDraws:
        """The draws of samples ``rows`` (consecutive, as :func:`split_into_packs` groups them) in pack layout."""
        first, last = rows[0], rows[-1] + 1
        if list(rows) != list(range(first, last)):
            raise ValueError(f"a pack holds consecutive samples, got rows {list(rows)}")
        if isinstance(self.eps_vision, torch.Tensor):
            eps_v = self.eps_vision[first:last]
            k, channels, frames, height, width = eps_v.shape
            eps_v = eps_v.transpose(0, 1).reshape(1, channels, k * frames, height, width)
        else:
            eps_v = torch.cat(self.eps_vision[first:last], dim=2)
        if isinstance(self.eps_action, torch.Tensor):
            eps_a = self.eps_action[first:last].flatten(0, 1)
        else:
            eps_a = torch.cat(self.eps_action[first:last])
        return PackDraws(self.sigma[first:last], self.sigma_action[first:last], eps_v, eps_a)


def keyed_draws(cfg: PolicyConfig, samples: Sequence[EncodedSample], keys: NoiseKeys,
                device: torch.device) -> KeyedDraws:
    """Sigma, noise and caption dropout of every sample from its key (one Philox pass on ``device``).

    Streams: sigma (and the actions' own sigma) from a sample's first words, the vision and action noise
    from theirs, the dropout coin computed on the host (it is needed there, and is cheap for n words).
    """
    if len(keys) != len(samples):
        raise ValueError(f"{len(keys)} noise keys for {len(samples)} samples")
    vision_shapes = {tuple(s.x0_vision.shape[1:]) for s in samples}
    action_shapes = {tuple(s.x0_action.shape) for s in samples}
    if len(vision_shapes) > 1 or len(action_shapes) > 1:  # rare (lists of samples built by hand): one at a time
        parts = [keyed_draws(cfg, [s], keys.subset([i]), device) for i, s in enumerate(samples)]
        return KeyedDraws(torch.cat([p.sigma for p in parts]), torch.cat([p.sigma_action for p in parts]),
                          [p.eps_vision for p in parts],  # type: ignore[misc]
                          [p.eps_action[0] for p in parts], [p.dropped[0] for p in parts])  # type: ignore[index]
    (vision_shape,), (action_shape,) = vision_shapes, action_shapes
    n_vision, n_action = math.prod(vision_shape), math.prod(action_shape)
    own_action_sigma = cfg.objective.action_sigma_distribution is not None
    streams = [(STREAM_SIGMA, 2), (STREAM_VISION, n_vision + n_vision % 2), (STREAM_ACTION, n_action + n_action % 2)]
    if own_action_sigma:
        streams.append((STREAM_ACTION_SIGMA, 2))
    words = keyed_words(keys, streams, device)
    sigma = _keyed_sigma(cfg.objective.sigma_distribution, cfg.training_shift, words[0])
    sigma_action = _keyed_sigma(cfg.objective.action_sigma_distribution, cfg.training_shift, words[3]) if own_action_sigma \
        else sigma
    n = len(samples)
    eps_v = normal_from_words(words[1])[:, :n_vision].reshape(n, *vision_shape)
    eps_a = normal_from_words(words[2])[:, :n_action].reshape(n, *action_shape)
    return KeyedDraws(sigma, sigma_action, eps_v, eps_a, keyed_dropout(keys, cfg.objective.caption_dropout))


def _keyed_sigma(distribution: str, shift: float, words: torch.Tensor) -> torch.Tensor:
    """``[n]`` sigmas from each sample's two sigma words (a uniform from the first, or a normal from both)."""
    draw = normal_from_words(words)[:, 0] if distribution == "logitnormal" else uniform_from_words(words[:, 0])
    return sigma_from_draw(distribution, shift, draw)


def keyed_dropout(keys: NoiseKeys, probability: float) -> list[bool]:
    """Whether each sample trains on its unconditional prompt (on the CPU: no device round trip)."""
    if probability <= 0:
        return [False] * len(keys)
    (words,) = keyed_words(keys, [(STREAM_DROPOUT, 1)], "cpu")
    return (uniform_from_words(words[:, 0]) < probability).tolist()


@dataclass
class PackDraws:
    """A pack's draws on the device, samples concatenated as in :class:`NoisyPack`."""

    sigma: torch.Tensor
    """``[n]`` float32."""
    sigma_action: torch.Tensor
    eps_vision: torch.Tensor
    """``[1, C, sum T_i, h, w]``."""
    eps_action: torch.Tensor
    """``[sum H_i, D]``."""

    @classmethod
    def from_draws(cls, draws: Sequence[NoiseDraw], device: torch.device) -> PackDraws:
        """Per-sample generator draws (on their generators' device) gathered and moved once."""
        n = len(draws)
        sigmas = torch.tensor([[d.sigma, d.sigma_action] for d in draws], dtype=torch.float32).to(device)
        eps_v = torch.cat([d.eps_vision for d in draws], dim=2) if n > 1 else draws[0].eps_vision
        eps_a = torch.cat([d.eps_action for d in draws]) if n > 1 else draws[0].eps_action
        return cls(sigmas[:, 0], sigmas[:, 1], eps_v.to(device), eps_a.to(device))


@dataclass
class PackIndex:
    """What noising and scoring a pack needs besides its data and draws: which sample owns each latent frame,
    action token and noisy token, which frames are noised, each sample's loss denominators. It depends only on
    the samples' shapes, so the policy builds it once per pack composition (:func:`pack_index`) and keeps it on
    the device with the packed sequence."""

    frame_owner: torch.Tensor
    """``[sum T_i]`` long: which sample each latent frame belongs to."""
    token_owner: torch.Tensor
    """``[sum H_i]`` long."""
    noised: torch.Tensor
    """``[sum T_i]`` float32: 0 at each sample's first (condition) frame, 1 elsewhere."""
    vision_numel: torch.Tensor
    """``[n]``: the denominator of each sample's vision MSE (all its latent elements)."""
    action_numel: torch.Tensor
    """``[n]``: ``H_i x raw_action_dim``."""
    vision_timestep_owner: torch.Tensor
    """``[noisy vision tokens]`` long: whose timestep each noisy vision token takes."""
    action_timestep_owner: torch.Tensor

    def to(self, device: torch.device) -> PackIndex:
        """On ``device``; copies from the CPU (fresh tensors) do not wait for it."""
        return PackIndex(*(getattr(self, f.name).to(device, non_blocking=True) for f in fields(self)))


def pack_index(vision_shapes: Sequence[Sequence[int]], action_tokens: Sequence[int], raw_action_dim: int,
               noisy_vision_tokens: Sequence[int], noisy_action_tokens: Sequence[int]) -> PackIndex:
    """The :class:`PackIndex` (CPU) of samples of latents ``[1, C, T_i, h, w]`` and ``H_i`` action tokens."""
    frames = torch.tensor([int(shape[2]) for shape in vision_shapes])
    tokens = torch.tensor([int(a) for a in action_tokens])
    owners = torch.arange(len(frames))
    first = torch.zeros(int(frames.sum()), dtype=torch.bool)
    first[torch.cat([torch.zeros(1, dtype=torch.long), frames[:-1]]).cumsum(0)] = True
    return PackIndex(
        frame_owner=torch.repeat_interleave(owners, frames),
        token_owner=torch.repeat_interleave(owners, tokens),
        noised=first.logical_not().to(torch.float32),
        vision_numel=torch.tensor([math.prod(int(d) for d in shape[1:]) for shape in vision_shapes],
                                  dtype=torch.float32),
        action_numel=tokens.to(torch.float32) * raw_action_dim,
        vision_timestep_owner=torch.repeat_interleave(owners, torch.tensor(list(noisy_vision_tokens))),
        action_timestep_owner=torch.repeat_interleave(owners, torch.tensor(list(noisy_action_tokens))),
    )


def pack_timesteps(sigma: torch.Tensor, owner: torch.Tensor) -> torch.Tensor:
    """Per-token timesteps ``1000 sigma`` of the owning sample, rounded once from double as a Python float
    would be (the transformer's timestep embedding sees the same numbers whichever way sigma was drawn)."""
    return (sigma.double() * NUM_TRAIN_TIMESTEPS).to(torch.float32)[owner]


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


def noise_pack(samples: Sequence[EncodedSample], draws: PackDraws, index: PackIndex,
               raw_action_dim: int) -> NoisyPack:
    """Noise a pack of samples with their draws: the same numbers as noising each one alone. Everything is
    on the device already (samples, draws, index): no host work grows with the number of samples."""
    n = len(samples)
    x0_v = torch.cat([s.x0_vision for s in samples], dim=2) if n > 1 else samples[0].x0_vision
    x0_a = torch.cat([s.x0_action for s in samples]) if n > 1 else samples[0].x0_action
    valid_f = torch.cat([s.vision_frame_valid for s in samples]) if n > 1 else samples[0].vision_frame_valid
    valid_t = torch.cat([s.action_valid for s in samples]) if n > 1 else samples[0].action_valid
    eps_v, eps_a = draws.eps_vision, draws.eps_action

    s_v = (draws.sigma[index.frame_owner] * index.noised).view(1, 1, -1, 1, 1)  # the condition frame is clean
    xt_v = eps_v * s_v + x0_v * (1 - s_v)
    s_a = draws.sigma_action[index.token_owner].view(-1, 1)
    xt_a = eps_a * s_a + x0_a * (1 - s_a)
    xt_a[:, raw_action_dim:] = 0  # omni_mot_model.py L2060: padded channels are zero, as the pipeline keeps them
    return NoisyPack(
        xt_vision=xt_v, xt_action=xt_a, target_vision=eps_v - x0_v, target_action=eps_a - x0_a,
        frame_weight=index.noised * valid_f.to(torch.float32), token_weight=valid_t.to(torch.float32),
        frame_owner=index.frame_owner, token_owner=index.token_owner, vision_numel=index.vision_numel,
        action_numel=index.action_numel,
    )


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

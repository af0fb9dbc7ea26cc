"""Cosmos3Policy: the flow-matching SFT objective of the Cosmos3 policy task on diffusers' own pieces.

The model sees at training exactly what it sees when served: the sequence is built with the
diffusers ``Cosmos3OmniPipeline`` helpers (``tokenize_prompt(..., action_mode="policy")``,
``_prepare_action_video_conditioning``, ``_encode_video``, ``_prepare_text_segment``,
``_prepare_vision_segment``, ``_prepare_action_segment``), with the serving path's settings
(SGLang: no system prompt, guidance 1.0 so no unconditional pass). ``tests/test_policy_parity.py``
checks this against what the pipeline passes to the transformer.

Objective (cosmos-framework ``omni_mot_model.py`` ``training_step``/``_add_noise_to_input``/
``_compute_losses`` and ``algorithm/loss/flow_matching.py``; choices of ours in
``docs/sft_objective.md``): per sample one sigma, shared by vision and actions
(``independent_action_schedule=False``; ``action_sigma_distribution`` gives actions their own); the clean first latent frame is the condition, the later
latent frames and the 16 action tokens are noised, ``x_t = sigma * eps + (1 - sigma) * x0``; the
transformer gets timestep ``1000 * sigma`` and predicts the velocity ``eps - x0``; the loss is
``loss_scale * (vision_mse + action_mse * action_loss_weight)``, each the mean over samples.

Samples of a micro-batch share one transformer call (:mod:`~rlinf_cosmos3.models.cosmos3.packing`,
document-masked attention) up to ``max_tokens_per_pack`` tokens; with ``max_tokens_per_pack=None``
each sample runs alone (the reference path: identical whatever the batch split, which keeps
data-parallel training bit-equal to one process). Both paths draw the same noise and compute the
same per-sample losses. Within a pack, the samples enter the transformer as one vision and one action
item and are noised and scored as whole-pack tensors (:mod:`~rlinf_cosmos3.models.cosmos3.flow_matching`):
a step's host work no longer grows with the number of samples.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rlinf_cosmos3.models.cosmos3 import loading
from rlinf_cosmos3.models.cosmos3.captioned_pipeline import CaptionedCosmos3Pipeline
from rlinf_cosmos3.models.cosmos3.configuration import (
    NUM_TRAIN_TIMESTEPS,
    SHIFT_BY_TIER,
    SIGMA_DISTRIBUTIONS,
    PolicyConfig,
    canvas_tier,
    sample_sigma,
)
from rlinf_cosmos3.models.cosmos3.domains import NUM_INFERENCE_STEPS, get_action_domain
from rlinf_cosmos3.models.cosmos3.flow_matching import (
    NoiseDraw,
    PackDraws,
    PackIndex,
    draw_noise,
    keyed_draws,
    noise_pack,
    pack_index,
    pack_losses,
    pack_timesteps,
)
from rlinf_cosmos3.models.cosmos3.inference import predict_actions
from rlinf_cosmos3.models.cosmos3.keyed_noise import NoiseKeys
from rlinf_cosmos3.models.cosmos3.observation import compose_observation
from rlinf_cosmos3.models.cosmos3.packed_attention import install_packed_attention, packed_processor_of
from rlinf_cosmos3.models.cosmos3.packing import (
    POSITION_HALVES,
    DocumentLayout,
    merge_items,
    pack_layout,
    split_into_packs,
)
from rlinf_cosmos3.models.cosmos3.parallelize import precision_dtype
from rlinf_cosmos3.models.cosmos3.pooled_features import (
    capture_generation_states,
    condition_token_offsets,
    pool_condition_tokens,
)
from rlinf_cosmos3.models.cosmos3.processor import (
    EncodedSample,
    PolicyProcessor,
    latent_frame_valid,
    prepare_actions,
)

__all__ = [
    "NUM_TRAIN_TIMESTEPS",
    "SHIFT_BY_TIER",
    "SIGMA_DISTRIBUTIONS",
    "Cosmos3Policy",
    "EncodedSample",
    "NoiseDraw",
    "NoiseKeys",
    "PolicyConfig",
    "canvas_tier",
    "latent_frame_valid",
    "prepare_actions",
    "sample_sigma",
]

logger = logging.getLogger(__name__)

_SEGMENT_BOOKKEEPING = ("key", "id", POSITION_HALVES)
"""Segment entries that are the cache's own, not transformer arguments."""

PACK_CACHE_SIZE = 8
"""Packed sequences kept on the device (least recently used dropped): a single-task run without caption
dropout repeats one or two packs; with dropout almost every pack is new and caching would only hold memory."""


class Cosmos3Policy(nn.Module):
    """Trainable Cosmos3 transformer + frozen VAE/tokenizer, with the policy SFT loss.

    ``transformer`` is what trains and what checkpoints save; the VAE is frozen (no grads, eval,
    never sharded). ``pipeline`` is diffusers' pipeline over the same modules, used for its
    sequence helpers and for :meth:`predict`. The transformer's attention modules get the packed
    document-attention processor, which behaves as diffusers' own when nothing is packed.
    """

    def __init__(
        self,
        transformer: nn.Module,
        vae: nn.Module,
        tokenizer: Any,
        scheduler: Any,
        cfg: PolicyConfig | None = None,
    ) -> None:
        super().__init__()
        self.cfg = cfg or PolicyConfig()
        self.transformer = transformer
        self.vae = vae.eval().requires_grad_(False)
        self.domain = get_action_domain(self.cfg.domain_name)
        self.pipeline = CaptionedCosmos3Pipeline(
            transformer=transformer,
            text_tokenizer=tokenizer,
            vae=vae,
            scheduler=scheduler,
            enable_safety_checker=False,
            default_use_system_prompt=False,  # SGLang's action mode sends no system prompt
        )
        self.pipeline.set_progress_bar_config(disable=True)
        self.processor = PolicyProcessor(self.pipeline, self.cfg, self.domain.raw_action_dim)
        self.attention = install_packed_attention(transformer, self.cfg.objective.attention_backend)
        self._segments: dict[tuple, dict[str, Any]] = {}
        self._segment_ids = itertools.count()
        self._packs: OrderedDict[tuple, tuple[dict[str, Any], DocumentLayout, PackIndex]] = OrderedDict()

    @classmethod
    def from_pretrained(
        cls,
        model_dir: str | Path,
        cfg: PolicyConfig | None = None,
        *,
        device: torch.device | str = "cpu",
        transformer_dtype: torch.dtype = torch.float32,
        vae_dtype: torch.dtype = torch.float32,
        transformer_on_meta: bool = False,
    ) -> Cosmos3Policy:
        """Load a diffusers Cosmos3 directory; ``transformer_on_meta`` for shard-then-load (fp32 master)."""
        transformer = (
            loading.build_transformer_on_meta(model_dir)
            if transformer_on_meta
            else loading.load_transformer(model_dir, dtype=transformer_dtype, device=device)
        )
        vae = loading.load_vae(model_dir, dtype=vae_dtype, device=device)
        return cls(transformer, vae, loading.load_tokenizer(model_dir), loading.load_scheduler(model_dir), cfg)

    def train(self, mode: bool = True) -> Cosmos3Policy:
        """Train mode for the transformer only: the frozen VAE stays in eval mode."""
        super().train(mode)
        self.vae.eval()
        return self

    # ------------------------------------------------------------------ properties

    @property
    def device(self) -> torch.device:
        """Where inputs go: the VAE's device (the transformer may be sharded or still on meta)."""
        return next(self.vae.parameters()).device

    @property
    def compute_dtype(self) -> torch.dtype:
        if self.cfg.precision is not None:
            return precision_dtype(self.cfg.precision)
        return self.transformer.dtype

    # ------------------------------------------------------------------ frozen part

    @torch.no_grad()
    def encode_batch(
        self, batch: Mapping[str, Any], generator: torch.Generator | Sequence[torch.Generator] | None = None
    ) -> list[EncodedSample]:
        """Tokenize prompts and VAE-encode the 17-frame canvases of a batch (or take its cached latents);
        ``generator`` seeds the ``cosmos_framework`` caption's paraphrase draws without being consumed."""
        return self.processor.encode_batch(batch, self.transformer.config.action_dim, generator)

    # ------------------------------------------------------------------ sequence

    def _segments_for(self, input_ids: Sequence[int], vision_shape: tuple[int, ...], action_len: int,
                      device: torch.device | None = None) -> dict:
        """The pipeline's static text/vision/action segments for one sample, memoised by their inputs
        (on the policy's device unless ``device`` is given; its ``key`` names the entry)."""
        pipe, fps = self.pipeline, self.cfg.fps
        device = self.device if device is None else torch.device(device)
        key = (tuple(input_ids), tuple(vision_shape), action_len, str(device))
        if key not in self._segments:
            text = pipe._prepare_text_segment(list(input_ids), device=device)
            vision = pipe._prepare_vision_segment(
                input_vision_tokens=torch.empty(vision_shape, device="meta"),
                has_image_condition=True,
                mrope_offset=text["vision_start_temporal_offset"],
                vision_fps=fps,
                curr=text["und_len"],
                device=device,
                condition_frame_indexes=[0],
            )
            action = pipe._prepare_action_segment(
                input_action_tokens=torch.empty(action_len, 1, device="meta"),
                condition_frame_indexes=[],  # policy: every action token is generated
                mrope_offset=text["vision_start_temporal_offset"],
                action_fps=fps,
                curr=text["und_len"] + vision["num_vision_tokens"],
                device=device,
            )
            if len(self._segments) >= 1024:
                self._segments.clear()
            self._segments[key] = {
                "key": key,
                "id": next(self._segment_ids),
                "input_ids": text["input_ids"],
                "text_indexes": text["text_indexes"],
                "position_ids": torch.cat(
                    [text["text_mrope_ids"], vision["vision_mrope_ids"], action["action_mrope_ids"]], dim=1
                ),
                POSITION_HALVES: (text["text_mrope_ids"],
                                  torch.cat([vision["vision_mrope_ids"], action["action_mrope_ids"]], dim=1)),
                "und_len": text["und_len"],
                "sequence_length": text["und_len"] + vision["num_vision_tokens"] + action["action_len"],
                "vision_token_shapes": vision["vision_token_shapes"],
                "vision_sequence_indexes": vision["vision_sequence_indexes"],
                "vision_mse_loss_indexes": vision["vision_mse_loss_indexes"],
                "vision_noisy_frame_indexes": vision["vision_noisy_frame_indexes"],
                "num_noisy_vision_tokens": vision["num_noisy_vision_tokens"],
                "action_token_shapes": action["action_token_shapes"],
                "action_sequence_indexes": action["action_sequence_indexes"],
                "action_mse_loss_indexes": action["action_mse_loss_indexes"],
                "action_noisy_frame_indexes": action["action_noisy_frame_indexes"],
                "num_noisy_action_tokens": action["num_noisy_action_tokens"],
                "action_domain_ids": [torch.tensor([self.domain.domain_id], dtype=torch.long, device=device)],
            }
        return self._segments[key]

    def transformer_inputs(
        self,
        input_ids: Sequence[int],
        noisy_vision: torch.Tensor,
        noisy_action: torch.Tensor,
        timestep: float,
        action_timestep: float | None = None,
    ) -> dict[str, Any]:
        """The transformer's keyword arguments for one sample, assembled as ``Cosmos3OmniPipeline.__call__``
        does (steps 3 and 5 of its conditional pass), with the clean first latent frame as condition
        (``action_timestep``: the action tokens' own, default ``timestep``)."""
        device, dtype = self.device, self.compute_dtype
        seg = self._segments_for(input_ids, tuple(noisy_vision.shape), noisy_action.shape[0])
        inputs = {k: v for k, v in seg.items() if not k.startswith("num_noisy") and k not in _SEGMENT_BOOKKEEPING}
        inputs["vision_tokens"] = [noisy_vision.to(device=device, dtype=dtype)]
        inputs["vision_timesteps"] = torch.full((seg["num_noisy_vision_tokens"],), timestep, device=device)
        inputs["action_tokens"] = [noisy_action.to(device=device, dtype=dtype)]
        inputs["action_timesteps"] = torch.full((seg["num_noisy_action_tokens"],),
                                                timestep if action_timestep is None else action_timestep, device=device)
        return inputs

    # ------------------------------------------------------------------ loss

    def sft_loss(
        self,
        batch: Mapping[str, Any],
        generator: torch.Generator | Sequence[torch.Generator] | NoiseKeys | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Flow-matching loss of a training batch (``rlinf_cosmos3.data`` layout) and its parts.

        ``generator`` draws sigma, noise and caption dropout: :class:`NoiseKeys` (what training passes:
        each sample's draws a function of (run seed, step, dataset index), computed for the whole batch on
        the device); or one ``torch.Generator`` for the whole batch (sample after sample), or one per
        sample. Keys and per-sample generators make the draws independent of how the batch is split over
        ranks. The returned parts are device tensors: reading them is the caller's host sync.
        """
        return self.loss_from_encoded(self.encode_batch(batch, generator), generator)

    def loss_from_encoded(
        self,
        samples: Sequence[EncodedSample],
        generator: torch.Generator | Sequence[torch.Generator] | NoiseKeys | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss of :meth:`sft_loss` on already encoded samples (frozen parts run once, e.g. cached)."""
        if not samples:
            raise ValueError("empty batch")
        if isinstance(generator, NoiseKeys):
            keyed = keyed_draws(self.cfg, samples, generator, self.device)
            dropped = keyed.dropped
        else:
            if isinstance(generator, Sequence):
                if len(generator) != len(samples):
                    raise ValueError(f"{len(generator)} generators for {len(samples)} samples")
                generators = list(generator)
            else:
                generators = [generator] * len(samples)
            # Draws first, sample after sample, so a shared generator yields the same numbers on both paths.
            draws = [draw_noise(self.cfg, sample, gen) for sample, gen in zip(samples, generators, strict=True)]
            dropped = [d.dropped for d in draws]
        segments = self._sample_segments(samples, dropped)
        vision_parts, action_parts = [], []
        for pack in split_into_packs([seg["sequence_length"] for seg in segments], self.cfg.max_tokens_per_pack):
            pack_draws = (keyed.for_pack(pack) if isinstance(generator, NoiseKeys)
                          else PackDraws.from_draws([draws[i] for i in pack], self.device))
            vision, action = self._pack_losses([samples[i] for i in pack], pack_draws, [segments[i] for i in pack])
            vision_parts.append(vision)
            action_parts.append(action)
        vision = torch.cat(vision_parts).mean() if len(vision_parts) > 1 else vision_parts[0].mean()
        action = torch.cat(action_parts).mean() if len(action_parts) > 1 else action_parts[0].mean()
        loss = self.cfg.objective.loss_scale * (vision + self.cfg.objective.action_loss_weight * action)
        metrics = {"loss": loss.detach(), "vision_loss": vision.detach(), "action_loss": action.detach()}
        return loss, metrics

    def _sample_segments(self, samples: Sequence[EncodedSample], dropped: Sequence[bool]) -> list[dict[str, Any]]:
        """Each sample's CPU segments (its prompt, or the unconditional one when dropped). Samples of one prompt
        share its id list (the processor tokenizes a prompt once), so each distinct one is looked up once."""
        cpu = torch.device("cpu")
        seen: dict[tuple[int, tuple[int, ...], int], dict[str, Any]] = {}
        segments = []
        for sample, drop in zip(samples, dropped, strict=True):
            ids = sample.uncond_input_ids if drop else sample.input_ids
            shape = tuple(sample.x0_vision.shape)
            local = (id(ids), shape, sample.x0_action.shape[0])
            if local not in seen:
                seen[local] = self._segments_for(ids, shape, sample.x0_action.shape[0], cpu)
            segments.append(seen[local])
        return segments

    def _pack_losses(self, samples: Sequence[EncodedSample], draws: PackDraws,
                     segments: Sequence[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
        """One transformer call for a pack of samples (one sample: diffusers' own attention); the per-sample
        (vision, action) MSEs. Samples enter as one vision and one action item (:func:`merge_items`)."""
        raw_dim, dtype = self.domain.raw_action_dim, self.compute_dtype
        static, layout, index = self._packed_sequence(segments)
        noisy = noise_pack(samples, draws, index, raw_dim)
        kwargs = {**static, "vision_tokens": [noisy.xt_vision.to(dtype)], "action_tokens": [noisy.xt_action.to(dtype)],
                  "vision_timesteps": pack_timesteps(draws.sigma, index.vision_timestep_owner),
                  "action_timesteps": pack_timesteps(draws.sigma_action, index.action_timestep_owner)}
        pred_v, pred_a = self._call_pack(kwargs, len(samples), layout)
        return pack_losses(noisy, pred_v, pred_a, raw_dim)

    def _call_pack(self, kwargs: dict[str, Any], num_samples: int,
                   layout: DocumentLayout) -> tuple[torch.Tensor, torch.Tensor]:
        """One transformer call on a pack's arguments: diffusers' own attention for one sample, the packed
        document attention for several. The (vision, action) predictions of the pack's one merged item each."""
        if num_samples == 1:
            preds_v, _, preds_a = self.transformer(**kwargs, return_dict=False)
        else:
            processor = packed_processor_of(self.transformer)
            if processor is None:
                raise RuntimeError(
                    "packing several samples needs the packed attention processor on every attention module "
                    "(it was replaced); set max_tokens_per_pack=None for one call per sample"
                )
            with processor.packed(layout):
                preds_v, _, preds_a = self.transformer(**kwargs, return_dict=False)
        return preds_v[0], preds_a[0]

    def packed_velocity(self, input_ids: Sequence[Sequence[int]], xt_vision: torch.Tensor, xt_action: torch.Tensor,
                        sigma: torch.Tensor, *, pooled: bool = False) -> tuple[torch.Tensor, ...]:
        """Velocity predictions (float32 ``[B, C, T, h, w]``, ``[B, H, action_dim]``) for a batch of noisy states at
        per-sample ``sigma`` (``[B]``), through the loss's own forward: the same segments and packs (split by
        ``max_tokens_per_pack``), one transformer call per pack, timesteps ``1000 sigma``. RL samples and rescores
        its chains with it, so rollout and training share one forward. Nothing is masked: the condition frame's
        and the padded channels' predictions are the caller's to discard. Differentiable in the weights.
        ``pooled``: also return ``[B, hidden]`` float32, each sample's condition-frame tokens' final states
        averaged, from the same calls (:mod:`~rlinf_cosmos3.models.cosmos3.pooled_features`: PPO's value input)."""
        batch, _, frames, _, _ = xt_vision.shape
        if len(input_ids) != batch or xt_action.shape[0] != batch:
            raise ValueError(f"{len(input_ids)} prompts, {batch} vision and {xt_action.shape[0]} action states")
        horizon = xt_action.shape[1]
        device, dtype = self.device, self.compute_dtype
        cpu = torch.device("cpu")
        segments = [self._segments_for(list(ids), (1, *xt_vision.shape[1:]), horizon, cpu) for ids in input_ids]
        sigma = torch.as_tensor(sigma).to(device)
        parts_v, parts_a, parts_f = [], [], []
        for pack in split_into_packs([seg["sequence_length"] for seg in segments], self.cfg.max_tokens_per_pack):
            static, layout, index = self._packed_sequence([segments[i] for i in pack])
            rows = torch.tensor(pack, device=device)
            # samples enter as one item: frames concatenated along time, action tokens along the token axis
            vision = xt_vision.to(device).index_select(0, rows)
            vision = vision.transpose(0, 1).reshape(1, vision.shape[1], len(pack) * frames, *vision.shape[3:])
            action = xt_action.to(device).index_select(0, rows).flatten(0, 1)
            kwargs = {**static, "vision_tokens": [vision.to(dtype)], "action_tokens": [action.to(dtype)],
                      "vision_timesteps": pack_timesteps(sigma[rows], index.vision_timestep_owner),
                      "action_timesteps": pack_timesteps(sigma[rows], index.action_timestep_owner)}
            if pooled:
                with capture_generation_states(self.transformer) as states:
                    pred_v, pred_a = self._call_pack(kwargs, len(pack), layout)
                (gen_states,) = states  # one transformer call per pack
                parts_f.append(pool_condition_tokens(gen_states, [start for start, _ in layout.gen_spans()],
                                                     [condition_token_offsets(segments[i]) for i in pack]))
            else:
                pred_v, pred_a = self._call_pack(kwargs, len(pack), layout)
            pred_v = pred_v.float()
            parts_v.append(pred_v.reshape(pred_v.shape[1], len(pack), frames, *pred_v.shape[3:]).transpose(0, 1))
            parts_a.append(pred_a.float().reshape(len(pack), horizon, -1))
        if pooled:  # packs are consecutive runs of samples: batch order
            return torch.cat(parts_v), torch.cat(parts_a), torch.cat(parts_f)
        return torch.cat(parts_v), torch.cat(parts_a)

    def _packed_sequence(self, segments: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], DocumentLayout, PackIndex]:
        """The packed call's sequence arguments (ids, positions, indexes, merged items) and the pack's
        :class:`PackIndex` on the device, built on the CPU from the samples' CPU segments and memoised by them
        (a pack of the same prompts and shapes recurs every step; the key is the segments' ids, cheap to hash)."""
        device = self.device
        key = (str(device), *(seg["id"] for seg in segments))
        entry = self._packs.get(key)
        if entry is not None:
            self._packs.move_to_end(key)
            return entry
        static, layout = pack_layout(segments)
        static.update(merge_items(segments))
        index = pack_index([seg["key"][1] for seg in segments], [seg["key"][2] for seg in segments],
                           self.domain.raw_action_dim, [seg["num_noisy_vision_tokens"] for seg in segments],
                           [seg["num_noisy_action_tokens"] for seg in segments])
        entry = ({name: _to_device(value, device) for name, value in static.items()}, layout, index.to(device))
        self._packs[key] = entry
        while len(self._packs) > PACK_CACHE_SIZE:  # device tensors and block masks: keep a few
            self._packs.popitem(last=False)
        return entry

    # ------------------------------------------------------------------ inference

    @torch.no_grad()
    def predict(
        self,
        main: np.ndarray,
        wrist: np.ndarray,
        prompt: str,
        *,
        seed: int,
        num_inference_steps: int = NUM_INFERENCE_STEPS,
    ) -> torch.Tensor:
        """Normalised ``[horizon, raw_action_dim]`` actions for one observation (two ``[h, w, 3]``
        uint8 views) through the diffusers pipeline, as the embedded backend samples them
        (:func:`~rlinf_cosmos3.models.cosmos3.inference.predict_actions`, the scheduler's own flow shift).

        Needs a transformer the pipeline can call directly: unsharded, or sharded without mixed
        precision (the pipeline casts tokens to the parameters' dtype).
        """
        cfg = self.cfg
        canvas = compose_observation(
            np.asarray(main), np.asarray(wrist), height=cfg.canvas_height, width=cfg.canvas_width, channels_last=True
        )
        return predict_actions(self.pipeline, canvas, prompt, seed=seed, domain_name=cfg.domain_name,
                               action_horizon=cfg.action_horizon, view_point=cfg.view_point,
                               num_frames=cfg.num_frames, fps=cfg.fps, num_inference_steps=num_inference_steps,
                               resolution_tier=cfg.objective.resolution_tier, caption_style=cfg.caption_style)


def _to_device(value: Any, device: torch.device) -> Any:
    """A tensor, or a list of tensors and shape tuples, on ``device`` (copies from the CPU do not wait for it)."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, list):
        return [_to_device(v, device) for v in value]
    return value

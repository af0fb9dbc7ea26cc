"""Packed training: several samples in one transformer call give the per-sample losses and gradients.

Everything runs on a real tiny random Cosmos3 (diffusers) on CPU. The per-sample path
(``max_tokens_per_pack=None``: one transformer call per sample, diffusers' own attention processor) is
the reference; the packed path re-indexes the same pipeline-built inputs into one sequence and keeps
samples apart with the document-masked processor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from rlinf_cosmos3.config.objective import ObjectiveConfig
from rlinf_cosmos3.config.sft import DEFAULT_MAX_TOKENS_PER_PACK as CONFIG_DEFAULT
from rlinf_cosmos3.models.cosmos3.configuration import DEFAULT_MAX_TOKENS_PER_PACK
from rlinf_cosmos3.models.cosmos3.flow_matching import draw_noise
from rlinf_cosmos3.models.cosmos3.packed_attention import PackedDocumentAttnProcessor, packed_processor_of
from rlinf_cosmos3.models.cosmos3.packing import (
    DocumentLayout,
    merge_items,
    pack_transformer_inputs,
    split_into_packs,
)
from rlinf_cosmos3.models.cosmos3.policy import Cosmos3Policy, EncodedSample, PolicyConfig
from rlinf_cosmos3.models.cosmos3.tiny import write_model_dir

PROMPTS = [
    "pick up the black bowl between the plate and the ramekin and place it on the plate",
    "put the mug on the plate",
    "pick up the alphabet soup and place it in the basket",
    "push the plate",
]
B = len(PROMPTS)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("cosmos3") / "tiny", preset="tiny", seed=0)


@pytest.fixture(scope="module")
def policy(model_dir: Path) -> Cosmos3Policy:
    return Cosmos3Policy.from_pretrained(model_dir, PolicyConfig(objective=ObjectiveConfig(caption_dropout=0.5)))


@pytest.fixture(scope="module")
def encoded(policy: Cosmos3Policy) -> list[EncodedSample]:
    """Latent batches of different prompt lengths, with padded latent frames and padded action steps."""
    g = torch.Generator().manual_seed(0)
    batch = {
        "x0_vision": torch.randn(B, 48, 5, 12, 20, generator=g) * 0.2,
        "vision_frame_valid": torch.ones(B, 5, dtype=torch.bool),
        "actions": torch.rand(B, 16, 10, generator=g) * 2 - 1,
        "action_is_pad": torch.zeros(B, 16, dtype=torch.bool),
        "prompt": PROMPTS,
    }
    batch["vision_frame_valid"][1, 3:] = False
    batch["action_is_pad"][1, 9:] = True
    batch["action_is_pad"][3, 14:] = True
    samples = policy.encode_batch(batch)
    assert len({len(s.input_ids) for s in samples}) > 1, "prompts of different token lengths"
    return samples


def _generators(offset: int = 100) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(offset + i) for i in range(B)]


@contextmanager
def _count_calls(module: torch.nn.Module) -> Iterator[list[int]]:
    calls: list[int] = []
    handle = module.register_forward_pre_hook(lambda _m, _a, kw: calls.append(kw["sequence_length"]),
                                              with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


def _loss_and_grads(policy: Cosmos3Policy, samples: list[EncodedSample], max_tokens: int | None,
                    offset: int = 100) -> tuple[dict[str, float], dict[str, torch.Tensor], list[int]]:
    policy.cfg = dataclasses.replace(policy.cfg, max_tokens_per_pack=max_tokens)
    policy.processor.cfg = policy.cfg
    policy.transformer.zero_grad(set_to_none=True)
    with _count_calls(policy.transformer) as calls:
        loss, metrics = policy.loss_from_encoded(samples, _generators(offset))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in policy.transformer.named_parameters() if p.grad is not None}
    return {k: float(v) for k, v in metrics.items()}, grads, calls


def _assert_close(ref: tuple, got: tuple) -> None:
    (ref_metrics, ref_grads, _), (metrics, grads, _) = ref, got
    for key, value in ref_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert sorted(grads) == sorted(ref_grads)
    for name, grad in ref_grads.items():
        scale = float(grad.abs().max()) + 1e-12
        assert float((grads[name] - grad).abs().max()) <= 1e-4 * scale, name


def test_recipe_packs_by_default() -> None:
    assert PolicyConfig().max_tokens_per_pack == DEFAULT_MAX_TOKENS_PER_PACK == CONFIG_DEFAULT == 74_000


def test_one_packed_call_gives_the_per_sample_losses_and_gradients(
    policy: Cosmos3Policy, encoded: list[EncodedSample]
) -> None:
    """Different prompt lengths, padded frames and actions, caption dropout (some samples drop): all equal."""
    reference = _loss_and_grads(policy, encoded, None)
    packed = _loss_and_grads(policy, encoded, 100_000)
    assert len(reference[2]) == B and len(packed[2]) == 1, "per-sample: B calls; packed: one"
    assert packed[2][0] == sum(reference[2])
    _assert_close(reference, packed)
    # The draws differ with other seeds: the comparison is not between two constants.
    other = _loss_and_grads(policy, encoded, 100_000, offset=7)
    assert other[0]["loss"] != packed[0]["loss"]


def test_caption_dropout_is_exercised(policy: Cosmos3Policy, encoded: list[EncodedSample]) -> None:
    """With these seeds some samples train on the unconditional prompt (a different text length)."""
    draws = [draw_noise(policy.cfg, s, g) for s, g in zip(encoded, _generators(), strict=True)]
    dropped = [d.dropped for d in draws]
    assert any(dropped) and not all(dropped)


def test_a_micro_batch_longer_than_a_pack_is_split(policy: Cosmos3Policy, encoded: list[EncodedSample]) -> None:
    reference = _loss_and_grads(policy, encoded, None)
    lengths = reference[2]
    bound = lengths[0] + lengths[1]  # the first two fit together, then the rest
    split = _loss_and_grads(policy, encoded, bound)
    assert split[2] == [lengths[0] + lengths[1], *([lengths[2] + lengths[3]] if lengths[2] + lengths[3] <= bound
                                                   else [lengths[2], lengths[3]])]
    _assert_close(reference, split)


def test_split_into_packs() -> None:
    assert split_into_packs([5, 5, 5], None) == [[0], [1], [2]]
    assert split_into_packs([5, 5, 5], 10) == [[0, 1], [2]]
    assert split_into_packs([5, 12, 5], 10) == [[0], [1], [2]], "an over-long sample stands alone"
    assert split_into_packs([3, 3, 3, 3], 100) == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match=">= 1"):
        split_into_packs([1], 0)


def test_packed_layout_text_first_then_each_samples_generation_tokens(
    policy: Cosmos3Policy, encoded: list[EncodedSample]
) -> None:
    items = [policy.transformer_inputs(s.input_ids, s.x0_vision, s.x0_action, 500.0) for s in encoded[:2]]
    packed, layout = pack_transformer_inputs(items)
    t0, t1 = (int(i["und_len"]) for i in items)
    g0, g1 = (int(i["sequence_length"]) - int(i["und_len"]) for i in items)
    assert layout == DocumentLayout((t0, t1), (g0, g1))
    assert packed["und_len"] == t0 + t1 and packed["sequence_length"] == t0 + t1 + g0 + g1
    assert packed["text_indexes"].tolist() == list(range(t0 + t1))
    # Sample 1's vision tokens start right after sample 0's whole generation block.
    assert int(packed["vision_sequence_indexes"][len(items[0]["vision_sequence_indexes"])]) == t0 + t1 + g0
    assert int(packed["action_sequence_indexes"][-1]) == t0 + t1 + g0 + g1 - 1
    # Every sample keeps its own positions: sample 1's text positions restart at 0.
    assert torch.equal(packed["position_ids"][:, t0:t0 + t1], items[1]["position_ids"][:, :t1])
    assert torch.equal(packed["position_ids"][:, t0 + t1 + g0:], items[1]["position_ids"][:, t1:])
    # Each position is used once.
    used = torch.cat([packed["text_indexes"], packed["vision_sequence_indexes"], packed["action_sequence_indexes"]])
    assert sorted(used.tolist()) == list(range(packed["sequence_length"]))


def test_processor_is_diffusers_own_when_nothing_is_packed(policy: Cosmos3Policy, encoded: list[EncodedSample]) -> None:
    """Installed on every layer (public set_attn_processor), it leaves a single-sample call bit-identical."""
    processor = packed_processor_of(policy.transformer)
    assert isinstance(processor, PackedDocumentAttnProcessor) and processor.layout is None
    sample = encoded[0]
    inputs = policy.transformer_inputs(sample.input_ids, sample.x0_vision, sample.x0_action, 250.0)
    with torch.no_grad():
        ours = policy.transformer(**inputs, return_dict=False)
        policy.transformer.set_attn_processor(processor._stock)
        try:
            stock = policy.transformer(**inputs, return_dict=False)
        finally:
            policy.transformer.set_attn_processor(processor)
    assert torch.equal(ours[0][0], stock[0][0]) and torch.equal(ours[2][0], stock[2][0])


def test_packing_refuses_a_replaced_processor(model_dir: Path, encoded: list[EncodedSample]) -> None:
    from diffusers.models.transformers.transformer_cosmos3 import Cosmos3AttnProcessor

    policy = Cosmos3Policy.from_pretrained(model_dir)
    policy.transformer.set_attn_processor(Cosmos3AttnProcessor())
    with pytest.raises(RuntimeError, match="packed attention processor"):
        policy.loss_from_encoded(encoded[:2], _generators()[:2])


@pytest.mark.slow
def test_flex_backend_masks_like_the_per_sample_calls(policy: Cosmos3Policy, encoded: list[EncodedSample]) -> None:
    """FlexAttention's document masks (forward: CPU flex has no backward) give the per-sample outputs."""
    items = [policy.transformer_inputs(s.input_ids, s.x0_vision, s.x0_action, 500.0) for s in encoded]
    packed, layout = pack_transformer_inputs(items)
    processor = policy.attention
    with torch.no_grad():
        reference = [policy.transformer(**item, return_dict=False) for item in items]
        processor.backend = "flex"
        try:
            with processor.packed(layout):
                vision, _, action = policy.transformer(**packed, return_dict=False)
        finally:
            processor.backend = "auto"
    for i, (ref_vision, _, ref_action) in enumerate(reference):
        assert torch.allclose(vision[i], ref_vision[0], atol=1e-5), i
        assert torch.allclose(action[i], ref_action[0], atol=1e-5), i


def test_batched_vae_encode_matches_one_clip_at_a_time(policy: Cosmos3Policy) -> None:
    """The whole micro-batch through the pipeline helpers at once: PIL-clip pixels, near-equal latents."""
    g = torch.Generator().manual_seed(3)
    batch = {"image": torch.randint(0, 256, (3, 17, 3, 256, 256), dtype=torch.uint8, generator=g),
             "wrist_image": torch.randint(0, 256, (3, 17, 3, 256, 256), dtype=torch.uint8, generator=g)}
    processor, pipe = policy.processor, policy.pipeline
    canvases = processor.canvases(batch)
    video, *_ = pipe._prepare_action_video_conditioning(canvases.float() / 255.0, 256, 17, device="cpu",
                                                         dtype=torch.float32)
    for i in range(3):  # the pipeline's own one-clip path, from PIL images as SGLang gets them
        clip = [Image.fromarray(np.ascontiguousarray(f.permute(1, 2, 0).numpy())) for f in canvases[i]]
        one, *_ = pipe._prepare_action_video_conditioning(clip, 256, 17, device="cpu", dtype=torch.float32)
        assert torch.equal(one[0], video[i]), "same pixels into the VAE"
    batched = processor.encode_canvases(canvases)
    singles = torch.cat([processor.encode_canvases(canvases[i : i + 1]) for i in range(3)])
    assert batched.shape == (3, 48, 5, 12, 20)
    assert torch.allclose(batched, singles, atol=1e-5, rtol=1e-5)


def test_prompt_ids_are_tokenized_once(policy: Cosmos3Policy) -> None:
    first = policy.processor.prompt_ids("put the mug on the plate")
    assert policy.processor.prompt_ids("put the mug on the plate") is first
    ids, uncond = first
    assert ids != uncond and len(ids) > len(uncond)


def test_merged_items_give_the_per_item_outputs(policy: Cosmos3Policy, encoded: list[EncodedSample]) -> None:
    """Samples as ONE vision and ONE action item (frames / tokens concatenated, noisy indexes shifted) give
    what one item per sample gives, also for samples with different numbers of latent frames."""
    samples = [encoded[0], dataclasses.replace(encoded[1], x0_vision=encoded[1].x0_vision[:, :, :3],
                                               vision_frame_valid=encoded[1].vision_frame_valid[:3]), encoded[2]]
    items = [policy.transformer_inputs(s.input_ids, s.x0_vision, s.x0_action, 300.0 + 100 * i)
             for i, s in enumerate(samples)]
    per_item, layout = pack_transformer_inputs(items)
    merged = {**per_item, **merge_items(items),
              "vision_tokens": [torch.cat([s.x0_vision for s in samples], dim=2)],
              "action_tokens": [torch.cat([s.x0_action for s in samples])]}
    assert merged["vision_token_shapes"] == [(5 + 3 + 5, 6, 10)]
    assert merged["vision_noisy_frame_indexes"][0].tolist() == [1, 2, 3, 4, 6, 7, 9, 10, 11, 12]
    with torch.no_grad(), policy.attention.packed(layout):
        vision, _, action = policy.transformer(**per_item, return_dict=False)
        (vision_m,), _, (action_m,) = policy.transformer(**merged, return_dict=False)
    assert len(vision) == 3 and vision_m.shape[2] == 13
    assert torch.allclose(torch.cat(vision, dim=2), vision_m, atol=1e-6)
    assert torch.allclose(torch.cat(action), action_m, atol=1e-6)
    assert float(vision_m.abs().sum()) > 0


def test_merging_refuses_samples_of_different_patch_grids(policy: Cosmos3Policy, encoded: list[EncodedSample]) -> None:
    small = encoded[1].x0_vision[..., :8, :16]
    items = [policy.transformer_inputs(encoded[0].input_ids, encoded[0].x0_vision, encoded[0].x0_action, 500.0),
             policy.transformer_inputs(encoded[1].input_ids, small, encoded[1].x0_action, 500.0)]
    with pytest.raises(ValueError, match="patch grids"):
        merge_items(items)


def test_packed_sequences_are_reused_and_the_cache_stays_small(policy: Cosmos3Policy,
                                                                encoded: list[EncodedSample]) -> None:
    """A recurring pack reuses its device tensors (and so its attention masks); new packs evict the oldest."""
    from rlinf_cosmos3.models.cosmos3.policy import PACK_CACHE_SIZE

    cpu = torch.device("cpu")
    segments = [policy._segments_for(s.input_ids, tuple(s.x0_vision.shape), s.x0_action.shape[0], cpu)
                for s in encoded]
    first = policy._packed_sequence(segments[:2])
    assert policy._packed_sequence(segments[:2]) is first
    for n in range(1, 2 * PACK_CACHE_SIZE):  # packs of different compositions
        policy._packed_sequence([segments[i % B] for i in range(n)])
    assert len(policy._packs) <= PACK_CACHE_SIZE

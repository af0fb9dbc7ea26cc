"""Several samples in one Cosmos3 transformer call: the packed sequence layout.

``Cosmos3OmniTransformer.forward`` already takes per-item lists (vision and action tokens with their
shapes, per-token timesteps, per-item domain ids) in one joint sequence that it splits at ``und_len``
into the understanding (text) and generation pathways. So a micro-batch is packed by *re-indexing*
the single-sample inputs the diffusers pipeline helpers build, never by rebuilding them:

    [ text_0 | text_1 | ... | text_{B-1} | vision_0 action_0 | vision_1 action_1 | ... ]
      <------------- und_len = sum T_i --><---------- generation tokens ------------>

Every sample keeps its own mRoPE positions (as if it were alone), so with attention kept inside each
sample (:mod:`rlinf_cosmos3.models.cosmos3.packed_attention`) the packed call computes what B
single-sample calls compute; only the matrix products see ``sum L_i`` rows instead of ``L_i``.

The model's per-item lists can keep one entry per sample (:func:`pack_transformer_inputs`) or hold the
whole pack as one vision and one action item (:func:`merge_items`, what training uses): the same
numbers, but the model's per-item Python loops then run once per pack instead of once per sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

_LIST_KEYS = (
    "vision_tokens",
    "vision_token_shapes",
    "vision_noisy_frame_indexes",
    "action_tokens",
    "action_token_shapes",
    "action_noisy_frame_indexes",
    "action_domain_ids",
)
"""Per-item lists of the transformer's arguments: concatenated item after item."""
_SHAPE_KEYS = (
    "vision_token_shapes",
    "vision_noisy_frame_indexes",
    "action_token_shapes",
    "action_noisy_frame_indexes",
    "action_domain_ids",
)
"""The per-item lists that describe items rather than hold their tokens."""
_TIMESTEP_KEYS = ("vision_timesteps", "action_timesteps")
"""Per-token timesteps, in item order: concatenated."""
_GEN_INDEX_KEYS = (
    "vision_sequence_indexes",
    "vision_mse_loss_indexes",
    "action_sequence_indexes",
    "action_mse_loss_indexes",
)
"""Positions in the joint sequence of generation tokens: shifted into their sample's generation block."""


@dataclass(frozen=True)
class DocumentLayout:
    """Which tokens of a packed sequence belong to which sample ("document").

    ``text_lengths[i]`` understanding tokens of sample i lie in the text block, in sample order;
    ``gen_lengths[i]`` generation tokens in the generation block, in the same order.
    """

    text_lengths: tuple[int, ...]
    gen_lengths: tuple[int, ...]
    _doc_ids: dict = field(default_factory=dict, compare=False, repr=False, hash=False)
    block_masks: dict = field(default_factory=dict, compare=False, repr=False, hash=False)
    """Attention masks built for this layout, kept with it (the packed processor's cache): a layout that
    recurs (the same prompts and shapes every step) reuses them."""

    def __post_init__(self) -> None:
        if len(self.text_lengths) != len(self.gen_lengths) or not self.text_lengths:
            raise ValueError(f"layout needs one text and one generation length per sample, got "
                             f"{self.text_lengths} / {self.gen_lengths}")
        if min(self.text_lengths) < 1 or min(self.gen_lengths) < 1:
            raise ValueError("every packed sample needs at least one text and one generation token")

    @property
    def num_docs(self) -> int:
        return len(self.text_lengths)

    @property
    def und_len(self) -> int:
        return sum(self.text_lengths)

    @property
    def gen_len(self) -> int:
        return sum(self.gen_lengths)

    def text_spans(self) -> list[tuple[int, int]]:
        """``[start, end)`` of each sample's text inside the understanding block."""
        return _spans(self.text_lengths)

    def gen_spans(self) -> list[tuple[int, int]]:
        """``[start, end)`` of each sample's generation tokens inside the generation block."""
        return _spans(self.gen_lengths)

    def doc_ids(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(document id of each understanding token, of each generation token), int32 on ``device``."""
        key = str(device)
        if key not in self._doc_ids:
            docs = torch.arange(self.num_docs, dtype=torch.int32)
            text = torch.repeat_interleave(docs, torch.tensor(self.text_lengths))
            gen = torch.repeat_interleave(docs, torch.tensor(self.gen_lengths))
            self._doc_ids[key] = (text.to(device, non_blocking=True), gen.to(device, non_blocking=True))
        return self._doc_ids[key]


def _spans(lengths: Sequence[int]) -> list[tuple[int, int]]:
    spans, start = [], 0
    for length in lengths:
        spans.append((start, start + length))
        start += length
    return spans


def _shifted_cat(parts: Sequence[torch.Tensor], shifts: Sequence[int]) -> torch.Tensor:
    """``cat(parts[i] + shifts[i])`` in three operations whatever the number of parts."""
    joined = torch.cat(list(parts))
    counts = torch.tensor([part.numel() for part in parts])
    return joined + torch.repeat_interleave(torch.tensor(list(shifts), dtype=joined.dtype), counts)


POSITION_HALVES = "position_halves"
"""Optional item key: ``(text, generation)`` halves of the item's ``position_ids``, split once by whoever keeps
the item (the policy's segment cache), so packing does not slice every sample's positions again."""


def position_halves(item: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """An item's mRoPE positions split at its ``und_len`` (from :data:`POSITION_HALVES` when it holds them)."""
    if POSITION_HALVES in item:
        return item[POSITION_HALVES]
    length = int(item["und_len"])
    return item["position_ids"][:, :length], item["position_ids"][:, length:]


def pack_layout(items: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], DocumentLayout]:
    """The sequence part of a packed call: text ids, mRoPE positions and every index, re-indexed; and the
    document layout. ``items`` need only the single-sample sequence keys (tokens, timesteps and the
    per-item lists are left to the caller: :func:`pack_transformer_inputs`, :func:`merge_items`).

    A constant number of tensor operations whatever the number of items (cats and one shift each), so a
    micro-batch whose composition is new every step (several tasks, caption dropout) packs cheaply."""
    if not items:
        raise ValueError("nothing to pack")
    if len(items) == 1:
        only = items[0]
        keys = ("input_ids", "text_indexes", "position_ids", "und_len", "sequence_length", *_GEN_INDEX_KEYS)
        return ({key: only[key] for key in keys},
                DocumentLayout((only["und_len"],), (only["sequence_length"] - only["und_len"],)))
    text_lengths = tuple(int(item["und_len"]) for item in items)
    gen_lengths = tuple(int(item["sequence_length"]) - t for item, t in zip(items, text_lengths, strict=True))
    layout = DocumentLayout(text_lengths, gen_lengths)
    und_len = layout.und_len
    text_starts = [start for start, _ in layout.text_spans()]
    # sample position p >= its text length -> und_len + (start of its generation block) + (p - text length)
    gen_shifts = [und_len + start - length for (start, _), length in zip(layout.gen_spans(), text_lengths,
                                                                          strict=True)]
    halves = [position_halves(item) for item in items]
    packed: dict[str, Any] = {
        "und_len": und_len,
        "sequence_length": und_len + layout.gen_len,
        "input_ids": torch.cat([item["input_ids"] for item in items]),
        "text_indexes": _shifted_cat([item["text_indexes"] for item in items], text_starts),
        "position_ids": torch.cat([text for text, _ in halves] + [gen for _, gen in halves], dim=1),
    }
    for key in _GEN_INDEX_KEYS:
        packed[key] = _shifted_cat([item[key] for item in items], gen_shifts)
    return packed, layout


def pack_transformer_inputs(items: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], DocumentLayout]:
    """Merge single-sample transformer keyword arguments into one packed call and its layout.

    Each item is what :meth:`Cosmos3Policy.transformer_inputs` returns for one sample (text first,
    then that sample's vision and action tokens). The packed call keeps one vision and one action item
    per sample, so its outputs are per-sample lists in the same order: ``preds[i]`` is sample i's.
    """
    packed, layout = pack_layout(items)
    if len(items) == 1:
        return dict(items[0]), layout
    for key in _LIST_KEYS:
        packed[key] = [entry for item in items for entry in item[key]]
    for key in _TIMESTEP_KEYS:
        packed[key] = torch.cat([item[key] for item in items])
    return packed, layout


def merge_items(items: Sequence[dict[str, Any]]) -> dict[str, list]:
    """The per-item list arguments of several samples as ONE vision item and ONE action item.

    ``Cosmos3OmniTransformer.forward`` patchifies, timestep-embeds and unpatchifies every latent frame on
    its own and projects every action token on its own, so samples whose latents share ``(C, h, w)``
    can enter as one vision item whose frames are theirs concatenated along time (and their action
    tokens as one item), with each sample's noisy frame indexes shifted by the frames before it. The
    model computes the same numbers (the tokens keep their order and their sequence indexes) with a
    constant number of operations instead of a few per sample; the caller concatenates the tokens
    (``[1, C, sum T_i, h, w]``, ``[sum H_i, D]``) and splits the predictions the same way.
    """
    if len(items) == 1:
        return {key: list(items[0][key]) for key in _SHAPE_KEYS}
    if any(len(item["vision_token_shapes"]) != 1 or len(item["action_token_shapes"]) != 1 for item in items):
        raise ValueError("merge_items takes samples of one vision and one action item each")
    vision_shapes = [tuple(item["vision_token_shapes"][0]) for item in items]
    action_shapes = [tuple(item["action_token_shapes"][0]) for item in items]
    if len({shape[1:] for shape in vision_shapes}) != 1 or len({shape[1:] for shape in action_shapes}) != 1:
        raise ValueError(f"samples of different patch grids cannot share an item: {vision_shapes} / {action_shapes}")
    domains = {id(item["action_domain_ids"][0]): item["action_domain_ids"][0] for item in items}
    if len({int(d.reshape(-1)[0]) for d in domains.values()}) != 1:  # items of one segment share its tensor
        raise ValueError("samples of different embodiment domains cannot share an action item")
    frame_starts = [start for start, _ in _spans([shape[0] for shape in vision_shapes])]
    token_starts = [start for start, _ in _spans([shape[0] for shape in action_shapes])]
    frames, tokens = sum(shape[0] for shape in vision_shapes), sum(shape[0] for shape in action_shapes)
    return {
        "vision_token_shapes": [(frames, *vision_shapes[0][1:])],
        "vision_noisy_frame_indexes": [
            _shifted_cat([item["vision_noisy_frame_indexes"][0] for item in items], frame_starts)],
        "action_token_shapes": [(tokens, *action_shapes[0][1:])],
        "action_noisy_frame_indexes": [
            _shifted_cat([item["action_noisy_frame_indexes"][0] for item in items], token_starts)],
        "action_domain_ids": [items[0]["action_domain_ids"][0]],
    }


def split_into_packs(lengths: Sequence[int], max_tokens: int | None) -> list[list[int]]:
    """Consecutive groups of sample indexes whose total length stays within ``max_tokens``.

    ``None``: one sample per group (the per-sample reference path). A sample longer than the bound
    forms a group of its own (it cannot be split).
    """
    if max_tokens is None:
        return [[i] for i in range(len(lengths))]
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    packs: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i, length in enumerate(lengths):
        if current and total + length > max_tokens:
            packs.append(current)
            current, total = [], 0
        current.append(i)
        total += length
    if current:
        packs.append(current)
    return packs

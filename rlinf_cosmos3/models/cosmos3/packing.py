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
_CAT_KEYS = ("input_ids", "vision_timesteps", "action_timesteps")
"""Per-token tensors whose order follows the item order: concatenated."""
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
            self._doc_ids[key] = (text.to(device), gen.to(device))
        return self._doc_ids[key]


def _spans(lengths: Sequence[int]) -> list[tuple[int, int]]:
    spans, start = [], 0
    for length in lengths:
        spans.append((start, start + length))
        start += length
    return spans


def pack_transformer_inputs(items: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], DocumentLayout]:
    """Merge single-sample transformer keyword arguments into one packed call and its layout.

    Each item is what :meth:`Cosmos3Policy.transformer_inputs` returns for one sample (text first,
    then that sample's vision and action tokens). The packed call's outputs are the per-item lists in
    the same order, so ``preds[i]`` is sample i's prediction.
    """
    if not items:
        raise ValueError("nothing to pack")
    if len(items) == 1:
        only = items[0]
        return dict(only), DocumentLayout((only["und_len"],), (only["sequence_length"] - only["und_len"],))
    text_lengths = tuple(int(item["und_len"]) for item in items)
    gen_lengths = tuple(int(item["sequence_length"]) - t for item, t in zip(items, text_lengths, strict=True))
    layout = DocumentLayout(text_lengths, gen_lengths)
    und_len = layout.und_len
    packed: dict[str, Any] = {
        "und_len": und_len,
        "sequence_length": und_len + layout.gen_len,
    }
    for key in _LIST_KEYS:
        packed[key] = [entry for item in items for entry in item[key]]
    for key in _CAT_KEYS:
        packed[key] = torch.cat([item[key] for item in items])

    text_indexes, positions_text, positions_gen = [], [], []
    gen_indexes: dict[str, list[torch.Tensor]] = {key: [] for key in _GEN_INDEX_KEYS}
    for item, (t0, _), (g0, _), length in zip(items, layout.text_spans(), layout.gen_spans(), text_lengths,
                                              strict=True):
        text_indexes.append(item["text_indexes"] + t0)
        positions_text.append(item["position_ids"][:, :length])
        positions_gen.append(item["position_ids"][:, length:])
        shift = und_len + g0 - length  # sample position p >= length -> und_len + g0 + (p - length)
        for key in _GEN_INDEX_KEYS:
            gen_indexes[key].append(item[key] + shift)
    packed["text_indexes"] = torch.cat(text_indexes)
    packed["position_ids"] = torch.cat(positions_text + positions_gen, dim=1)
    for key, parts in gen_indexes.items():
        packed[key] = torch.cat(parts)
    return packed, layout


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

"""FlexAttention block masks of a packed layout, built from its document spans in block space.

``create_block_mask`` evaluates the mask function on every (query, key) token pair and sums it per block:
for a pack of 256 small-preset samples (108,544 tokens) that is a 65 GiB temporary, so one large pack could
not train. Packed documents are contiguous runs of tokens, so which blocks a query block meets (some pair
allowed) and which it meets fully (every pair allowed) follow from how many tokens of each document each
block holds: ``O(tokens + blocks x documents + blocks^2)`` work and memory. The result is the same
``BlockMask`` that ``create_block_mask`` returns (tested against it), carrying the same token-level
``mask_mod`` for the partial blocks.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn.attention.flex_attention import BlockMask

BLOCK_SIZE = 128
"""FlexAttention's default sparse block size (``create_block_mask``'s)."""

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _doc_counts(doc: torch.Tensor, num_docs: int, block: int) -> torch.Tensor:
    """``[blocks, docs]``: how many tokens of each document each block holds (a count of ``block`` means the
    block is that document's alone; the last, shorter block never is)."""
    blocks = -(-doc.numel() // block)
    index = torch.arange(doc.numel(), device=doc.device) // block * num_docs + doc.long()
    counts = torch.zeros(blocks * num_docs, device=doc.device, dtype=torch.int32)
    counts.index_add_(0, index, torch.ones_like(index, dtype=torch.int32))
    return counts.view(blocks, num_docs)


def _ordered(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-row count, column indices with the set ones first in ascending order), ``[1, 1, ...]`` int32."""
    num = dense.sum(dim=-1, dtype=torch.int32)
    indices = torch.argsort(dense.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return num[None, None], indices[None, None]


def document_block_mask(
    q_doc: torch.Tensor,
    kv_doc: torch.Tensor,
    num_docs: int,
    mask_mod: MaskMod,
    *,
    causal: bool = False,
    block: int = BLOCK_SIZE,
) -> BlockMask:
    """The block mask of "query attends to keys of its own document" (and ``kv <= q`` when ``causal``).

    ``q_doc`` / ``kv_doc``: the document id of each query / key token (each document's tokens contiguous
    within each side; the key side may hold several such runs, e.g. text then generation). ``causal``
    needs queries and keys in one index space (``q_doc is kv_doc`` in practice). ``mask_mod`` is the
    token-level rule, applied inside the partial blocks.
    """
    q_counts = _doc_counts(q_doc, num_docs, block)
    kv_counts = _doc_counts(kv_doc, num_docs, block)
    shared = (q_counts > 0).float() @ (kv_counts > 0).float().T > 0  # some pair of one document
    full = (q_counts == block).float() @ (kv_counts == block).float().T > 0  # both blocks one document's alone
    if causal:
        rows = torch.arange(shared.shape[0], device=shared.device)[:, None]
        cols = torch.arange(shared.shape[1], device=shared.device)[None, :]
        shared &= cols <= rows
        full &= cols < rows
    partial = shared & ~full
    kv_num, kv_indices = _ordered(partial)
    full_num, full_indices = _ordered(full)
    return BlockMask.from_kv_blocks(kv_num, kv_indices, full_num, full_indices, BLOCK_SIZE=block,
                                    mask_mod=mask_mod, seq_lengths=(q_doc.numel(), kv_doc.numel()))

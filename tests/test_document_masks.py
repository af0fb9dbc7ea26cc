"""The packed layout's FlexAttention block masks, built from document spans, against create_block_mask."""

from __future__ import annotations

import random

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from rlinf_cosmos3.models.cosmos3.document_masks import document_block_mask
from rlinf_cosmos3.models.cosmos3.packed_attention import PackedDocumentAttnProcessor
from rlinf_cosmos3.models.cosmos3.packing import DocumentLayout

_FIELDS = ("kv_num_blocks", "full_kv_num_blocks", "q_num_blocks", "full_q_num_blocks")


def _assert_same(reference, built) -> None:
    for name in _FIELDS:
        assert torch.equal(getattr(reference, name), getattr(built, name)), name
    assert torch.equal(reference.to_dense(), built.to_dense())
    assert reference.seq_lengths == built.seq_lengths


@pytest.mark.parametrize("seed", range(12))
def test_masks_equal_create_block_mask(seed: int) -> None:
    """Random layouts (documents shorter and longer than a block, lengths off the block grid): the text
    pathway's causal mask and the generation pathway's mask over [text; generation] keys match the reference
    block for block, full and partial."""
    rng = random.Random(seed)
    docs = rng.randint(2, 9)
    layout = DocumentLayout(tuple(rng.randint(1, 300) for _ in range(docs)),
                            tuple(rng.randint(1, 400) for _ in range(docs)))
    text_doc, gen_doc = layout.doc_ids(torch.device("cpu"))
    kv_doc = torch.cat([text_doc, gen_doc])

    def causal(b, h, q, kv):
        return (text_doc[q] == text_doc[kv]) & (q >= kv)

    def within(b, h, q, kv):
        return gen_doc[q] == kv_doc[kv]

    _assert_same(create_block_mask(causal, None, None, layout.und_len, layout.und_len, device="cpu"),
                 document_block_mask(text_doc, text_doc, docs, causal, causal=True))
    _assert_same(create_block_mask(within, None, None, layout.gen_len, layout.und_len + layout.gen_len, device="cpu"),
                 document_block_mask(gen_doc, kv_doc, docs, within))


def test_a_pack_of_256_small_samples_gets_its_masks() -> None:
    """The pack that made create_block_mask ask for 65 GiB (256 samples of 108 text + 316 generation tokens):
    block-sparse masks, each query block meeting only the key blocks of its own documents."""
    layout = DocumentLayout((108,) * 256, (316,) * 256)
    processor = PackedDocumentAttnProcessor("flex")
    with processor.packed(layout):
        text_mask, gen_mask = processor._block_masks(torch.device("cpu"))
    assert text_mask.seq_lengths == (layout.und_len, layout.und_len)
    assert gen_mask.seq_lengths == (layout.gen_len, layout.und_len + layout.gen_len)
    met = gen_mask.kv_num_blocks + gen_mask.full_kv_num_blocks
    # a 128-token query block spans at most 2 documents: their 216 text tokens lie in <= 3 key blocks and
    # their 632 generation tokens in <= 6, never the 848 key blocks of the whole pack
    assert int(met.max()) <= 9
    assert int(gen_mask.full_kv_num_blocks.sum()) > 0

"""Cosmos3 attention that keeps packed samples apart (a diffusers attention processor).

The stock ``Cosmos3AttnProcessor`` runs one causal attention over all understanding (text) tokens and
one full attention of all generation tokens over everything: right for one sample, wrong for several
packed into one sequence (:mod:`rlinf_cosmos3.models.cosmos3.packing`). This processor, installed
through diffusers' public ``set_attn_processor``, applies the same projections, norms and rotary
embeddings through the attention module's own layers, then masks by document:

* text tokens of sample i attend causally to sample i's text only;
* generation tokens of sample i attend to sample i's text and generation tokens only.

Backends: ``flex`` (PyTorch FlexAttention with a document ``BlockMask`` built once per layout from its spans,
kept with it and shared by all layers; GPU), ``loop`` (one SDPA call per sample and pathway, the stock processor's own
call on each slice; exact, any device). ``auto`` picks ``flex`` on CUDA and ``loop`` elsewhere. With no
layout set (inference, or a single sample), the stock processor runs unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_cosmos3 import Cosmos3AttnProcessor
from torch import nn

from rlinf_cosmos3.config.objective import ATTENTION_BACKENDS
from rlinf_cosmos3.models.cosmos3.document_masks import document_block_mask
from rlinf_cosmos3.models.cosmos3.packing import DocumentLayout

_compiled_flex: Any = None


def _flex_attention() -> Any:
    """FlexAttention compiled once per process (eager flex materialises the whole score matrix)."""
    global _compiled_flex
    if _compiled_flex is None:
        from torch.nn.attention.flex_attention import flex_attention

        _compiled_flex = torch.compile(flex_attention, dynamic=True)
    return _compiled_flex


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(parts: tuple[torch.Tensor, ...], cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The stock processor's rotary embedding ``x cos + rotate_half(x) sin`` of several ``[tokens, heads_i, dim]``
    tensors of one pathway (same positions), joined along the heads so it runs once: the same numbers, a third
    of the operations."""
    joined = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
    rotated = joined * cos.unsqueeze(1) + _rotate_half(joined) * sin.unsqueeze(1)
    return rotated.split([part.shape[1] for part in parts], dim=1)


def project(
    attn: nn.Module, und_seq: torch.Tensor, gen_seq: torch.Tensor, rotary_emb: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, ...]:
    """Per-pathway q/k/v ``[tokens, heads, head_dim]`` with norms and rotary applied, as the stock processor.

    Returns ``(q_und, k_und, v_und, k_und_for_gen, q_gen, k_gen, v_gen)``. Without a separate key norm for the
    generation pathway, ``k_und_for_gen`` is ``k_und`` itself (the stock processor rotates the same values twice).
    """
    heads, kv_heads, dim = attn.num_attention_heads, attn.num_key_value_heads, attn.head_dim
    q_und = attn.norm_q(attn.to_q(und_seq).view(-1, heads, dim))
    k_und = attn.norm_k(attn.to_k(und_seq).view(-1, kv_heads, dim))
    v_und = attn.to_v(und_seq).view(-1, kv_heads, dim)
    q_gen = attn.norm_added_q(attn.add_q_proj(gen_seq).view(-1, heads, dim))
    k_gen = attn.norm_added_k(attn.add_k_proj(gen_seq).view(-1, kv_heads, dim))
    v_gen = attn.add_v_proj(gen_seq).view(-1, kv_heads, dim)
    cos_und, sin_und, cos_gen, sin_gen = rotary_emb
    if attn.k_norm_und_for_gen is None:
        q_und, k_und = _rope((q_und, k_und), cos_und, sin_und)
        k_und_for_gen = k_und
    else:
        q_und, k_und, k_und_for_gen = _rope((q_und, k_und, attn.k_norm_und_for_gen(k_und)), cos_und, sin_und)
    q_gen, k_gen = _rope((q_gen, k_gen), cos_gen, sin_gen)
    return q_und, k_und, v_und, k_und_for_gen, q_gen, k_gen, v_gen


class PackedDocumentAttnProcessor:
    """Document-masked Cosmos3 attention for packed sequences; the stock processor when nothing is packed."""

    def __init__(self, backend: str = "auto") -> None:
        if backend not in ATTENTION_BACKENDS:
            raise ValueError(f"unknown packed attention backend {backend!r}; choose one of {ATTENTION_BACKENDS}")
        self.backend = backend
        self.layout: DocumentLayout | None = None
        self._stock = Cosmos3AttnProcessor()
        self._masks: dict[tuple[str, int], Any] = {}

    def resolved_backend(self, device: torch.device) -> str:
        if self.backend == "auto":
            return "flex" if device.type == "cuda" else "loop"
        return self.backend

    @contextmanager
    def packed(self, layout: DocumentLayout) -> Iterator[None]:
        """Within the block, every call attends within the documents of ``layout``."""
        if self.layout is not None:
            raise RuntimeError("a packed layout is already active on this processor")
        self.layout, self._masks = layout, layout.block_masks
        try:
            yield
        finally:
            self.layout, self._masks = None, {}

    def __call__(
        self,
        attn: nn.Module,
        und_seq: torch.Tensor,
        gen_seq: torch.Tensor,
        rotary_emb: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        layout = self.layout
        if layout is None or layout.num_docs == 1:
            return self._stock(attn, und_seq, gen_seq, rotary_emb)
        if (und_seq.shape[0], gen_seq.shape[0]) != (layout.und_len, layout.gen_len):
            raise ValueError(
                f"packed layout covers {layout.und_len} text + {layout.gen_len} generation tokens, "
                f"the layer got {und_seq.shape[0]} + {gen_seq.shape[0]}"
            )
        return _packed_attention(self, attn, und_seq, gen_seq, rotary_emb)

    # -------------------------------------------------------------------------------- backends

    def _loop(self, q_und, k_und, v_und, k_und_for_gen, q_gen, k_gen, v_gen) -> tuple[torch.Tensor, torch.Tensor]:
        layout = self.layout
        assert layout is not None
        causal, full = [], []
        for (t0, t1), (g0, g1) in zip(layout.text_spans(), layout.gen_spans(), strict=True):
            causal.append(_sdpa(q_und[t0:t1], k_und[t0:t1], v_und[t0:t1], is_causal=True))
            keys = torch.cat([k_und_for_gen[t0:t1], k_gen[g0:g1]])
            values = torch.cat([v_und[t0:t1], v_gen[g0:g1]])
            full.append(_sdpa(q_gen[g0:g1], keys, values, is_causal=False))
        return torch.cat(causal), torch.cat(full)

    def _flex(self, q_und, k_und, v_und, k_und_for_gen, q_gen, k_gen, v_gen) -> tuple[torch.Tensor, torch.Tensor]:
        und_mask, gen_mask = self._block_masks(q_und.device)
        flex = _flex_attention()

        def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any) -> torch.Tensor:
            out = flex(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                       block_mask=mask, enable_gqa=True)
            return out[0].transpose(0, 1)

        causal = run(q_und, k_und, v_und, und_mask)
        full = run(q_gen, torch.cat([k_und_for_gen, k_gen]), torch.cat([v_und, v_gen]), gen_mask)
        return causal, full

    def _block_masks(self, device: torch.device) -> tuple[Any, Any]:
        """The two document masks of the active layout, built on first use and shared by all layers."""
        key = (str(device), id(self.layout))  # the layout's own cache: its masks outlive one call
        if key not in self._masks:
            layout = self.layout
            assert layout is not None
            text_doc, gen_doc = layout.doc_ids(device)
            kv_doc = torch.cat([text_doc, gen_doc])

            def causal_within_doc(b, h, q, kv):
                return (text_doc[q] == text_doc[kv]) & (q >= kv)

            def within_doc(b, h, q, kv):
                return gen_doc[q] == kv_doc[kv]

            self._masks[key] = (
                document_block_mask(text_doc, text_doc, layout.num_docs, causal_within_doc, causal=True),
                document_block_mask(gen_doc, kv_doc, layout.num_docs, within_doc),
            )
        return self._masks[key]


@torch.compiler.disable
def _packed_attention(
    proc: PackedDocumentAttnProcessor,
    attn: nn.Module,
    und_seq: torch.Tensor,
    gen_seq: torch.Tensor,
    rotary_emb: tuple[torch.Tensor, ...],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kept out of compiled decoder blocks: the layout changes every call (it would recompile each step)."""
    qkv = project(attn, und_seq, gen_seq, rotary_emb)
    backend = proc.resolved_backend(und_seq.device)
    causal, full = proc._flex(*qkv) if backend == "flex" else proc._loop(*qkv)
    return attn.to_out(causal.flatten(-2, -1)), attn.to_add_out(full.flatten(-2, -1))


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool) -> torch.Tensor:
    """The stock processor's attention call on one sample's slice (``[tokens, heads, dim]``)."""
    return dispatch_attention_fn(q[None], k[None], v[None], is_causal=is_causal, enable_gqa=True)[0]


def install_packed_attention(transformer: nn.Module, backend: str = "auto") -> PackedDocumentAttnProcessor:
    """Put one shared :class:`PackedDocumentAttnProcessor` on every attention module (public diffusers API)."""
    processor = PackedDocumentAttnProcessor(backend)
    transformer.set_attn_processor(processor)
    return processor


def checkpoint_in_packed_layout(function: Callable[..., Any], *args: Any) -> Any:
    """A diffusers ``gradient_checkpointing_func``: non-reentrant ``torch.utils.checkpoint`` (diffusers'
    default) whose recomputation in backward runs under the packed layout (and block masks) its forward saw.

    :meth:`PackedDocumentAttnProcessor.packed` holds the layout only while the forward runs; without this a
    checkpointed layer would recompute with the stock, unmasked attention in backward (a different
    computation: ``CheckpointError``, or wrong gradients).
    """
    owner = getattr(function, "__self__", function)
    modules = owner.modules() if isinstance(owner, nn.Module) else ()
    processors = {id(p): p for m in modules if isinstance(p := getattr(m, "processor", None),
                                                           PackedDocumentAttnProcessor) and p.layout is not None}
    states = [(p, p.layout, p._masks) for p in processors.values()]
    return torch.utils.checkpoint.checkpoint(
        function, *args, use_reentrant=False, context_fn=lambda: (nullcontext(), _reentered(states))
    )


@contextmanager
def _reentered(states: list[tuple[PackedDocumentAttnProcessor, DocumentLayout, dict]]) -> Iterator[None]:
    saved = [(p, p.layout, p._masks) for p, _, _ in states]
    for processor, layout, masks in states:
        processor.layout, processor._masks = layout, masks
    try:
        yield
    finally:
        for processor, layout, masks in saved:
            processor.layout, processor._masks = layout, masks


def packed_processor_of(transformer: nn.Module) -> PackedDocumentAttnProcessor | None:
    """The installed packed processor, if every attention module uses the same one."""
    processors = {id(p): p for p in transformer.attn_processors.values()}
    if len(processors) == 1:
        (processor,) = processors.values()
        if isinstance(processor, PackedDocumentAttnProcessor):
            return processor
    return None

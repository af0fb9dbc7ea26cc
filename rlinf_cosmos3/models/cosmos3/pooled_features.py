"""One feature vector per sample from the transformer call that predicts its velocity: the mean of the final
(normalised) generation hidden states over the sample's condition-frame tokens.

Why these tokens (PPO's value head reads this vector, docs/rl.md "PPO with the value head"): the condition frame
is the observation's own latent, and in the generation pathway its tokens attend to the sample's text (the
instruction) and to its other generation tokens, so their final states see both the observation and the task.
Text tokens would not do: the understanding pathway is causal and never attends to the generation tokens, so a
text feature cannot tell two observations of one task apart.

The states are read with a forward hook on the transformer's last generation norm (``norm_moe_gen``, the input of
every generation output head), in the same call that gives the velocity, so the feature costs no transformer
pass of its own. The hook sees the pack's whole generation block ``[sum gen_len_i, hidden]``; each sample's
condition tokens are the first ``h * w`` of its vision tokens (diffusers patchifies time-major).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

__all__ = ["capture_generation_states", "condition_token_offsets", "pool_condition_tokens"]


@contextmanager
def capture_generation_states(transformer: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Within the block, every call of ``transformer`` appends its final generation states ``[gen_len, hidden]``
    (the output of ``norm_moe_gen``) to the yielded list."""
    norm = getattr(transformer, "norm_moe_gen", None)
    if norm is None:
        raise RuntimeError(f"{type(transformer).__name__} has no 'norm_moe_gen': not a Cosmos3 omni transformer")
    captured: list[torch.Tensor] = []
    handle = norm.register_forward_hook(lambda _module, _inputs, output: captured.append(output))
    try:
        yield captured
    finally:
        handle.remove()


def condition_token_offsets(segment: dict[str, Any]) -> torch.Tensor:
    """Positions of one sample's condition-frame (frame 0) tokens inside its own generation block, from its
    single-sample segment (``vision_sequence_indexes``, ``vision_token_shapes``, ``und_len``)."""
    (frames, height, width), = [tuple(s) for s in segment["vision_token_shapes"]]
    if frames < 1:
        raise ValueError("the sample has no vision frame to pool")
    per_frame = int(height) * int(width)
    return segment["vision_sequence_indexes"][:per_frame].long().cpu() - int(segment["und_len"])


def pool_condition_tokens(states: torch.Tensor, gen_starts: Sequence[int],
                          offsets: Sequence[torch.Tensor]) -> torch.Tensor:
    """``[len(gen_starts), hidden]`` float32: for each sample of a pack, the mean of ``states`` (the pack's
    generation block) over its condition tokens (``gen_starts[i] + offsets[i]``)."""
    rows = [(start + off).to(states.device) for start, off in zip(gen_starts, offsets, strict=True)]
    return torch.stack([states.index_select(0, r).float().mean(dim=0) for r in rows])

"""PPO's critic on the actor rank: the value head, its own AdamW, and its state inside the RL checkpoint.

Why apart from the transformer: the value head is not part of the model that is served. It lives beside the FSDP
transformer as a small plain module (fp32, never sharded), so the checkpoint's model state, its consolidated
weights and therefore the converted diffusers directory are exactly what they are for GRPO. Its input is the
pooled feature of the policy's own forward, detached (:class:`~rlinf_cosmos3.rl.value_head.ValueHead`), so the
value loss trains the head only and the two optimizers never share a parameter: one backward of
``policy loss + value loss`` gives each its own gradient.

Its initial weights come from a generator of their own (the run's seed), so they do not depend on what else drew
from torch's global RNG, and a resumed run loads them with the AdamW state from the checkpoint
(``validation.rl.VALUE_HEAD_FILE``). That file is text (:meth:`Critic.to_text`: base64 of ``torch.save``, exact)
because the checkpoint's atomic save writes extra files as text at the step directory's root
(``save_checkpoint(extra_files=...)``): it is published or removed with the rest of the step, and the converter
never reads it.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import Any

import torch

from rlinf_cosmos3.components.optim import build_optimizer, clip_grad_norm_
from rlinf_cosmos3.rl.value_head import ValueHead

__all__ = ["Critic", "state_from_text"]


class Critic:
    """``[B, input_dim]`` pooled features -> ``[B]`` values, trained with its own AdamW (``actor.value_lr``)."""

    def __init__(self, input_dim: int, hidden_sizes: Sequence[int], *, lr: float, weight_decay: float,
                 clip_grad: float, device: torch.device | str, seed: int) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            head = ValueHead(int(input_dim), list(hidden_sizes))  # detached input: the value loss trains only this
        self.head = head.to(device)
        self.optimizer = build_optimizer(self.head, lr, weight_decay)
        self.clip_grad = clip_grad

    def values(self, features: torch.Tensor) -> torch.Tensor:
        """``[B]`` float32 values of pooled features (differentiable in the head's weights only)."""
        return self.head(features.to(next(self.head.parameters()).device))

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def step(self) -> torch.Tensor:
        """Clip the head's gradient (its own global norm, ``actor.clip_grad``) and take the AdamW step; returns the
        pre-clip norm."""
        norm = clip_grad_norm_(self.head, self.clip_grad)
        self.optimizer.step()
        return norm

    def state_dict(self) -> dict[str, Any]:
        return {"head": self.head.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])

    def to_text(self) -> str:
        """The state as the checkpoint's text file holds it (exact: ``torch.save`` bytes, base64)."""
        buffer = io.BytesIO()
        torch.save(self.state_dict(), buffer)
        return base64.b64encode(buffer.getvalue()).decode("ascii")

    def load_text(self, text: str) -> None:
        """Restore the head and its AdamW state from :meth:`to_text`'s output."""
        self.load_state_dict(state_from_text(text, map_location=next(self.head.parameters()).device))


def state_from_text(text: str, map_location: torch.device | str | None = None) -> dict[str, Any]:
    """The critic's state (``{"head": ..., "optimizer": ...}``) from the checkpoint's text file, without a critic to
    load it into: what :meth:`Critic.load_text` restores, for tools and tests that compare checkpoints."""
    data = base64.b64decode(text, validate=True)
    return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)

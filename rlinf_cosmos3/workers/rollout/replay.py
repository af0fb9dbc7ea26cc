"""The ``replay`` backend: a recorded dataset's actions instead of a model -- a conventions self-check.

Every observation is answered with the 16 recorded actions from its step on, of the demonstration
recorded for its (task, init state) (:mod:`rlinf_cosmos3.data.recorded_episodes` chooses it), encoded
exactly as the SFT data path encodes its targets (:func:`~rlinf_cosmos3.actions.encode_model_actions`:
7-D -> rot6d 10-D, normalised with the stats file): what a perfectly trained model would output. Everything
after the backend is the real eval path -- canvas composition, de-normalisation with
``rollout.model``'s stats and method, rot6d decode, gripper rule, chunking, env order, settle steps,
stop on success -- so a demonstration recorded in the same simulator must reproduce its success.
If it does not, a convention is wrong, and no GPU hour is spent finding out with a model.

Which episode and step an observation belongs to: the images cannot say, and a backend only sees
payloads, so the adapter adds each row's ``task_ids``, ``init_state_ids`` and ``steps`` (the env
worker's per-env policy step count, settle steps excluded) under the payload's ``"episode"`` key,
for backends that set ``needs_episode_context`` only -- SGLang's payload is unchanged. Taking the
step from the env (rather than counting requests per slot here) stays right when a chunk is cut at
the cap, an episode is re-run after a simulator crash, or a slot moves on to its next episode.

Under an instruction swap (``env.eval.init_states_from_task``) an episode of task B started from task A's
init state plays the demonstration recorded from that start, A's: the scene is A's, the instruction and
the goal judged are B's, so a replay shows whether A's motions satisfy B's goal (they should not).

Past the recorded end an observation gets the last recorded action repeated -- the padding the SFT
data path trains on (lerobot clamps its windows to the last frame). The recorder's last action is
its retreat after the release, so the arm keeps drifting up slowly with the gripper open; a
successful episode has ended by then (``stop_on_success``) or keeps its success.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlinf_cosmos3.config.replay import ReplayConfig
from rlinf_cosmos3.config.rollout import RolloutModelConfig
from rlinf_cosmos3.workers.rollout.backend import RolloutBackend
from rlinf_cosmos3.workers.rollout.protocol import EPISODE_CONTEXT, payload_images


class ReplayBackend(RolloutBackend):
    """See the module docstring; no Ray actor, no GPU: the recorded actions are read once in ``start``."""

    needs_episode_context = True
    groups_by_prompt_length = False  # no tokenizer and no model: any rows may share a request

    def __init__(self, model_cfg: RolloutModelConfig, cfg: ReplayConfig) -> None:
        self.model_cfg = model_cfg
        self.cfg = cfg
        self.stats_path = cfg.stats_path or model_cfg.action_stats_path
        self._encoded: dict[tuple[int, int], np.ndarray] | None = None

    @property
    def max_batch_size(self) -> int:
        return self.cfg.batching_max_size

    def start(self) -> None:
        """Read every recorded episode's actions (parquet only, no video) and encode them once."""
        from rlinf_cosmos3.actions import ActionNormalizer, encode_model_actions, read_lerobot_episode_actions
        from rlinf_cosmos3.data.recorded_episodes import choose_episodes, read_recorded_episodes

        if self._encoded is not None:
            raise RuntimeError("ReplayBackend is already started")
        recorded = read_recorded_episodes(self.cfg.dataset_root)
        chosen, _ = choose_episodes(recorded, sorted({(e.task_id, e.init_state_id) for e in recorded}))
        actions = read_lerobot_episode_actions(self.cfg.dataset_root)
        by_index = dict(zip(actions.episode_indices, actions.episodes, strict=True))
        normalizer = ActionNormalizer(self.stats_path, self.model_cfg.action_normalization)
        self._encoded = {pair: encode_model_actions(by_index[e.episode_index], normalizer)[0]
                         for pair, e in chosen.items() if len(by_index.get(e.episode_index, ())) > 0}

    def close(self) -> None:
        self._encoded = None

    def chunk(self, task_id: int, init_state_id: int, step: int, horizon: int) -> np.ndarray:
        """Normalised ``[horizon, 10]`` recorded actions ``step .. step+horizon-1``, the last one repeated
        past the episode's end."""
        if self._encoded is None:
            raise RuntimeError("ReplayBackend is not started")
        encoded = self._encoded.get((task_id, init_state_id))
        if encoded is None:
            raise KeyError(f"{self.cfg.dataset_root} has no recorded episode for task {task_id}, "
                           f"init state {init_state_id}")
        if step < 0:
            raise ValueError(f"negative episode step {step}")
        rows = np.minimum(np.arange(step, step + horizon), len(encoded) - 1)
        return encoded[rows]

    async def generate(self, payloads: Sequence[Mapping[str, Any]]) -> list[np.ndarray]:
        return [self._answer(p) for p in payloads]

    def _answer(self, payload: Mapping[str, Any]) -> np.ndarray:
        context = payload.get(EPISODE_CONTEXT)
        if context is None:
            raise ValueError(f"a replay request needs the payload's '{EPISODE_CONTEXT}' context (the adapter adds "
                             "it for backends with needs_episode_context)")
        # Under an instruction swap the recording of the scene's start is played (the source task's).
        starts = "init_state_task_ids" if "init_state_task_ids" in context else "task_ids"
        tasks, inits, steps = (list(context[k]) for k in (starts, "init_state_ids", "steps"))
        batch = len(payload_images(payload))
        if not (len(tasks) == len(inits) == len(steps) == batch):
            raise ValueError(f"episode context of {len(tasks)}/{len(inits)}/{len(steps)} rows for {batch} images")
        horizon = int(payload["parameters"]["action_horizon"])
        return np.stack([self.chunk(int(t), int(i), int(s), horizon)
                         for t, i, s in zip(tasks, inits, steps, strict=True)]).astype(np.float32)

"""Env observations -> batched policy requests -> ``[N, 16, 7]`` LIBERO commands, in env order.

Shared by both backends; only the transport differs. Per chunk step of one pipeline stage:

1. :meth:`Cosmos3ActionAdapter.request_groups` composes each env's ``[main | wrist]`` canvas and
   groups the envs by the token length of their prompt. SGLang batches text without masking the
   padding, so it refuses a batch whose prompts tokenize to different lengths; groups are then
   split at ``batching_max_size``. Each group remembers its env indexes.
2. :meth:`build_request` turns a group into the action payload (:mod:`.protocol`); for a backend
   with ``needs_episode_context`` (``replay``) it adds the rows' task, init state and policy step.
3. A backend returns the model's normalised ``[B, 16, >=10]`` output per request.
4. :meth:`parse_response` keeps the first 10 channels, de-normalises them client-side with the
   ``global_raw`` quantiles (``quantile_rot``; the server is never given the stats), decodes rot6d
   to axis-angle (``rollout.model.rot6d_decode``) and applies the gripper rule of the training
   data's convention (``gripper_convention``, ``gripper_command``) — all via :mod:`rlinf_cosmos3.actions`.
5. :meth:`restore_order` scatters the groups' results back to env order.

Observation keys (RLinf's): ``main_images`` and ``wrist_images`` uint8 ``[N, h, w, 3]``, upright
(the simulator bridge already rotated them by 180°), and ``task_descriptions`` (N strings). A
request carries each task as the caption style wants it (:func:`~rlinf_cosmos3.models.cosmos3.captions.
eval_request_text`: the task, or NVIDIA's eval description with the view and layout sentences).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlinf_cosmos3.actions import ActionNormalizer, EnvActionDecoder
from rlinf_cosmos3.models.cosmos3.captions import eval_request_text
from rlinf_cosmos3.workers.observation_keys import (
    EPISODE_STEPS,
    INIT_STATE_TASK_IDS,
    MAIN_IMAGES,
    TASK_DESCRIPTIONS,
    TASK_IDS,
    TRIAL_IDS,
    WRIST_IMAGES,
)
from rlinf_cosmos3.workers.rollout.protocol import (
    EPISODE_CONTEXT,
    SamplingSettings,
    build_payload,
    response_actions,
)

if TYPE_CHECKING:
    from rlinf_cosmos3.config.rollout import RolloutModelConfig
    from rlinf_cosmos3.workers.rollout.backend import RolloutBackend



@dataclass(frozen=True)
class RequestGroup:
    """Envs served by one request: same prompt token length, at most ``batching_max_size`` of them."""

    env_indices: np.ndarray
    """int64 ``[B]``: position of each request row in the stage's env batch."""
    prompts: tuple[str, ...]
    images: np.ndarray
    """uint8 ``[B, H, W, 3]`` composed canvases."""
    token_length: int
    """-1 when the envs were not grouped by prompt length."""
    episode: dict[str, tuple[int, ...]] | None = None
    """Per row: ``task_ids``, ``init_state_ids``, ``steps`` (policy steps so far) and
    ``init_state_task_ids``, when the observation carried them (the env worker's does)."""

    def __len__(self) -> int:
        return len(self.env_indices)


class PromptTokenLengths:
    """Token count of a task's full action prompt, as the server builds and tokenizes it; cached.

    The prompt is the structured JSON action caption (built by diffusers' own
    ``Cosmos3OmniPipeline._build_action_json_prompt``, identical to SGLang's ``build_action_prompt``
    for stripped descriptions) in a user turn of the model's chat template, without a system
    prompt. The constant tail both add (EOS, vision start) does not change which lengths are equal.
    """

    def __init__(self, tokenizer_path: str | Path, settings: SamplingSettings) -> None:
        from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline
        from transformers import AutoTokenizer

        self._caption = Cosmos3OmniPipeline._build_action_json_prompt
        self._tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path))
        self._settings = settings
        self._cache: dict[str, int] = {}

    def caption(self, task: str) -> str:
        s = self._settings
        return self._caption(task, view_point=s.view_point, num_frames=s.action_horizon + 1, fps=s.fps,
                             height=s.height, width=s.width)

    def __call__(self, task: str) -> int:
        if task not in self._cache:
            encoded = self._tokenizer.apply_chat_template(
                [{"role": "user", "content": self.caption(task)}], tokenize=True, add_generation_prompt=True,
                return_dict=True,
            )
            self._cache[task] = len(encoded["input_ids"])
        return self._cache[task]


class Cosmos3ActionAdapter:
    """Conventions between LIBERO envs and a Cosmos3 policy backend (see the module docstring)."""

    def __init__(self, model_cfg: RolloutModelConfig, batching_max_size: int, response_format: str = "raw") -> None:
        if not model_cfg.action_stats_path or model_cfg.action_stats_path == "???":
            raise ValueError("rollout.model.action_stats_path is required to de-normalise actions")
        if not model_cfg.action_normalization or model_cfg.action_normalization == "???":
            raise ValueError("rollout.model.action_normalization is required (the method used in training)")
        if batching_max_size < 1:
            raise ValueError(f"batching_max_size must be >= 1, got {batching_max_size}")
        self.model_cfg = model_cfg
        self.batching_max_size = batching_max_size
        self.response_format = response_format
        self.normalizer = ActionNormalizer(model_cfg.action_stats_path, model_cfg.action_normalization)
        self.decoder = EnvActionDecoder(self.normalizer, model_cfg.rot6d_decode, model_cfg.gripper_convention,
                                        model_cfg.gripper_command)
        self.settings = SamplingSettings.of(model_cfg)
        self._token_lengths: PromptTokenLengths | None = None

    @property
    def token_lengths(self) -> PromptTokenLengths:
        if self._token_lengths is None:  # loads transformers/diffusers only when first needed
            self._token_lengths = PromptTokenLengths(self.model_cfg.tokenizer_path, self.settings)
        return self._token_lengths

    def compose(self, main: np.ndarray, wrist: np.ndarray) -> np.ndarray:
        """``[N, h, w, 3]`` main and wrist views -> ``[N, H, W, 3]`` uint8 policy canvases."""
        from rlinf_cosmos3.models.cosmos3.observation import compose_observation

        return np.asarray(compose_observation(np.asarray(main), np.asarray(wrist), height=self.settings.height,
                                              width=self.settings.width, channels_last=True))

    def request_groups(self, obs: Mapping[str, Any], by_prompt_length: bool = True) -> list[RequestGroup]:
        """Group a stage's envs by prompt token length (or not: ``by_prompt_length=False`` needs no
        tokenizer), split at ``batching_max_size``."""
        style = self.model_cfg.caption_style
        tasks = [eval_request_text(style, str(t).strip()) for t in obs[TASK_DESCRIPTIONS]]
        main, wrist = np.asarray(obs[MAIN_IMAGES]), np.asarray(obs[WRIST_IMAGES])
        if not (len(tasks) == len(main) == len(wrist)):
            raise ValueError(f"observation batch sizes differ: {len(tasks)} tasks, {len(main)} main images, "
                             f"{len(wrist)} wrist images")
        canvases = self.compose(main, wrist)
        by_length: dict[int, list[int]] = {}
        for index, task in enumerate(tasks):
            by_length.setdefault(self.token_lengths(task) if by_prompt_length else -1, []).append(index)
        context = _episode_columns(obs, len(tasks))
        groups = []
        for length, indices in by_length.items():
            for start in range(0, len(indices), self.batching_max_size):
                chunk = np.asarray(indices[start:start + self.batching_max_size], dtype=np.int64)
                episode = None if context is None else {k: tuple(int(v[i]) for i in chunk) for k, v in context.items()}
                groups.append(RequestGroup(chunk, tuple(tasks[i] for i in chunk), canvases[chunk], length, episode))
        return groups

    def build_request(self, group: RequestGroup, with_episode: bool = False) -> dict[str, Any]:
        """The action payload for one group (every sampling parameter explicit); ``with_episode`` adds
        the group's episode context (:data:`EPISODE_CONTEXT`), for a backend that needs it."""
        payload = build_payload(group.images, group.prompts, self.settings, self.response_format)
        if with_episode:
            if group.episode is None:
                raise ValueError(f"the backend needs each observation's episode, but the observation has no "
                                 f"{TASK_IDS}/{TRIAL_IDS}/{EPISODE_STEPS} (the env worker's always has)")
            payload[EPISODE_CONTEXT] = {k: list(v) for k, v in group.episode.items()}
        return payload

    def parse_response(self, response: Mapping[str, Any] | np.ndarray, group: RequestGroup) -> np.ndarray:
        """A response (raw/envelope dict) or model output array -> ``[B, 16, 7]`` float32 LIBERO commands."""
        if isinstance(response, np.ndarray):
            actions = response
        else:
            expected = {"domain_id": self.settings.domain_id, "raw_action_dim": self.settings.raw_action_dim}
            actions = response_actions(response, len(group), expected)
        horizon, width = self.settings.action_horizon, self.settings.raw_action_dim
        if actions.ndim != 3 or actions.shape[0] != len(group) or actions.shape[1] != horizon \
                or actions.shape[2] < width:
            raise ValueError(f"expected model actions [{len(group)}, {horizon}, >={width}], got {actions.shape}")
        return self.model_to_env_actions(actions[..., :width])

    def model_to_env_actions(self, normalized: np.ndarray) -> np.ndarray:
        """Normalised ``[..., 10]`` model output -> ``[..., 7]`` float32 commands (gripper -1 open / +1 close):
        :class:`~rlinf_cosmos3.actions.decoding.EnvActionDecoder`, shared with the RL rollout sampler."""
        return self.decoder(normalized)

    @staticmethod
    def restore_order(groups: Sequence[RequestGroup], results: Sequence[np.ndarray], num_envs: int) -> np.ndarray:
        """Scatter per-group ``[B, ...]`` results back to ``[num_envs, ...]`` env order."""
        if len(groups) != len(results):
            raise ValueError(f"{len(results)} results for {len(groups)} groups")
        if not results:
            raise ValueError("no groups to restore")
        out = np.empty((num_envs, *results[0].shape[1:]), dtype=results[0].dtype)
        filled = np.zeros(num_envs, dtype=np.int64)
        for group, result in zip(groups, results, strict=True):
            if len(result) != len(group):
                raise ValueError(f"a group of {len(group)} envs got {len(result)} results")
            out[group.env_indices] = result
            np.add.at(filled, group.env_indices, 1)
        if not (filled == 1).all():
            raise ValueError(f"envs {np.flatnonzero(filled != 1).tolist()} were served {filled[filled != 1]} times")
        return out

    async def predict(self, obs: Mapping[str, Any], backend: RolloutBackend) -> np.ndarray:
        """One chunk step for a stage: observations -> ``[N, 16, 7]`` float32 commands in env order."""
        groups = self.request_groups(obs, by_prompt_length=backend.groups_by_prompt_length)
        too_big = [len(g) for g in groups if len(g) > backend.max_batch_size]
        if too_big:
            raise ValueError(f"groups of {too_big} exceed the backend's batch limit {backend.max_batch_size}")
        outputs = await backend.generate([self.build_request(g, backend.needs_episode_context) for g in groups])
        actions = [self.parse_response(out, g) for out, g in zip(outputs, groups, strict=True)]
        return self.restore_order(groups, actions, len(obs[TASK_DESCRIPTIONS]))


def _episode_columns(obs: Mapping[str, Any], n: int) -> dict[str, np.ndarray] | None:
    """The observation's per-env task id, init state id and policy step, or None if it lacks one; the
    task whose init state it started from too, when the observation names it."""
    if not all(key in obs for key in (TASK_IDS, TRIAL_IDS, EPISODE_STEPS)):
        return None
    columns = {"task_ids": np.asarray(obs[TASK_IDS]), "init_state_ids": np.asarray(obs[TRIAL_IDS]),
               "steps": np.asarray(obs[EPISODE_STEPS])}
    if INIT_STATE_TASK_IDS in obs:
        columns["init_state_task_ids"] = np.asarray(obs[INIT_STATE_TASK_IDS])
    if any(len(v) != n for v in columns.values()):
        raise ValueError(f"episode columns {[len(v) for v in columns.values()]} for {n} observations")
    return columns

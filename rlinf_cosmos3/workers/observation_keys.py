"""The keys of the observation batch an env stage hands the rollout side, declared once.

Written by :mod:`rlinf_cosmos3.workers.env.stage`, read by the action adapter
(:mod:`rlinf_cosmos3.workers.rollout.adapter`) and the eval runner, which hands ``SLOT_IDS`` back
with the actions so each chunk reaches the env that asked for it.
"""

from __future__ import annotations

SLOT_IDS = "slot_ids"
"""Global env slot of each row: the order the actions must come back in."""
MAIN_IMAGES = "main_images"
WRIST_IMAGES = "wrist_images"
STATES = "states"
TASK_DESCRIPTIONS = "task_descriptions"
TASK_IDS = "task_ids"
TRIAL_IDS = "trial_ids"
INIT_STATE_TASK_IDS = "init_state_task_ids"
"""The task whose init state each env started from: its ``TASK_IDS`` entry unless the run swaps init
states (``env.eval.init_states_from_task``); the ``replay`` backend plays the recording of that start."""
EPISODE_STEPS = "episode_steps"
"""Policy steps each env's episode has run so far (settle steps not counted): which step of a recorded
demonstration the observation corresponds to (the ``replay`` rollout backend reads it)."""
ATTEMPTS = "attempts"
"""Which run of its episode each env is on (1, or more after its simulator crashed and the episode restarted from
its start): the RL driver drops the decisions of an attempt that did not finish."""

"""The task description a policy is prompted with: LIBERO's ``task.language``.

LIBERO has two descriptions per task: ``task.language`` (derived from the BDDL file name, e.g. "pick
up the black bowl between the plate and the ramekin and place it on the plate") and the env's
``language_instruction`` (the BDDL ``:language`` field, e.g. "pick the akita black bowl ...").
Both reference evaluations (RLinf's LiberoEnv and cosmos-framework's closed_loop_eval) and LIBERO's
datasets use ``task.language``, so the env worker must too. The simulator bridge's ``make`` reply
carries ``task.name`` (the file name without ``.bddl``); ``task.language`` follows from it by
LIBERO's own rule (``libero.libero.benchmark.grab_language_from_filename``), restated here because
the main environment cannot import LIBERO. A test checks it against LIBERO for every task.

:func:`policy_instruction` is the one place where an instruction ablation (``env.eval.instruction_override``)
replaces that description: the env slot prompts with what it returns and records it in results.jsonl.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def task_language(task_name: str) -> str:
    """``task.language`` for a LIBERO ``task.name``.

    LIBERO-90/10 names start with the scene in capitals ("KITCHEN_SCENE3_turn_on_the_stove"),
    which is dropped; the other suites' names are the description with underscores.
    """
    if not task_name:
        raise ValueError("empty LIBERO task name")
    if task_name[0].isupper():
        marker = task_name.find("SCENE")
        if marker < 0:
            raise ValueError(f"LIBERO task name {task_name!r} starts with a capital but names no SCENE")
        # "SCENE<n>_" with a one- or two-digit scene number
        skip = 8 if "SCENE10" in task_name else 7
        task_name = task_name[marker + skip:]
    return " ".join(task_name.split("_"))


def prompt_from_make_reply(reply: Mapping[str, Any]) -> str:
    """The policy prompt for a task built by ``LiberoSimProcess.make``."""
    if "language" in reply:  # a bridge that reports task.language itself
        return str(reply["language"])
    return task_language(str(reply["task_name"]))


def policy_instruction(task_description: str, override: str | None) -> str:
    """What the policy is prompted with: ``override`` when set (an instruction ablation, ``""`` included),
    else the task's own description. Success stays the task's goal either way."""
    return task_description if override is None else override

"""What an episode was asked and where it started, read off a ``results.jsonl`` row (issue #31).

An instruction swap (``env.eval.init_states_from_task``) starts task B from task A's init states: the row's
``task_id`` is B (the instruction and the goal judged), ``init_state_task_id`` is A. An instruction ablation
(``env.eval.instruction_override``) prompts with another text: the row's ``instruction`` differs from its
``task_description``. Rows written before these fields existed read as neither. The eval's table and the
report toolkits label and group rows through here, so every place names a condition the same way. Pure Python.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple


class Condition(NamedTuple):
    """What identifies a row's condition: suite, instructed task, the task whose init states it started
    from, and the instruction sent when it was not the task's own (None: the task's own)."""

    suite: str
    task_id: int
    init_state_task_id: int
    ablated_instruction: str | None

    @property
    def swapped(self) -> bool:
        return self.init_state_task_id != self.task_id

    @property
    def ablated(self) -> bool:
        return self.ablated_instruction is not None

    @property
    def sort_key(self) -> tuple[str, int, int, bool, str]:
        """Orders conditions (a plain NamedTuple comparison fails on None against a string)."""
        return (self.suite, self.task_id, self.init_state_task_id, self.ablated, self.ablated_instruction or "")

    @property
    def label(self) -> str:
        """``task 8``, ``task 8 from task 1's init states``, ``task 8, instruction ''`` (with the suite when set)."""
        text = f"{self.suite} task {self.task_id}" if self.suite else f"task {self.task_id}"
        return text + condition_suffix(self.task_id, self.init_state_task_id, self.ablated_instruction)

    def to_json(self) -> list[Any]:
        """``[suite, task]`` for a plain task (what reports wrote before swaps existed), more when not plain."""
        if not (self.swapped or self.ablated):
            return [self.suite, self.task_id]
        return [self.suite, self.task_id, self.init_state_task_id, self.ablated_instruction]


def condition_suffix(task_id: int, init_state_task_id: int, ablated_instruction: str | None) -> str:
    """`` from task 1's init states`` and/or ``, instruction '...'``; "" for a plain task."""
    text = f" from task {init_state_task_id}'s init states" if init_state_task_id != task_id else ""
    return text + (f", instruction {ablated_instruction!r}" if ablated_instruction is not None else "")


def init_state_task(row: Mapping[str, Any]) -> int:
    """The task whose init state the episode started from (its own task when the row does not say)."""
    value = row.get("init_state_task_id")
    return int(row["task_id"]) if value is None else int(value)


def ablated_instruction(row: Mapping[str, Any]) -> str | None:
    """The instruction sent when it was not the task's own (an ablation), else None."""
    sent = row.get("instruction")
    return None if sent is None or sent == row.get("task_description") else str(sent)


def condition(row: Mapping[str, Any]) -> Condition:
    return Condition(str(row.get("suite", "")), int(row["task_id"]), init_state_task(row), ablated_instruction(row))

"""The ``env.eval`` config section: which LIBERO episodes to evaluate and how the envs are laid out.

Its defaults, step caps and task lists come from the suite facts (:mod:`rlinf_cosmos3.config.libero_suites`);
which env slot runs which episode is the env workers' business
(:func:`rlinf_cosmos3.workers.env.episodes.eval_episodes` lists them).

Episode budget convention (cosmos-framework's ``closed_loop_eval``): ``max_episode_steps`` counts
every simulator step after the reset, *including* the ``num_settle_steps`` no-op steps, so with the
libero_spatial cap 220 and 10 settle steps the policy acts for at most 210 steps. A success rate is
always reported together with its cap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rlinf_cosmos3.config.base import require
from rlinf_cosmos3.config.libero_suites import (
    NUM_INIT_STATES,
    NUM_SETTLE_STEPS,
    SHARED_SCENE_SUITES,
    SUITE_MAX_STEPS,
    SUITE_NUM_TASKS,
)
from rlinf_cosmos3.paths import libero_python

# LIBERO controls the robot at 20 Hz; videos play in real time at this rate.
CONTROL_FPS = 20
VIDEO_MODES = ("all", "failures", "none")
"""``env.eval.save_video``: an mp4 for every episode, only for those that did not succeed, or none."""
_VIDEO_BOOL_ALIASES = {"true": "all", "false": "none"}
"""The field used to be a bool; OmegaConf hands a YAML/Hydra ``true``/``false`` to a str field as
``"True"``/``"False"``, so old configs keep their meaning."""


def normalize_video_mode(value: object) -> str:
    """``True``/``"true"`` -> ``"all"``, ``False``/``"false"`` -> ``"none"``, a mode as is (lowercased);
    anything else comes back unchanged as text for :meth:`EnvEvalConfig.validate` to refuse."""
    text = str(value).strip()
    lowered = text.lower()
    if lowered in _VIDEO_BOOL_ALIASES:
        return _VIDEO_BOOL_ALIASES[lowered]
    return lowered if lowered in VIDEO_MODES else text


@dataclass
class EnvEvalConfig:
    """``env.eval``: suite, episodes, env layout, episode budget, videos and simulator timeouts."""

    suite: str = "libero_spatial"
    suites: list[str] | None = None
    """Several suites in one run (e.g. ``[libero_spatial, libero_object, libero_goal, libero_10]``),
    each with its own step cap; overrides ``suite``. None: ``suite`` alone."""
    task_ids: list[int] | None = None
    """Tasks to evaluate, in every suite; None = every task of each suite."""
    trials_per_task: int = NUM_INIT_STATES
    """Episodes per task, one per LIBERO fixed init state ``0..trials_per_task-1`` (trial id = init state id)."""
    init_state_ids: list[int] | None = None
    """The init states to evaluate on every task instead of ``0..trials_per_task-1`` (e.g. held-out
    states ``[40, ..., 49]`` of a policy trained on demonstrations from ``0..39``); overrides
    ``trials_per_task``."""
    init_states_from_task: dict[int, int] = field(default_factory=dict)
    """Instruction swap (issue #31): ``{8: 1}`` runs task 8 -- the policy gets task 8's instruction and
    success is task 8's goal (LIBERO's ``check_success``) -- from task 1's fixed init states instead of its
    own. Measures whether the policy follows the instruction or replays what the scene suggests. Only for
    a suite whose tasks share one scene (libero_goal); ``{}``: every task from its own init states."""
    instruction_override: str | None = None
    """Instruction ablation: every request carries this text instead of the task's instruction (``""``:
    none); success is still the task's goal. Measures how much of the success the instruction is
    responsible for. None: each task's own instruction."""
    total_num_envs: int = 1
    """``E``: simulator processes over all env workers and pipeline stages."""
    num_workers: int = 1
    """``W``: env worker actors; each holds ``pipeline_stage_num`` groups of ``E/(W*S)`` envs."""
    max_episode_steps: int | None = None
    """Step cap including the settle steps, for every suite; None = each suite's cosmos-framework
    default (``suite_max_episode_steps`` overrides it per suite)."""
    suite_max_episode_steps: dict[str, int] = field(default_factory=dict)
    """Per-suite step caps (``{libero_10: 600}``), over ``max_episode_steps`` and the defaults."""
    num_settle_steps: int = NUM_SETTLE_STEPS
    """No-op steps (``[0,0,0,0,0,0,-1]``) after each reset so objects settle; not policy steps."""
    open_loop_steps: int | None = None
    """Commands of each predicted chunk that run before the policy is asked again (receding horizon;
    Cosmos Policy's ``num_open_loop_steps``). None: the whole chunk (``rollout.model.num_action_chunks``),
    as NVIDIA's LIBERO evals run it. Fewer: feedback sooner, more requests per episode."""
    stop_on_success: bool = True
    """End an episode at its first successful step (the reference eval); else run to the cap."""
    final_observations: bool = False
    """Hand back, with the result of an episode that ran to the cap without success, the observation it stopped
    at (RL's PPO bootstraps a truncated episode from its value). Off for the eval: nothing reads it there."""
    image_size: int = 256
    """Height and width of both cameras."""
    seed: int = 0
    """Seed handed to every LIBERO env when it is built."""
    save_video: str = "none"
    """``all`` (an mp4 per episode), ``failures`` (frames are recorded for every episode, but the mp4
    is kept only when ``success_once`` is False -- the episodes people watch) or ``none`` (no frames
    are even sent back: no memory or encoding cost). The booleans of older configs still work:
    ``true`` means ``all``, ``false`` means ``none``."""
    video_dir: str | None = None
    video_fps: int = CONTROL_FPS
    """Frames per second of the saved videos, which play in real time: below the control rate (20) the
    simulator renders only every ``20 / video_fps``-th step for them (10: half the frames). Rendering both
    cameras at every step is most of an eval's simulator time without a GPU (docs/benchmarks.md). It
    must divide 20."""
    sim_timeout_s: float = 300.0
    """Longest wait for one simulator reply (a whole action chunk) before the process counts as hung."""
    sim_startup_timeout_s: float = 120.0
    max_episode_retries: int = 2
    """Re-runs of an episode whose simulator process crashed, before it is reported with ``error``."""
    python: str | None = None
    """Interpreter of the simulator environment; None: ``rlinf_cosmos3.paths.libero_python()``
    (``RLINF_COSMOS3_LIBERO_PYTHON``, else ``.venv-libero`` in the checkout)."""

    def __post_init__(self) -> None:
        self.save_video = normalize_video_mode(self.save_video)

    # ------------------------------------------------------------------ derived values
    @property
    def records_video(self) -> bool:
        """Frames are streamed back and encoded during every episode (``all`` or ``failures``)."""
        return self.save_video in ("all", "failures")

    @property
    def video_frame_stride(self) -> int:
        """Every how many control steps a video frame is rendered (``video_fps`` divides the control rate)."""
        return CONTROL_FPS // self.video_fps

    def keeps_video(self, success_once: bool) -> bool:
        """Whether a completed episode's recorded video is written (else it is discarded)."""
        return self.save_video == "all" or (self.save_video == "failures" and not success_once)

    def resolved_suites(self) -> list[str]:
        """The suites of the run, in order: ``suites``, else ``[suite]``."""
        return list(self.suites) if self.suites else [self.suite]

    @property
    def multi_suite(self) -> bool:
        return len(self.resolved_suites()) > 1

    @property
    def suite_label(self) -> str:
        """The run's suites for logs and titles: ``libero_spatial`` or ``libero_spatial+libero_object``."""
        return "+".join(self.resolved_suites())

    def resolved_max_episode_steps(self, suite: str | None = None) -> int:
        """The step cap of ``suite`` (None: the run's only suite)."""
        if suite is None:
            suites = self.resolved_suites()
            if len(suites) > 1:
                raise ValueError(f"several suites {suites} have a cap each; name the suite")
            suite = suites[0]
        if suite in self.suite_max_episode_steps:
            return int(self.suite_max_episode_steps[suite])
        return self.max_episode_steps if self.max_episode_steps is not None else SUITE_MAX_STEPS[suite]

    def step_caps(self) -> dict[str, int]:
        """Each suite's step cap, in suite order."""
        return {suite: self.resolved_max_episode_steps(suite) for suite in self.resolved_suites()}

    def resolved_task_ids(self, suite: str | None = None) -> list[int]:
        """``task_ids``, else every task of ``suite`` (None: the run's first suite)."""
        if self.task_ids is not None:
            return list(self.task_ids)
        return list(range(SUITE_NUM_TASKS[suite or self.resolved_suites()[0]]))

    def init_state_task(self, task_id: int) -> int:
        """The task whose init states ``task_id``'s episodes start from (itself unless swapped)."""
        return int(self.init_states_from_task.get(int(task_id), task_id))

    def resolved_init_state_ids(self) -> list[int]:
        if self.init_state_ids is not None:
            return [int(i) for i in self.init_state_ids]
        return list(range(self.trials_per_task))

    @property
    def num_episodes(self) -> int:
        return sum(len(self.resolved_task_ids(s)) for s in self.resolved_suites()) * len(self.resolved_init_state_ids())

    @property
    def interpreter(self) -> Path:
        return Path(self.python) if self.python else libero_python()

    def envs_per_stage(self, pipeline_stage_num: int) -> int:
        """``E / (W * S)``: envs in one pipeline stage of one worker."""
        return self.total_num_envs // (self.num_workers * pipeline_stage_num)

    # ------------------------------------------------------------------ validation
    def validate(self, pipeline_stage_num: int = 1, root: str = "env.eval",
                 stage_field: str = "rollout.pipeline_stage_num") -> EnvEvalConfig:
        """Check every field (and ``E % (W*S) == 0``) before any simulator starts."""
        require(self.suite in SUITE_MAX_STEPS, f"{root}.suite", f"unknown LIBERO suite {self.suite!r}",
                f"use one of {sorted(SUITE_MAX_STEPS)}")
        if self.suites is not None:
            suites = list(self.suites)
            require(len(suites) > 0, f"{root}.suites", "is empty", f"leave it null to evaluate {root}.suite alone")
            require(len(set(suites)) == len(suites), f"{root}.suites", f"has duplicates: {suites}",
                    "list each suite once (each episode is evaluated exactly once)")
            bad = [s for s in suites if s not in SUITE_MAX_STEPS]
            require(not bad, f"{root}.suites", f"unknown LIBERO suite(s) {bad}", f"use some of {sorted(SUITE_MAX_STEPS)}")
        extra = sorted(set(self.suite_max_episode_steps) - set(self.resolved_suites()))
        require(not extra, f"{root}.suite_max_episode_steps", f"names suite(s) {extra} this run does not evaluate",
                f"key it by the evaluated suites {self.resolved_suites()}")
        if self.task_ids is not None:
            ids = list(self.task_ids)
            require(len(ids) > 0, f"{root}.task_ids", "is empty", "leave it null to evaluate every task")
            require(len(set(ids)) == len(ids), f"{root}.task_ids", f"has duplicates: {ids}",
                    "list each task once (each (task, init state) is evaluated exactly once)")
            for suite in self.resolved_suites():
                num_tasks = SUITE_NUM_TASKS[suite]
                bad = [t for t in ids if not 0 <= int(t) < num_tasks]
                require(not bad, f"{root}.task_ids", f"{bad} out of range for {suite} ({num_tasks} tasks)",
                        f"use ids in 0..{num_tasks - 1}")
        require(1 <= self.trials_per_task <= NUM_INIT_STATES, f"{root}.trials_per_task",
                f"must be in 1..{NUM_INIT_STATES} (LIBERO's fixed init states per task), got {self.trials_per_task}")
        if self.init_state_ids is not None:
            ids = list(self.init_state_ids)
            require(len(ids) > 0 and len(set(ids)) == len(ids), f"{root}.init_state_ids",
                    f"must list distinct init states, got {ids}", "leave it null to use trials_per_task")
            bad = [i for i in ids if not 0 <= int(i) < NUM_INIT_STATES]
            require(not bad, f"{root}.init_state_ids", f"{bad} out of range (LIBERO has {NUM_INIT_STATES} per task)",
                    f"use ids in 0..{NUM_INIT_STATES - 1}")
        self._validate_instruction_options(root)
        require(self.total_num_envs >= 1, f"{root}.total_num_envs", f"must be >= 1, got {self.total_num_envs}")
        require(self.num_workers >= 1, f"{root}.num_workers", f"must be >= 1, got {self.num_workers}")
        require(pipeline_stage_num >= 1, stage_field, f"must be >= 1, got {pipeline_stage_num}")
        groups = self.num_workers * pipeline_stage_num
        require(self.total_num_envs % groups == 0, f"{root}.total_num_envs",
                f"{self.total_num_envs} envs cannot be split evenly over {root}.num_workers={self.num_workers} "
                f"x {stage_field}={pipeline_stage_num} env groups",
                f"make {root}.total_num_envs a multiple of {groups}")
        require(self.num_settle_steps >= 0, f"{root}.num_settle_steps", f"must be >= 0, got {self.num_settle_steps}")
        require(self.open_loop_steps is None or self.open_loop_steps >= 1, f"{root}.open_loop_steps",
                f"must be >= 1, got {self.open_loop_steps}", "leave it null to run every predicted command")
        for suite, cap in self.step_caps().items():
            where = f"{root}.suite_max_episode_steps" if suite in self.suite_max_episode_steps \
                else f"{root}.max_episode_steps"
            require(cap > self.num_settle_steps, where,
                    f"cap {cap} of {suite} leaves no policy step after {self.num_settle_steps} settle steps "
                    "(the cap counts the settle steps)", f"set it above {self.num_settle_steps}")
        require(self.image_size >= 16, f"{root}.image_size", f"must be >= 16, got {self.image_size}")
        self.save_video = normalize_video_mode(self.save_video)
        require(self.save_video in VIDEO_MODES, f"{root}.save_video",
                f"must be one of {', '.join(VIDEO_MODES)} (or true/false for all/none), got {self.save_video!r}",
                f"set {root}.save_video=failures (only episodes that did not succeed), all or none")
        if self.records_video:
            require(bool(self.video_dir), f"{root}.video_dir",
                    f"is required when save_video is {self.save_video}",
                    f"set {root}.video_dir=/path/to/videos or {root}.save_video=none")
        require(self.video_fps > 0 and CONTROL_FPS % self.video_fps == 0, f"{root}.video_fps",
                f"must divide the control rate {CONTROL_FPS} (the videos play in real time), got {self.video_fps}",
                f"set {root}.video_fps to one of "
                f"{', '.join(str(f) for f in range(CONTROL_FPS, 0, -1) if CONTROL_FPS % f == 0)}")
        require(self.sim_timeout_s > 0, f"{root}.sim_timeout_s", f"must be > 0, got {self.sim_timeout_s}")
        require(self.sim_startup_timeout_s > 0, f"{root}.sim_startup_timeout_s",
                f"must be > 0, got {self.sim_startup_timeout_s}")
        require(self.max_episode_retries >= 0, f"{root}.max_episode_retries",
                f"must be >= 0, got {self.max_episode_retries}")
        return self

    def _validate_instruction_options(self, root: str) -> None:
        """``init_states_from_task``: tasks of the one shared-scene suite the run evaluates, each key a task
        the run evaluates; ``instruction_override``: one line, as the adapter sends it (stripped)."""
        swap = self.init_states_from_task
        if swap:
            field_name = f"{root}.init_states_from_task"
            suites = self.resolved_suites()
            require(len(suites) == 1 and suites[0] in SHARED_SCENE_SUITES, field_name,
                    f"swaps init states between tasks of {suites}, but only the tasks of {list(SHARED_SCENE_SUITES)} "
                    "share one scene (their BDDL files declare the same fixtures, objects and init regions and "
                    "differ only in the goal and language); another task's init state elsewhere is another scene",
                    f"evaluate {root}.suite=libero_goal alone ({root}.suites=null), or set {field_name}={{}}")
            num_tasks = SUITE_NUM_TASKS[suites[0]]
            bad = sorted({int(t) for pair in swap.items() for t in pair if not 0 <= int(t) < num_tasks})
            require(not bad, field_name, f"task ids {bad} out of range for {suites[0]} ({num_tasks} tasks)",
                    f"map task ids in 0..{num_tasks - 1}: {{instructed task: task whose init states it starts from}}")
            same = sorted(int(t) for t, source in swap.items() if int(t) == int(source))
            require(not same, field_name, f"maps task(s) {same} to themselves: no swap",
                    "remove those entries (a task starts from its own init states unless listed)")
            missing = sorted(int(t) for t in swap if int(t) not in self.resolved_task_ids())
            require(not missing, field_name, f"swaps task(s) {missing}, which this run does not evaluate "
                    f"({root}.task_ids={self.resolved_task_ids()})", f"add them to {root}.task_ids, or remove them")
        text = self.instruction_override
        if text is not None:
            require(text == text.strip() and "\n" not in text, f"{root}.instruction_override",
                    f"{text!r} has surrounding spaces or a line break; the request would carry another text "
                    "than results.jsonl records", f"write it as one stripped line, e.g. {root}.instruction_override="
                    f"'{' '.join(text.split())}', or null for each task's own instruction")

    def check_interpreter(self, root: str = "env.eval") -> Path:
        """The simulator environment's python must exist before any env worker tries to start one."""
        require(self.interpreter.is_file(), f"{root}.python",
                f"simulator interpreter not found at '{self.interpreter}' (the LIBERO environment is not installed "
                "there)", f"run requirements/install.sh (it builds .venv-libero), or point {root}.python or "
                "RLINF_COSMOS3_LIBERO_PYTHON at the simulator environment's python")
        return self.interpreter

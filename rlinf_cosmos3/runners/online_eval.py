"""Evaluation during SFT: every ``runner.eval_interval`` steps, the checkpoint just saved is evaluated in LIBERO.

Each evaluation is one process (:mod:`rlinf_cosmos3.runners.online_eval_job`) in a session of its own:
it converts the checkpoint (EMA weights by default) and runs ``runner.online_eval.config_name`` with the
embedded backend, while the ranks keep training. The driver only starts it, watches it between steps
and, when it ends, logs ``eval/success_once`` and ``eval/success_at_end`` at the evaluated step into
the run's TensorBoard. One evaluation runs at a time: a checkpoint due while one runs waits (only the
newest waiting one: an older one is skipped, and logged as such); at the end of training the driver
waits for both after the ranks are gone. A failed, timed-out or killed evaluation is a warning, never
the end of the training run; checkpoints being evaluated are kept from retention.

Why the embedded backend and not a SGLang server refreshed with ``update_weights_from_disk``: a
server reserves a fixed share of GPU memory for its whole life (its KV cache pool), which a training
run cannot give up, and it needs a port and a separate interpreter; the embedded pipeline holds the
model only while it evaluates, and runs anywhere the training runs (also on CPU).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rlinf_cosmos3.config import ConfigError
from rlinf_cosmos3.config.sft import SFTConfig
from rlinf_cosmos3.models.cosmos3.identity import ModelIdentity
from rlinf_cosmos3.paths import REPO_ROOT
from rlinf_cosmos3.procgroup import stop_group
from rlinf_cosmos3.runners.online_eval_job import MODEL_DIR
from rlinf_cosmos3.tracking import ScalarWriter
from rlinf_cosmos3.workers.rollout import cleanup

logger = logging.getLogger("rlinf_cosmos3.sft")

JOB_MODULE = "rlinf_cosmos3.runners.online_eval_job"
ONLINE_EVAL_TAG_ENV = "RLINF_COSMOS3_ONLINE_EVAL"
"""Set to the run's ``online_eval`` directory in every evaluation process's environment (and so in its
Ray, simulators and workers): how a check finds what an evaluation left running."""
CHECK_TIMEOUT_S = 600
STOP_GRACE_S = 30.0
SUMMARY_KEYS = ("success_once", "success_at_end", "num_trajectories", "num_errors")


@dataclass
class _Job:
    step: int
    checkpoint: Path
    work: Path
    proc: subprocess.Popen
    started: float

    @property
    def log(self) -> Path:
        return self.work / "job.log"


class OnlineEvaluator:
    """Starts, watches and reports the evaluations of one SFT run; use as a context manager."""

    def __init__(self, cfg: SFTConfig, run_root: Path, identity: ModelIdentity) -> None:
        self.cfg = cfg
        self.online = cfg.runner.online_eval
        self.interval = cfg.runner.eval_interval
        self.root = Path(run_root) / "online_eval"
        self.identity = identity
        self.use_ema = self.online.use_ema and cfg.actor.model.ema_enabled
        self._running: _Job | None = None
        self._waiting: tuple[int, Path] | None = None
        self.results: dict[int, dict[str, float] | None] = {}
        """Step -> its summary's rates, or None for an evaluation that failed."""

    @property
    def enabled(self) -> bool:
        return self.interval is not None

    def _base_args(self) -> list[str]:
        model, data = self.cfg.actor.model, self.cfg.data.dataset
        return ["--config-name", self.online.config_name, "--base", model.model_path, "--stats", data.stats_path]

    def check(self) -> None:
        """Compose and validate the eval config as the evaluations will run it; raises ConfigError."""
        if not self.enabled:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        identity_file = self.root / "training_identity.json"
        identity_file.write_text(self.identity.to_json())
        cmd = [sys.executable, "-m", JOB_MODULE, "check", *self._base_args(), "--identity", str(identity_file),
               *self.online.overrides]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, env=self._env(),
                              cwd=str(REPO_ROOT))
        if proc.returncode != 0:
            reason = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit code {proc.returncode}"
            raise ConfigError("runner.online_eval", f"the eval config '{self.online.config_name}' with overrides "
                              f"{self.online.overrides} cannot evaluate this run's checkpoints: {reason}",
                              "change runner.online_eval.overrides (or config_name) so that "
                              "evaluations/run_eval.sh accepts them for this model")
        logger.info("online eval: every %d steps, %s%s with the embedded backend (%s weights); results in %s and "
                    "TensorBoard eval/*", self.interval, self.online.config_name,
                    f" {' '.join(self.online.overrides)}" if self.online.overrides else "",
                    "EMA" if self.use_ema else "trained", self.root)

    def due(self, step: int) -> bool:
        return self.enabled and step % self.interval == 0

    def protected(self) -> list[Path]:
        """Checkpoints an evaluation reads now or will read: retention must not delete them."""
        out = [self._running.checkpoint] if self._running else []
        return out + ([self._waiting[1]] if self._waiting else [])

    def submit(self, step: int, checkpoint: Path) -> None:
        """Evaluate ``checkpoint`` now, or as soon as the running evaluation ends."""
        if self._running is None:
            self._start(step, checkpoint)
            return
        if self._waiting is not None:
            logger.warning("online eval: step %d skipped (step %d is newer and the evaluation of step %d still runs)",
                           self._waiting[0], step, self._running.step)
            self.results[self._waiting[0]] = None
        self._waiting = (step, checkpoint)
        logger.info("online eval: step %d waits for the evaluation of step %d", step, self._running.step)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("RAY_ADDRESS", None)  # the evaluation starts a private Ray of its own, never the training's
        env[ONLINE_EVAL_TAG_ENV] = str(self.root)
        return env

    def _start(self, step: int, checkpoint: Path) -> None:
        work = self.root / f"step_{step}"
        work.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", JOB_MODULE, "run", *self._base_args(), "--checkpoint", str(checkpoint),
               "--work", str(work), *(["--use-ema"] if self.use_ema else []),
               *(["--keep-model"] if self.online.keep_models else []), *self.online.overrides]
        with open(work / "job.log", "w") as log:
            log.write("# command: " + " ".join(cmd) + "\n")
            log.flush()
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env=self._env(), cwd=str(REPO_ROOT))
        self._running = _Job(step, checkpoint, work, proc, time.monotonic())
        logger.info("online eval of step %d started (pid %d; log %s)", step, proc.pid, self._running.log)

    def poll(self, writer: ScalarWriter) -> None:
        """Report an evaluation that ended (or ran out of time) and start the waiting one."""
        job = self._running
        if job is None:
            return
        if job.proc.poll() is None:
            if time.monotonic() - job.started <= self.online.timeout_s:
                return
            logger.warning("online eval of step %d ran longer than runner.online_eval.timeout_s=%g s: stopping it",
                           job.step, self.online.timeout_s)
            self._stop(job)
        self._report(job, writer)
        self._running = None
        if self._waiting is not None:
            step, checkpoint = self._waiting
            self._waiting = None
            self._start(step, checkpoint)

    def finish(self, writer: ScalarWriter) -> None:
        """Wait for the running and the waiting evaluation (each within its timeout) and report them."""
        while self._running is not None:
            logger.info("waiting for the online eval of step %d (log %s)", self._running.step, self._running.log)
            while self._running.proc.poll() is None and \
                    time.monotonic() - self._running.started <= self.online.timeout_s:
                time.sleep(1.0)
            self.poll(writer)
        writer.flush()

    def _report(self, job: _Job, writer: ScalarWriter) -> None:
        code = job.proc.returncode
        if not self.online.keep_models:  # a killed job could not remove its converted model itself
            shutil.rmtree(job.work / MODEL_DIR, ignore_errors=True)
        summaries = sorted(job.work.glob("*/summary.json"))
        if code != 0 or not summaries:
            logger.warning("online eval of step %d failed (exit code %s): see %s; training is not affected",
                           job.step, code, job.log)
            self.results[job.step] = None
            return
        summary = json.loads(summaries[-1].read_text())
        rates = {key: float(summary[key]) for key in SUMMARY_KEYS}
        self.results[job.step] = rates
        writer.log(rates, job.step, prefix="eval")
        writer.flush()
        low, high = summary["success_once_ci95"]
        logger.info("online eval of step %d: success_once %.1f%% [%.1f%%, %.1f%%] success_at_end %.1f%% over %d "
                    "episodes in %.0f s (%s)", job.step, 100 * rates["success_once"], 100 * low, 100 * high,
                    100 * rates["success_at_end"], rates["num_trajectories"], time.monotonic() - job.started,
                    summaries[-1].parent)

    def _stop(self, job: _Job) -> None:
        """SIGTERM the job's process group (its Ray and simulators stop with it), SIGKILL what remains."""
        stop_group(job.proc, STOP_GRACE_S, kill_wait_s=STOP_GRACE_S)

    def close(self) -> None:
        """Stop a running evaluation (training failed or was interrupted); idempotent."""
        cleanup.unregister(self)
        job, self._running, self._waiting = self._running, None, None
        if job is not None and job.proc.poll() is None:
            logger.warning("stopping the online eval of step %d (training ended first)", job.step)
            self._stop(job)

    def __enter__(self) -> OnlineEvaluator:
        cleanup.register(self)  # also on SIGTERM/SIGINT of the driver
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

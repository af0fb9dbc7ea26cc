"""One ``sglang serve`` process: launch in its own process group, wait for health, stop the whole group.

The server runs from the SGLang environment's interpreter (its dependency pins conflict with
ours). ``start_new_session=True`` makes it lead its own process group, so stopping it reaches the
scheduler and helper processes it forks (SIGTERM to the group, SIGKILL after a grace period) and a
Ctrl-C in the driver's terminal does not hit it half-way. Its output goes to a log file, whose tail
is shown in every start-up error.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from rlinf_cosmos3.procgroup import processes_with_env, stop_group
from rlinf_cosmos3.workers.rollout.http_client import HEALTH_PATH
from rlinf_cosmos3.workers.rollout.ports import PortBlock, reserve_port_block

logger = logging.getLogger(__name__)

LOG_TAIL_CHARS = 4000
HEALTH_POLL_S = 0.5
SERVER_TAG_ENV = "RLINF_COSMOS3_SGLANG_SERVER"
"""Set in every server's environment (inherited by its children) as ``<group tag>:rank<i>``, so
leftover processes can be found — by tests, or by hand with ``grep -l`` over /proc/*/environ."""
# A port chosen free can still be taken before the server binds it; SGLang then exits with this.
PORT_RACE_MARKER = "--strict-ports is enabled"



def tagged_processes(tag: str) -> list[psutil.Process]:
    """Live processes started for the server group ``tag``: each carries ``SERVER_TAG_ENV=<tag>:rank<i>`` in its
    environment, children of the server included."""
    return processes_with_env(SERVER_TAG_ENV, lambda value: value.startswith(f"{tag}:"))


class ServerStartError(RuntimeError):
    """The server exited or stayed unhealthy during start-up; the message carries its log tail."""


@dataclass
class ServerSpec:
    """Everything needed to launch one server; picklable, so a Ray actor can launch it too."""

    model_path: str
    python: str
    script: str
    log_dir: str
    host: str = "127.0.0.1"
    base_port: int = 30000
    batching_max_size: int = 8
    """= ``SGLangConfig.batching_max_size``'s default (the group always passes its config's value)."""
    sleep_on_idle: bool = True
    warmup_mode: str = "off"
    gpu_ids: list[str] | None = None
    """CUDA_VISIBLE_DEVICES for this server; None: a CPU server (no GPU visible)."""
    extra_args: list[str] = field(default_factory=list)
    stop_timeout_s: float = 15.0
    tag: str = ""
    """Group identifier put into the server's environment (SERVER_TAG_ENV)."""


def _connect_host(host: str) -> str:
    """Where a client on this node reaches a server bound to ``host``."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


class SGLangServerProcess:
    """``sglang serve`` for one rank; ``launch`` / ``stop`` may be repeated (restarts)."""

    def __init__(self, spec: ServerSpec, rank: int, advertise_host: str | None = None) -> None:
        self.spec = spec
        self.rank = rank
        self.advertise_host = advertise_host or _connect_host(spec.host)
        self.launches = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.ports: PortBlock | None = None
        self.log_path: Path | None = None
        self._lock = threading.Lock()  # launch and stop may come from different threads

    @property
    def url(self) -> str:
        if self.ports is None:
            raise RuntimeError(f"sglang server rank {self.rank} has not been launched")
        return f"http://{self.advertise_host}:{self.ports.http}"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def command(self) -> list[str]:
        spec, ports = self.spec, self.ports
        assert ports is not None
        cmd = [spec.python, spec.script, "serve", spec.model_path, "--host", spec.host,
               "--port", str(ports.http), "--scheduler-port", str(ports.scheduler),
               "--master-port", str(ports.master), "--strict-ports",
               "--batching-max-size", str(spec.batching_max_size), "--warmup-mode", spec.warmup_mode]
        if spec.sleep_on_idle:
            cmd.append("--sleep-on-idle")
        return cmd + list(spec.extra_args)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        local = "127.0.0.1,localhost,::1"
        no_proxy = env.get("NO_PROXY", env.get("no_proxy", ""))
        env["NO_PROXY"] = env["no_proxy"] = f"{no_proxy},{local}".strip(",")
        env[SERVER_TAG_ENV] = f"{self.spec.tag}:rank{self.rank}"
        if self.spec.gpu_ids is None:
            env["CUDA_VISIBLE_DEVICES"] = ""
            env["SGLANG_DIFFUSION_PLATFORM_OVERRIDE"] = "cpu"
        else:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.spec.gpu_ids)
        return env

    def launch(self) -> None:
        """Start the process (ports reserved, log opened); returns at once — see ``wait_healthy``."""
        with self._lock:
            self._launch()

    def _launch(self) -> None:
        if self.alive():
            raise RuntimeError(f"sglang server rank {self.rank} is already running (pid {self.pid})")
        self._stop()  # leftovers of a dead previous launch
        self.launches += 1
        self.ports = reserve_port_block(self.spec.base_port)
        log_dir = Path(self.spec.log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"sglang_server_rank{self.rank}_launch{self.launches}.log"
        cmd = self.command()
        devices = "cpu" if self.spec.gpu_ids is None else ",".join(self.spec.gpu_ids)
        logger.info("Launching sglang server (server_type=embodied) rank=%d: http=%s:%d, scheduler=%d, "
                    "master=%d, CUDA_VISIBLE_DEVICES=%s, log=%s", self.rank, self.spec.host, self.ports.http,
                    self.ports.scheduler, self.ports.master, devices, self.log_path)
        logger.debug("command: %s", " ".join(cmd))
        with self.log_path.open("ab") as log:
            # The exact command first: to start such a server by hand (e.g. for rollout.sglang.server_urls).
            log.write(f"# command: {shlex.join(cmd)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self._env(), cwd=log_dir, start_new_session=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "<no log>"
        with self.log_path.open("rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - chars))
            return log.read().decode(errors="replace")

    def port_race_lost(self) -> bool:
        """True when the server exited because a reserved port was taken by someone else meanwhile."""
        return not self.alive() and PORT_RACE_MARKER in self.log_tail()

    def _start_error(self, problem: str) -> ServerStartError:
        return ServerStartError(f"sglang server rank {self.rank} ({self.url}) {problem}; "
                                f"log {self.log_path}, last lines:\n{self.log_tail()}")

    async def wait_healthy(self, timeout_s: float) -> float:
        """Poll ``GET /health`` until 200; return the seconds it took. Raises ServerStartError."""
        start = time.monotonic()
        async with httpx.AsyncClient(trust_env=False, timeout=5.0) as client:
            while True:
                if not self.alive():
                    code = None if self.proc is None else self.proc.returncode
                    raise self._start_error(f"exited with code {code} before becoming healthy")
                try:
                    if (await client.get(f"{self.url}{HEALTH_PATH}")).status_code == 200:
                        return time.monotonic() - start
                except httpx.TransportError:
                    pass
                if time.monotonic() - start > timeout_s:
                    raise self._start_error(f"not healthy after {timeout_s:.0f} s (health_timeout_s)")
                await asyncio.sleep(HEALTH_POLL_S)

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL what is left after the grace period; idempotent."""
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            if stop_group(proc, self.spec.stop_timeout_s):
                logger.warning("sglang server rank %d: group %d ignored SIGTERM for %.0f s; killed it",
                               self.rank, proc.pid, self.spec.stop_timeout_s)
            if proc.returncode is None:
                logger.error("sglang server rank %d: pid %d did not exit after SIGKILL", self.rank, proc.pid)
            logger.info("sglang server rank %d stopped (pid %d, exit code %s)", self.rank, proc.pid, proc.returncode)
        if self.ports is not None:
            self.ports.release()




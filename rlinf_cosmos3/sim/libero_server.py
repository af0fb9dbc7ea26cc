"""Simulator process: ``python -m rlinf_cosmos3.sim.libero_server`` under .venv-libero.

Reads requests from stdin and writes replies to a private duplicate of the original stdout; fd 1
itself is pointed at stderr so that LIBERO's and robosuite's prints cannot corrupt the channel.
A request is ``{"cmd": name, **args}`` (arrays as message arrays); the reply carries
``ok: true`` plus the command's results (``reset``/``step``/``chunk_step`` add the privileged
scene state when sent ``privileged: true``; ``reset`` may name ``init_state_task_id``, another task
of the suite whose init state to load), or ``ok: false`` with the error and its traceback (the
process stays usable). EOF on stdin, or the ``close`` command, ends the process; so does a broken
reply pipe. That is how the process follows a parent that died without closing it: the parent's
end of both pipes closes with it. (No ``PR_SET_PDEATHSIG``: it fires when the *thread* that
started the child exits, which would kill simulators started from worker threads.)
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Callable
from typing import IO, Any

import numpy as np

from rlinf_cosmos3.sim.protocol import Message, read_message, split_arrays, write_message

logger = logging.getLogger("rlinf_cosmos3.sim.libero_server")


def take_protocol_channel() -> IO[bytes]:
    """Keep the real stdout for protocol replies and send everything printed to fd 1 to stderr."""
    channel = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return channel


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _handlers(session: Any) -> dict[str, Callable[[Message], dict[str, Any]]]:
    def make(m: Message) -> dict[str, Any]:
        f = m.fields
        return session.make(
            suite=f["suite"], task_id=int(f["task_id"]),
            camera_height=int(f.get("camera_height", 256)), camera_width=int(f.get("camera_width", 256)),
            seed=int(f.get("seed", 0)), horizon=int(f.get("horizon", 1000)),
            hard_reset=bool(f.get("hard_reset", True)),
            skip_repeated_forward=bool(f.get("skip_repeated_forward", True)),
        )

    def with_privileged(m: Message, reply: dict[str, Any]) -> dict[str, Any]:
        """Scripted policies need the scene state after every step: save them a round trip."""
        return {**reply, **session.privileged()} if m.fields.get("privileged", False) else reply

    return {
        "ping": lambda m: {"pid": os.getpid()},
        "echo": lambda m: {**m.fields, **m.arrays, "numpy_version": np.__version__},
        "make": make,
        "reset": lambda m: with_privileged(m, session.reset(int(m.fields["init_state_id"]),
                                                            _optional_int(m.fields.get("init_state_task_id")),
                                                            _optional_int(m.fields.get("seed")))),
        "step": lambda m: with_privileged(m, session.step(m.arrays["action"])),
        "chunk_step": lambda m: with_privileged(m, session.chunk_step(
            m.arrays["actions"], stop_on_success=bool(m.fields.get("stop_on_success", False)),
            return_frames=bool(m.fields.get("return_frames", False)),
            frame_stride=int(m.fields.get("frame_stride", 1)))),
        "privileged": lambda m: session.privileged(),
        "forward_counts": lambda m: {"calls": session.forward_counts.calls,
                                     "skipped": session.forward_counts.skipped},
        "raw_observation": lambda m: session.raw_observation(),
    }


def serve(inp: IO[bytes], out: IO[bytes]) -> None:
    """Answer requests until EOF or ``close``."""
    from rlinf_cosmos3.sim.libero_session import LiberoSession

    session = LiberoSession()
    handlers = _handlers(session)
    try:
        while True:
            try:
                request = read_message(inp)
            except EOFError:
                return
            cmd = request.fields.get("cmd")
            if cmd == "close":
                session.close()
                write_message(out, Message(fields={"ok": True}))
                return
            handler = handlers.get(cmd)
            try:
                if handler is None:
                    raise ValueError(f"unknown command {cmd!r}; known: {sorted([*handlers, 'close'])}")
                reply = split_arrays(handler(request))
                reply.fields["ok"] = True
            except Exception as exc:  # noqa: BLE001 - any failure is reported to the parent, which raises it
                logger.error("command %r failed:\n%s", cmd, traceback.format_exc())
                reply = Message(fields={"ok": False, "error": f"{type(exc).__name__}: {exc}",
                                        "traceback": traceback.format_exc()})
            write_message(out, reply)
    finally:
        session.close()


def main() -> None:
    channel = take_protocol_channel()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s [sim %(process)d] %(message)s")
    serve(sys.stdin.buffer, channel)


if __name__ == "__main__":
    main()

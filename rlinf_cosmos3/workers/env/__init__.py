"""LIBERO evaluation envs: config, episode assignment, env slots and stages, videos, the Ray actor.

Import submodules explicitly (``config``, ``episodes``, ``libero_env_worker``, ...); this package root
imports nothing, so the pure pieces load without Ray or torch. See docs/env_worker.md.
"""

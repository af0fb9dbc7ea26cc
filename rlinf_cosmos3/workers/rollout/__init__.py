"""Rollout backends for evaluation: the action adapter, SGLang server group, HTTP client, embedded worker.

Import submodules explicitly (``adapter``, ``sglang_group``, ``embedded``, ...); this package root
imports nothing, so the light pieces (config, codec, HTTP client) do not pull in torch or Ray.
See docs/rollout.md.
"""

"""Ray workers: ``actor`` (FSDP2 SFT training), ``rollout`` (policy serving) and ``env`` (LIBERO).

Subpackages are imported explicitly; this package root imports nothing heavy.
"""

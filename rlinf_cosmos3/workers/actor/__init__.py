"""The SFT actor: :class:`~rlinf_cosmos3.workers.actor.fsdp_sft_worker.FSDPSFTWorker`, one FSDP2 rank.

What a rank builds from (optimizer, LR schedule, clipping, EMA, the optimizer step) lives in
:mod:`rlinf_cosmos3.components`, below the workers, so ``checkpoint/`` can use it too.
This package root imports nothing heavy; import ``fsdp_sft_worker`` explicitly.
"""

"""Training components used by the SFT worker and by the benchmarks alike (torchtitan-style).

One home for what a training step is, so a benchmark times exactly what the worker runs:
``optim`` (trainable selection, AdamW param groups, LambdaLinear schedule, gradient clipping),
``ema`` (power EMA of the trainable weights) and ``train_step`` (one optimizer step). They sit
below ``workers/`` and ``checkpoint/`` (which saves and restores the EMA); import the submodules
explicitly, this package root imports nothing.
"""

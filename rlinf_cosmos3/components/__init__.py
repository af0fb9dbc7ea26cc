"""Training components used by the SFT worker and by the benchmarks alike (torchtitan-style).

One home for what a training step is, so a benchmark times exactly what the worker runs.
"""

"""Batching LIBERO samples: tensors stacked on a new first dim, strings kept as lists.

Written out instead of using torch's ``default_collate`` so that a shape disagreement names
the key and the two shapes, and so the batch layout is fixed here rather than inferred.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def collate_samples(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Stack the tensors of ``samples`` (``[B, ...]``); ``prompt`` and other strings become lists."""
    if not samples:
        raise ValueError("collate_samples: empty batch")
    keys = list(samples[0])
    for i, sample in enumerate(samples[1:], start=1):
        if list(sample) != keys:
            raise ValueError(
                f"collate_samples: sample {i} has keys {sorted(sample)}, sample 0 has {sorted(keys)}"
            )
    batch: dict[str, Any] = {}
    for key in keys:
        values = [s[key] for s in samples]
        first = values[0]
        if isinstance(first, torch.Tensor):
            for i, v in enumerate(values):
                if v.shape != first.shape or v.dtype != first.dtype:
                    raise ValueError(
                        f"collate_samples: '{key}' of sample {i} is {tuple(v.shape)} {v.dtype}, "
                        f"sample 0 has {tuple(first.shape)} {first.dtype}"
                    )
            batch[key] = torch.stack(values)
        elif isinstance(first, str):
            batch[key] = list(values)
        else:
            raise TypeError(
                f"collate_samples: don't know how to batch '{key}' of type {type(first).__name__}"
            )
    return batch

"""Model wrappers. Subpackages import torch/diffusers lazily; this package root imports nothing."""

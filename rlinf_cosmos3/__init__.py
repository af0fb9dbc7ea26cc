"""rlinf-cosmos3: SFT, conversion and LIBERO evaluation of NVIDIA Cosmos3 (diffusers) on Ray.

The package root imports nothing heavy: parts of it (``rlinf_cosmos3.sim``,
``rlinf_cosmos3.actions``) also run inside the simulator environment, which has numpy < 2
and none of the training stack.
"""

__version__ = "0.1.0"

"""Write a random Cosmos3 diffusers directory that diffusers and the SGLang server both load.

    python toolkits/cosmos3/make_tiny_model.py --out /tmp/cosmos3-tiny              # ~14 MB, CPU tests
    python toolkits/cosmos3/make_tiny_model.py --out /tmp/cosmos3-nano --preset nano
        # the real Nano architecture: configs only; on a GPU host add --materialize-on cuda
        # to write random bf16 weights (~31 GB) for SGLang benchmarks

The builder lives in ``rlinf_cosmos3.models.cosmos3.tiny``; this script is its command line.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from rlinf_cosmos3.models.cosmos3.tiny import PRESETS, write_model_dir, write_random_weights


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="directory to create")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing model directory")
    parser.add_argument(
        "--materialize-on",
        metavar="DEVICE",
        default=None,
        help="nano only: build the random weights on this device (e.g. cuda) and save them (bf16)",
    )
    parser.add_argument(
        "--num-layers",
        type=int,
        default=None,
        help="keep this many decoder layers (e.g. a Nano-width model that trains on one GPU: 22 of 36 fit "
             "with AdamW, fewer with EMA); set before any weights are made",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    if args.materialize_on and PRESETS[args.preset].write_weights:
        parser.error(f"--materialize-on is for presets without CPU weights; {args.preset!r} has them")
    try:
        out = write_model_dir(args.out, preset=args.preset, seed=args.seed, overwrite=args.overwrite,
                              num_layers=args.num_layers)
    except FileExistsError as err:  # --out in use, no --overwrite
        parser.error(f"--out: {err}")
    except ValueError as err:  # --num-layers out of the preset's range
        parser.error(f"--num-layers: {err}")
    if args.materialize_on:
        write_random_weights(out, device=args.materialize_on, seed=args.seed)
    logging.getLogger(__name__).info("done: %s", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Convert an SFT checkpoint into a diffusers Cosmos3 directory that SGLang serves.

    .venv/bin/python toolkits/cosmos3/convert_checkpoint.py \\
        --src logs/<exp>/checkpoints/global_step_<N>/actor/model_state_dict/full_weights.pt \\
        --base <base model_diffusers dir> --out <new model dir> [--use-ema-weights] [--dtype bf16]

``--src`` may also be the ``global_step_<N>`` directory itself, or a run's ``checkpoints/`` directory:
then its newest complete checkpoint by step number is converted (and named in the log).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", required=True, help="full_weights.pt, full_weights_ema.pt, a global_step_<N> dir, or a checkpoints/ dir "
                        "(its newest complete checkpoint)")
    parser.add_argument("--base", required=True, help="the diffusers directory the SFT run started from")
    parser.add_argument("--out", required=True, help="output diffusers directory")
    parser.add_argument("--use-ema-weights", action="store_true", help="export the EMA weights")
    parser.add_argument("--dtype", default="as-trained", choices=["as-trained", "bf16", "fp32"])
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from rlinf_cosmos3.checkpoint.export import export_diffusers

    t0 = time.perf_counter()
    try:
        out = export_diffusers(args.src, args.base, args.out, use_ema=args.use_ema_weights,
                               dtype=args.dtype, overwrite=args.overwrite)
    except (FileNotFoundError, FileExistsError, KeyError, ValueError) as err:
        logging.error("conversion failed: %s", err)
        return 1
    logging.info("wrote %s in %.1f s", out, time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())

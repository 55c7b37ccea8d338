"""Score given layer or sublayer masks on several calibrations: KL(full‖slim), top-1 agreement and 1 − TV.

    python benchmarks/score_masks.py --pair smollm2 --calibrations 2x64,8x128,16x128 \
        111101111111000100011111110111 1111m11mmm110a0100m1111m1mm111

Mask keys as `dimr show` prints them (``1`` layer run, ``0`` skipped; in sublayer keys ``a`` attention only,
``m`` MLP only). Each calibration is the pair's default mix packed into SEQUENCES × LENGTH tokens, scored by the
search's own `workers.local.MaskScorer`, so the numbers equal what a search on that calibration records.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dimr.calibration import load_calibration  # noqa: E402
from dimr.masks import SublayerMask  # noqa: E402
from dimr.pairs import get_pair, load_tokenizer  # noqa: E402
from workers import EvalSpec  # noqa: E402
from workers.local import MaskScorer  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("masks", nargs="+", help="mask keys")
    ap.add_argument("--pair", default="mini")
    ap.add_argument("--calibrations", default="2x64,8x128", help="SEQUENCESxLENGTH, comma-separated")
    ap.add_argument("--cost", default="kl")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="write the scores as JSON")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    pair = get_pair(args.pair)
    masks = [SublayerMask.from_key(k) for k in args.masks]  # a layer key is a sublayer key of 1s and 0s
    out: dict[str, dict] = {k: {} for k in args.masks}
    for label in args.calibrations.split(","):
        n, length = (int(x) for x in label.split("x"))
        calib = load_calibration(pair.calibration, load_tokenizer(pair), n, length)
        scorer = MaskScorer(EvalSpec(pair=pair, input_ids=calib.input_ids, cost=args.cost, device="cpu"))
        for key, mask in zip(args.masks, masks, strict=True):
            e = scorer.score(mask)
            out[key][label] = {"cost": e.cost, "top1_agreement": e.top1_agreement,
                               "expected_acceptance": e.expected_acceptance}
        del scorer
    labels = args.calibrations.split(",")
    print("| mask | " + " | ".join(f"{lab}: {args.cost} / top-1 / 1 − TV" for lab in labels) + " |")
    print("|" + "---|" * (len(labels) + 1))
    for key, row in out.items():
        print(f"| `{key}` | " + " | ".join(f"{row[lab]['cost']:.4g} / {row[lab]['top1_agreement']:.3f} / "
                                           f"{row[lab]['expected_acceptance']:.3f}" for lab in labels) + " |")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()

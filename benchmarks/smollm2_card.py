"""The figures of the smollm2 model card (docs/smollm2.md): single-layer-skip KL profile, best masks found at
skip 4/8/12 (short searches), and greedy `ar` tokens/s. Forward costs by kept layers come from
`dimr bench-forward --pair smollm2 --kept 8,16,22,26 --lengths 1,5`.

    python benchmarks/smollm2_card.py --trials 24 --out /tmp/card.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dimr.calibration import load_calibration  # noqa: E402
from dimr.decoding import DecodeConfig, Decoder  # noqa: E402
from dimr.masks import mask_key  # noqa: E402
from dimr.pairs import get_pair, load_tokenizer  # noqa: E402
from dimr.search import run_search  # noqa: E402
from workers import EvalSpec  # noqa: E402
from workers.local import MaskScorer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-sequences", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument("--skips", default="4,8,12")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    pair = get_pair("smollm2")
    calib = load_calibration(pair.calibration, load_tokenizer(pair), args.num_sequences, args.seq_len)
    scorer = MaskScorer(EvalSpec(pair=pair, input_ids=calib.input_ids, device="cpu"))
    n = scorer.num_layers
    single = [scorer.score(tuple(j != i for j in range(n))) for i in range(n)]
    out = {"calibration": f"{args.num_sequences}x{args.seq_len}", "single_skip_kl": [e.cost for e in single],
           "single_skip_top1": [e.top1_agreement for e in single], "searches": []}
    print("single-skip KL:", [round(e.cost, 3) for e in single], flush=True)
    with tempfile.TemporaryDirectory() as d:
        for k in (int(s) for s in args.skips.split(",")):
            t0 = time.perf_counter()
            r = run_search("smollm2", k, trials=args.trials, storage=f"sqlite:///{d}/card.db",
                           num_sequences=args.num_sequences, seq_len=args.seq_len)
            best = scorer.score(tuple(c == "1" for c in r.best_mask))
            out["searches"].append({"skip": k, "trials": r.complete, "best_mask": r.best_mask, "kl": r.best_cost,
                                    "top1": best.top1_agreement, "one_minus_tv": best.expected_acceptance,
                                    "seconds": time.perf_counter() - t0, "skip_last_kl": scorer.score(
                                        tuple(i < n - k for i in range(n))).cost})
            print(out["searches"][-1], flush=True)
    dec = Decoder.load("smollm2", device="cpu")
    prompts = ["Write a Python function that checks whether a number is prime.", "Describe a quiet harbour at dawn."]
    tokens, seconds = 0, 0.0
    for p in prompts:
        ids = dec.encode(dec.tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                           add_generation_prompt=True))
        t0 = time.perf_counter()
        res = dec.run(ids, "ar", DecodeConfig(max_new_tokens=64))
        seconds += time.perf_counter() - t0
        tokens += len(res.tokens)
    out["ar_tokens_per_s"] = tokens / seconds
    out["mask_skip_last_8"] = mask_key(tuple(i < n - 8 for i in range(n)))
    print(json.dumps(out))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

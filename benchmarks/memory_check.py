"""The scorer's memory against `dimr.memory.estimate`: peak RSS growth of a fresh process that builds a
`MaskScorer` and scores a few masks, on a tiny Llama with a big vocabulary (256000 by default, Gemma-2's).

    python benchmarks/memory_check.py --num-sequences 32 --seq-len 128 --batch-size 4
    python benchmarks/memory_check.py --device cuda   # torch.cuda.max_memory_allocated instead of RSS

Prints the estimate (weights, cache, one evaluation), the measured growth, and what the former scorer kept for
the reference alone (N · T · V float32 log-probs). ``--json``: one JSON line.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _child(args: argparse.Namespace) -> dict:
    import torch

    from dimr import memory
    from dimr.pairs import Pair
    from workers import EvalSpec
    from workers.local import MaskScorer

    torch.set_num_threads(1)
    memory.HEAD_CHUNK_BYTES = args.chunk_mib * 2**20
    pair = Pair("memory-check", args.model, args.model, dtype=args.dtype, local=True)
    ids = torch.randint(0, args.vocab, (args.num_sequences, args.seq_len), generator=torch.Generator().manual_seed(0))
    spec = EvalSpec(pair=pair, input_ids=ids, device=args.device, batch_size=args.batch_size, cache_on_host=False)
    cuda = args.device.startswith("cuda")
    before = torch.cuda.memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    scorer = MaskScorer(spec)
    n = scorer.num_layers
    for k in range(3):
        scorer.score(tuple(i != (k * 3) % n and i != (k * 5 + 1) % n for i in range(n)))
    after = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    plan = scorer.plan
    return {"vocab": args.vocab, "num_sequences": args.num_sequences, "seq_len": args.seq_len,
            "batch_size": args.batch_size, "chunk": scorer.chunk, "weights": plan.weights, "cache": plan.cache,
            "work": plan.work, "estimate": plan.device, "measured": after - before,
            "cache_measured": scorer.cache_bytes(),
            "former_reference": args.num_sequences * args.seq_len * args.vocab * 4}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-sequences", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=256000)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--chunk-mib", type=int, default=16, help="dimr.memory.HEAD_CHUNK_BYTES for the run, in MiB")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--model", help=argparse.SUPPRESS)  # set in the child
    args = ap.parse_args()
    if args.model:
        print(json.dumps(_child(args)))
        return
    from transformers import LlamaConfig, LlamaForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                          num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=max(512, args.seq_len))
        LlamaForCausalLM(cfg).save_pretrained(tmp)
        out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--model", tmp], capture_output=True, text=True)
    if out.returncode:
        sys.exit(out.stderr)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    if args.json:
        print(json.dumps(r))
        return
    mib = 2**20
    print(f"vocab {r['vocab']}, {r['num_sequences']}x{r['seq_len']} tokens, batch {r['batch_size']}, "
          f"head chunk {r['chunk']} tokens")
    print(f"estimate {r['estimate'] / mib:.0f} MiB = weights {r['weights'] / mib:.0f} + cache {r['cache'] / mib:.0f} "
          f"+ one evaluation {r['work'] / mib:.0f}")
    print(f"measured {r['measured'] / mib:.0f} MiB ({r['measured'] / r['estimate']:.2f} of the estimate); "
          f"cache held {r['cache_measured'] / mib:.0f} MiB")
    print(f"the former scorer's reference alone: {r['former_reference'] / mib:.0f} MiB")


if __name__ == "__main__":
    main()

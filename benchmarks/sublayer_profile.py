"""Single-skip KL profile of SmolLM2-135M-Instruct by layer, attention and MLP, with FLOP cost fractions.

    python benchmarks/sublayer_profile.py                 # 4 x 128 tokens of prose + code
    python benchmarks/sublayer_profile.py --num-sequences 16

For every layer ``i``: the KL (nats/token, full || slim) of skipping the whole layer, only its attention
(key char ``m``) and only its MLP (``a``), through prefix reuse. Then masks built from that profile: skip the
``k`` lowest-KL whole layers, attentions or MLPs, with their joint KL and FLOP fraction (``dimr.flops``,
context = the sequence length). First it checks on the real model that a sublayer slim whose layer-0
attention is skipped decodes token by token as its uncached forward does. Prints only; writes nothing.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from dimr.calibration import load_calibration  # noqa: E402
from dimr.divergence import kl_log  # noqa: E402
from dimr.flops import cost_fraction  # noqa: E402
from dimr.gguf import load_smollm2  # noqa: E402
from dimr.masks import SublayerMask  # noqa: E402
from dimr.slim import forward_from, layer_inputs, num_layers, slim_verifier  # noqa: E402
from dimr.zoo import DATA_DIR  # noqa: E402


def skip(n: int, layers: set[int], char: str) -> SublayerMask:
    return SublayerMask.from_key("".join(char if i in layers else "1" for i in range(n)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-sequences", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ks", default="4,8,12", help="how many lowest-KL parts the built masks skip")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    model, tok = load_smollm2()
    n = num_layers(model)
    spec = f"{DATA_DIR / 'smollm2' / 'prose_train.jsonl'},{DATA_DIR / 'heldout_code.jsonl'}"
    ids = load_calibration(spec, tok, args.num_sequences, args.seq_len).input_ids

    with torch.no_grad():
        probe = slim_verifier(model, skip(n, {0, n // 2}, "m"))
        prompt = ids[:1, :24]
        cache = DynamicCache(config=probe.config)
        steps = torch.cat([probe(prompt[:, t:t + 1], cache=cache, use_cache=True).logits
                           for t in range(prompt.shape[1])], 1)
        print(f"cached vs uncached, {probe.config.dimr_mask}: max |diff| "
              f"{(steps - probe(prompt).logits).abs().max().item():.2e}")

        t0 = time.perf_counter()
        hidden = layer_inputs(model, ids)
        ref = torch.log_softmax(forward_from(model, (True,) * n, hidden).float(), -1)
        evals = 0

        def cost(mask: SublayerMask) -> float:
            nonlocal evals
            evals += 1
            logp = torch.log_softmax(forward_from(model, mask, hidden).float(), -1)
            return kl_log(ref, logp).mean().item()

        def frac(mask: SublayerMask) -> float:
            return cost_fraction(model.config, mask, context=args.seq_len)

        profile = {c: [cost(skip(n, {i}, c)) for i in range(n)] for c in "0ma"}
        print(f"\nsingle skips ({args.num_sequences}x{args.seq_len} tokens); KL nats/token; FLOP fraction of "
              f"one skip: layer {1 - frac(skip(n, {0}, '0')):.4f}, attention {1 - frac(skip(n, {0}, 'm')):.4f}, "
              f"MLP {1 - frac(skip(n, {0}, 'a')):.4f}")
        print("layer  whole    attn     mlp")
        for i in range(n):
            print(f"{i:5d}  {profile['0'][i]:.4f}  {profile['m'][i]:.4f}  {profile['a'][i]:.4f}")

        print("\nskip the k lowest single-skip parts:  kind  k  flop_fraction  KL")
        names = {"0": "layer", "m": "attention", "a": "mlp"}
        for k in (int(x) for x in args.ks.split(",")):
            for c in "0ma":
                chosen = set(sorted(range(n), key=profile[c].__getitem__)[:k])
                mask = skip(n, chosen, c)
                print(f"  {names[c]:9s} {k:2d}  {frac(mask):.3f}  {cost(mask):.4f}  {mask.key}")
        print(f"\n{evals} evaluations in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()

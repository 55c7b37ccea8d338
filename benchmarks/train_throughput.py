"""Training throughput of the mini verifier's shape on this CPU: the probes behind the recipe's choices.

    python benchmarks/train_throughput.py            # all five settings, one after the other

Settings (12-layer, 128-wide Llama, vocabulary 4096, batch 8 x 256 tokens, AdamW step included):
1 thread; 2 threads; 2 data-parallel processes x 1 thread (gloo, as ``dimr zoo train-mini``); bf16
autocast on 1 thread; ``torch.compile`` on 1 thread. Prints tokens/s of each and the ratio to 1 thread.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import torch.nn.functional as F

LAYERS, BATCH, SEQ = 12, 8, 256


def _model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=4096, hidden_size=128, intermediate_size=384,
                                        num_hidden_layers=LAYERS, num_attention_heads=4,
                                        num_key_value_heads=4, max_position_embeddings=1024,
                                        tie_word_embeddings=True))


def _steps(model, opt, x, n: int, mode: str) -> float:
    """Seconds for ``n`` training steps on ``x`` after 3 warm-up steps."""
    def loss_of(ids):
        logits = model(input_ids=ids[:, :-1]).logits
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))

    step_loss = torch.compile(loss_of) if mode == "compile" else loss_of
    t0 = 0.0
    for i in range(n + 3):
        if i == 3:
            t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "bf16"):
            loss = step_loss(x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def single(threads: int, mode: str, n: int) -> float:
    torch.set_num_threads(threads)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 4096, (BATCH, SEQ + 1))
    return n * BATCH * SEQ / _steps(model, opt, x, n, mode)


def _rank(rank: int, world: int, store: str, n: int, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    model = torch.nn.parallel.DistributedDataParallel(_model())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 4096, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(0))[rank::world]
    seconds = _steps(model, opt, x, n, "fp32")
    if rank == 0:
        with open(out, "w") as f:
            f.write(str(n * BATCH * SEQ / seconds))
    dist.destroy_process_group()


def data_parallel(world: int, n: int) -> float:
    import torch.multiprocessing as torch_mp

    with tempfile.TemporaryDirectory() as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "out")
        torch_mp.spawn(_rank, args=(world, store, n, out), nprocs=world)
        with open(out) as f:
            return float(f.read())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=15, help="timed steps per setting")
    args = ap.parse_args()
    rows = [("1 process, 1 thread", lambda: single(1, "fp32", args.steps)),
            ("1 process, 2 threads", lambda: single(2, "fp32", args.steps)),
            ("2 processes x 1 thread (DDP, gloo)", lambda: data_parallel(2, args.steps)),
            ("1 thread, bf16 autocast", lambda: single(1, "bf16", args.steps)),
            ("1 thread, torch.compile", lambda: single(1, "compile", args.steps))]
    base = None
    for name, run in rows:
        tok_s = run()
        base = base or tok_s
        print(f"{name:38s} {tok_s:8.0f} tok/s  {tok_s / base:5.2f}x", flush=True)


if __name__ == "__main__":
    main()

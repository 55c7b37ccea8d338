"""Train the SmolLM2 pair's draft by distillation on the verifier's own greedy outputs.

    python -m dimr.zoo.train_draft --seed 0                      # the shipped draft (see --help for the recipe)
    python -m dimr.zoo.train_draft --train-prompts 32 --eval-prompts 16 --steps 60 --no-save   # a pilot

Recipe (one CPU thread throughout):

1. Teacher data. The verifier answers every training prompt (``data/smollm2/prompts_train.jsonl``: code and
   prose requests in its chat template) greedily, in left-padded batches with a KV cache, up to
   ``--max-new-tokens`` tokens. The top-``k`` logits of every position are kept: teacher-forced on the
   prompt (prefill) and the verifier's own choices on the answer. The held-out prompts are answered the same
   way: that text is the evaluation set.
2. Sub-vocabulary: the ``--vocab`` tokens that occur most often in the training sequences (answers weighted
   4x), plus the special tokens. Their share of the held-out answer tokens is reported (``coverage``).
3. Draft: ``--layers`` copied from the verifier (``--frozen`` ones stay fixed and are not shipped), the
   verifier's final norm, the frozen tied embedding as input and, restricted to the sub-vocabulary, as head.
4. Loss per position: soft cross-entropy to the teacher's top-k distribution (renormalised over the
   sub-vocabulary) plus cross-entropy to the teacher's greedy token; answer positions weigh 1,
   prompt positions ``--prompt-weight``. AdamW, linear warm-up, cosine decay, gradient clipping at 1.
5. Every ``--eval-every`` steps: greedy top-1 agreement with the verifier on the held-out answers
   (full-vocabulary argmax of the draft's logits), code and prose separately, against elapsed time.
6. At the end: the cost of a one-token forward with a warm KV cache, draft over verifier, and the files
   in ``dimr/zoo/smollm2/draft`` (weights, ``draft.json``, ``hashes.json``, ``metrics.json`` with the curve).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from dimr.zoo.smollm2_data import SMOLLM2_DATA, read_jsonl


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@torch.inference_mode()
def teacher_generate(model, prompts: list[list[int]], max_new: int, k: int, batch: int, eos: int,
                     pad: int) -> list[dict]:
    """Greedy answers with per-position top-k logits: ``{"ids", "prompt_len", "top_v", "top_i"}`` each.

    ``ids`` = prompt + answer (up to and including EOS); ``top_v``/``top_i`` [len(ids) - 1, k] are the
    verifier's top-k logits at every position but the last (position t predicts token t + 1).
    """
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[dict | None] = [None] * len(prompts)
    t0 = time.time()
    for b0 in range(0, len(order), batch):
        idx = order[b0:b0 + batch]
        seqs = [prompts[i] for i in idx]
        width = max(len(s) for s in seqs)
        x = torch.full((len(seqs), width), pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, s in enumerate(seqs):
            x[r, width - len(s):] = torch.tensor(s)
            mask[r, width - len(s):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=model.config)
        logits = model(input_ids=x, attention_mask=mask, position_ids=pos, past_key_values=cache,
                       use_cache=True).logits.float()
        pv, pi = logits.topk(k, dim=-1)  # [B, W, k]
        del logits
        steps_v, steps_i, tokens = [], [], []
        last_v, last_i = pv[:, -1], pi[:, -1]
        done = torch.zeros(len(seqs), dtype=torch.bool)
        for step in range(max_new):
            nxt = last_i[:, 0]
            tokens.append(nxt)
            done |= nxt == eos
            if bool(done.all()) or step == max_new - 1:
                break
            mask = torch.cat([mask, torch.ones((len(seqs), 1), dtype=torch.long)], dim=1)
            pos = pos[:, -1:] + 1
            lg = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos, past_key_values=cache,
                       use_cache=True).logits[:, -1].float()
            last_v, last_i = lg.topk(k, dim=-1)
            steps_v.append(last_v)
            steps_i.append(last_i)
        toks = torch.stack(tokens, 1)  # [B, T]
        sv = torch.stack(steps_v, 1) if steps_v else pv[:, :0]
        si = torch.stack(steps_i, 1) if steps_i else pi[:, :0]
        for r, i in enumerate(idx):
            n_p = len(seqs[r])
            answer = toks[r].tolist()
            if eos in answer:
                answer = answer[:answer.index(eos) + 1]
            n_a = len(answer)
            # positions: prompt 0..n_p-1 (prefill), then answer tokens 0..n_a-2 (decode steps)
            top_v = torch.cat([pv[r, width - n_p:], sv[r, :n_a - 1]])
            top_i = torch.cat([pi[r, width - n_p:], si[r, :n_a - 1]])
            out[i] = {"ids": torch.tensor(seqs[r] + answer, dtype=torch.int32), "prompt_len": n_p,
                      "top_v": top_v.half(), "top_i": top_i.to(torch.int32)}
        done_n = min(b0 + batch, len(order))
        log(f"teacher: {done_n}/{len(order)} prompts, {time.time() - t0:.0f} s")
    return out  # type: ignore[return-value]


def teacher_data(model, tok, rows: list[dict], args, cache_file: Path) -> list[dict]:
    if cache_file.exists():
        log(f"teacher data from {cache_file}")
        return torch.load(cache_file)
    prompts = [tok(r["text"], add_special_tokens=False)["input_ids"] for r in rows]
    data = teacher_generate(model, prompts, args.max_new_tokens, args.topk, args.gen_batch,
                            tok.convert_tokens_to_ids("<|im_end|>"), tok.pad_token_id)
    for d, r in zip(data, rows, strict=True):
        d["kind"] = r["kind"]
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    torch.save(data, cache_file)
    return data


def choose_vocab(train: list[dict], size: int, vocab: int, special: list[int]) -> torch.Tensor:
    counts = torch.zeros(vocab, dtype=torch.float64)
    for d in train:
        ids = d["ids"].long()
        w = torch.ones(len(ids), dtype=torch.float64)
        w[d["prompt_len"]:] = 4.0
        counts.index_add_(0, ids, w)
        counts.index_add_(0, d["top_i"][:, 0].long(), torch.full((len(ids) - 1,), 0.5, dtype=torch.float64))
    counts[special] = float("inf")
    return counts.topk(size).indices.sort().values


def batches(data: list[dict], batch: int, rng: random.Random):
    while True:
        order = list(range(len(data)))
        rng.shuffle(order)
        for b in range(0, len(order) - batch + 1, batch):
            yield [data[i] for i in order[b:b + batch]]


def collate(items: list[dict], full2sub: torch.Tensor, prompt_weight: float, max_len: int):
    n = min(max(len(d["ids"]) for d in items), max_len)
    k = items[0]["top_i"].shape[1]
    x = torch.zeros((len(items), n), dtype=torch.long)
    tv = torch.zeros((len(items), n, k))
    ti = torch.full((len(items), n, k), -1, dtype=torch.long)
    w = torch.zeros((len(items), n))
    for r, d in enumerate(items):
        ids = d["ids"].long()[-n:]  # keep the answer when a sequence is too long: cut the prompt's start
        cut = len(d["ids"]) - len(ids)
        m = len(ids)
        x[r, :m] = ids
        tv[r, :m - 1] = d["top_v"][cut:cut + m - 1].float()
        ti[r, :m - 1] = full2sub[d["top_i"][cut:cut + m - 1].long()]
        pl = max(d["prompt_len"] - cut, 0)
        w[r, :m - 1] = prompt_weight
        w[r, max(pl - 1, 0):m - 1] = 1.0
    return x, tv, ti, w


def distill_loss(sub_logits: torch.Tensor, tv: torch.Tensor, ti: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    logq = F.log_softmax(sub_logits.float(), dim=-1)
    valid = ti >= 0
    p = torch.softmax(tv.masked_fill(~valid, float("-inf")), dim=-1).nan_to_num(0.0)
    lq = logq.gather(-1, ti.clamp(min=0))
    soft = -(p * lq).sum(-1)
    hard = -(lq[..., 0] * valid[..., 0])
    weight = w * valid[..., 0]
    return ((soft + hard) * weight).sum() / weight.sum().clamp(min=1.0)


@torch.inference_mode()
def agreement(draft, data: list[dict], batch: int = 8) -> dict[str, float]:
    """Greedy top-1 agreement with the verifier on the answer positions, by kind and overall."""
    hits: dict[str, list[int]] = {"code": [0, 0], "prose": [0, 0]}
    for b in range(0, len(data), batch):
        items = data[b:b + batch]
        n = max(len(d["ids"]) for d in items)
        x = torch.zeros((len(items), n), dtype=torch.long)
        for r, d in enumerate(items):
            x[r, :len(d["ids"])] = d["ids"].long()
        logits = draft(input_ids=x).logits
        pred = logits.argmax(-1)
        for r, d in enumerate(items):
            p0, m = d["prompt_len"], len(d["ids"])
            want = d["top_i"][p0 - 1:m - 1, 0].long()
            got = pred[r, p0 - 1:m - 1]
            hits[d["kind"]][0] += int((got == want).sum())
            hits[d["kind"]][1] += len(want)
    out = {k: h / max(n, 1) for k, (h, n) in hits.items()}
    out["all"] = sum(h for h, _ in hits.values()) / max(sum(n for _, n in hits.values()), 1)
    out["tokens"] = sum(n for _, n in hits.values())
    return out


def coverage(data: list[dict], vocab_ids: torch.Tensor, vocab: int) -> float:
    inside = torch.zeros(vocab, dtype=torch.bool)
    inside[vocab_ids] = True
    got = total = 0
    for d in data:
        want = d["top_i"][d["prompt_len"] - 1:, 0].long()
        got += int(inside[want].sum())
        total += len(want)
    return got / max(total, 1)


@torch.inference_mode()
def forward_ms(models: dict, ctx: int = 128, steps: int = 40, rounds: int = 3) -> dict[str, float]:
    """Median wall time (ms) of a one-token forward with a warm KV cache, models measured in turn."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 40000, (ctx + steps,), generator=g)
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            cache = DynamicCache(config=model.config)
            pos = torch.arange(ctx)
            model(input_ids=ids[None, :ctx], position_ids=pos[None], past_key_values=cache, use_cache=True,
                  logits_to_keep=1)
            for i in range(steps):
                p = torch.tensor([ctx + i])
                t = time.perf_counter()
                model(input_ids=ids[None, ctx + i:ctx + i + 1], position_ids=p[None], past_key_values=cache,
                      use_cache=True, logits_to_keep=1)
                times[name].append(time.perf_counter() - t)
    return {name: 1000 * sorted(ts)[len(ts) // 2] for name, ts in times.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="distil the SmolLM2 pair's draft (see the module docstring)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=None, help="teacher-data cache (default $DIMR_HOME/train-draft)")
    ap.add_argument("--layers", default="0,1,2,3,4", help="verifier layers the draft's layers start from")
    ap.add_argument("--frozen", default="0", help="draft layer positions kept fixed (not shipped)")
    ap.add_argument("--vocab", type=int, default=8192, help="sub-vocabulary size of the draft's head")
    ap.add_argument("--pool", type=int, default=0, help="draw from the file's first N training prompts (0 = all)")
    ap.add_argument("--train-prompts", type=int, default=900, help="use N training prompts of the pool (0 = all)")
    ap.add_argument("--eval-prompts", type=int, default=0, help="use N held-out prompts, half code half prose")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--topk", type=int, default=16)
    ap.add_argument("--gen-batch", type=int, default=24)
    ap.add_argument("--steps", type=int, default=700)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=384)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--prompt-weight", type=float, default=0.3)
    ap.add_argument("--prose-repeat", type=int, default=1, help="each epoch sees every prose sequence this often")
    ap.add_argument("--eval-every", type=int, default=70)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--fp32-train", action="store_true", help="train in float32 (default: bfloat16 autocast)")
    ap.add_argument("--fp32-teacher", action="store_true",
                    help="answer the training prompts with the float32 verifier (default: a bfloat16 copy, 2x "
                         "faster; the held-out answers always come from the float32 verifier)")
    ap.add_argument("--out", type=Path, default=None, help="where to write the draft (default dimr/zoo/smollm2/draft)")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args(argv)

    from dimr.gguf import gguf_file_hash, load_smollm2, smollm2_gguf_path
    from dimr.paths import dimr_home
    from dimr.zoo import smollm2_draft

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    t_start = time.time()
    work = args.work or dimr_home() / "train-draft"
    verifier, tok = load_smollm2()
    for p in verifier.parameters():
        p.requires_grad_(False)

    train_rows = read_jsonl(SMOLLM2_DATA / "prompts_train.jsonl")
    if args.pool:
        train_rows = train_rows[:args.pool]
    train_rows = random.Random(1000 + args.seed).sample(train_rows, len(train_rows))
    if args.train_prompts:
        train_rows = train_rows[:args.train_prompts]
    eval_rows = read_jsonl(SMOLLM2_DATA / "prompts_heldout.jsonl")
    if args.eval_prompts:
        half = args.eval_prompts // 2
        eval_rows = [r for r in eval_rows if r["kind"] == "code"][:half] + \
            [r for r in eval_rows if r["kind"] == "prose"][:half]
    tag = f"{gguf_file_hash(smollm2_gguf_path())[:12]}-n{args.max_new_tokens}-k{args.topk}"
    eval_data = teacher_data(verifier, tok, eval_rows, args, work / f"eval-{tag}-{len(eval_rows)}.pt")
    if args.fp32_teacher:
        teacher, ttag = verifier, "fp32"
    else:
        import copy

        teacher, ttag = copy.deepcopy(verifier).to(torch.bfloat16), "bf16"
    train_data = teacher_data(teacher, tok, train_rows, args,
                              work / f"train-{tag}-{ttag}-s{args.seed}-{len(train_rows)}.pt")
    del teacher
    t_teacher = time.time() - t_start
    n_train_tokens = sum(len(d["ids"]) - 1 for d in train_data)
    n_answer_tokens = sum(len(d["ids"]) - d["prompt_len"] for d in train_data)
    log(f"teacher data: {len(train_data)} train sequences ({n_train_tokens} positions, {n_answer_tokens} in "
        f"answers), {len(eval_data)} held-out; {t_teacher:.0f} s")

    vocab = verifier.config.vocab_size
    special = sorted({0, 1, 2, tok.eos_token_id, tok.pad_token_id})
    vocab_ids = choose_vocab(train_data, args.vocab, vocab, special)
    cover = coverage(eval_data, vocab_ids, vocab)
    log(f"sub-vocabulary {len(vocab_ids)}: covers {cover:.4f} of held-out answer tokens")
    full2sub = torch.full((vocab,), -1, dtype=torch.long)
    full2sub[vocab_ids] = torch.arange(len(vocab_ids))

    layers = [int(x) for x in args.layers.split(",")]
    frozen = [int(x) for x in args.frozen.split(",") if x != ""]
    draft = smollm2_draft.build_draft(verifier, layers, vocab_ids)
    for i in frozen:
        for p in draft.model.layers[i].parameters():
            p.requires_grad_(False)
    params = [p for p in draft.parameters() if p.requires_grad]
    log(f"draft layers {layers} (frozen {frozen}); {sum(p.numel() for p in params) / 1e6:.2f}M trained parameters")
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        frac = (step - args.warmup) / max(args.steps - args.warmup, 1)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))

    curve = []
    train_seconds = 0.0
    meta = {"layers": layers, "frozen": frozen, "draft_vocab_size": len(vocab_ids),
            "verifier_gguf_sha256": gguf_file_hash(smollm2_gguf_path())}

    def evaluate(step: int, loss: float | None) -> None:
        draft.eval()
        a = agreement(draft, eval_data)
        row = {"step": step, "train_s": round(train_seconds, 1), "total_s": round(time.time() - t_start, 1),
               "agreement": round(a["all"], 4), "code": round(a["code"], 4), "prose": round(a["prose"], 4),
               "loss": None if loss is None else round(loss, 4)}
        curve.append(row)
        log(f"eval {row}")
        if not args.no_save:  # the latest draft and curve, in case the run is stopped early
            smollm2_draft.save_shipped(draft, meta, work / "latest")
            (work / "latest" / "curve.json").write_text(json.dumps(curve, indent=1) + "\n")
        draft.train()

    evaluate(0, None)
    pool = [d for d in train_data for _ in range(args.prose_repeat if d["kind"] == "prose" else 1)]
    it = batches(pool, args.batch, rng)
    running = None
    draft.train()
    for step in range(1, args.steps + 1):
        t0 = time.time()
        x, tv, ti, w = collate(next(it), full2sub, args.prompt_weight, args.max_len)
        for g in opt.param_groups:
            g["lr"] = lr_at(step - 1)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not args.fp32_train):
            hidden = draft.model(input_ids=x).last_hidden_state
            sub_logits = draft.lm_head.sub_logits(hidden)
        loss = distill_loss(sub_logits, tv, ti, w)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        train_seconds += time.time() - t0
        value = float(loss.detach())
        running = value if running is None else 0.95 * running + 0.05 * value
        if step % 20 == 0:
            log(f"step {step}/{args.steps} loss {running:.4f} lr {lr_at(step - 1):.2e} "
                f"({train_seconds / step:.2f} s/step)")
        if step % args.eval_every == 0 or step == args.steps:
            evaluate(step, running)
    draft.eval()

    costs = forward_ms({"verifier": verifier, "draft": draft})
    ratio = costs["draft"] / costs["verifier"]
    log(f"one-token forward (warm cache, {args.threads} thread): verifier {costs['verifier']:.2f} ms, "
        f"draft {costs['draft']:.2f} ms, ratio {ratio:.3f}")
    final = curve[-1]
    metrics = {
        "agreement": final["agreement"], "agreement_code": final["code"], "agreement_prose": final["prose"],
        "eval_answer_tokens": agreement(draft, eval_data)["tokens"], "eval_prompts": len(eval_data),
        "sub_vocab_coverage": round(cover, 4),
        "forward_ms": {k: round(v, 3) for k, v in costs.items()}, "cost_ratio": round(ratio, 4),
        "teacher_seconds": round(t_teacher, 1), "train_seconds": round(train_seconds, 1),
        "total_seconds": round(time.time() - t_start, 1),
        "train_sequences": len(train_data), "train_positions": n_train_tokens, "train_answer_tokens": n_answer_tokens,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "curve": curve,
    }
    log(json.dumps({k: v for k, v in metrics.items() if k != "curve"}))
    if not args.no_save:
        out = args.out or smollm2_draft.DRAFT_DIR
        smollm2_draft.save_shipped(draft, meta, out)
        (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
        log(f"wrote {out}")


if __name__ == "__main__":
    main()

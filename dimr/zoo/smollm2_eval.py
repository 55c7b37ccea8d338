"""Measurements on the SmolLM2 pair (one CPU thread, float32, as the decoder runs it).

    python -m dimr.zoo.smollm2_eval draft   # the shipped draft: agreement (code / prose) and cost ratio
    python -m dimr.zoo.smollm2_eval task    # the verifier's accuracy on data/smollm2/task_addition.jsonl

``draft`` loads the draft through :func:`dimr.zoo.smollm2_draft.load_draft` (the bfloat16 shipped weights,
assembled under ``$DIMR_HOME``), answers the held-out prompts greedily with the verifier (cached under
``$DIMR_HOME/train-draft``, the same cache as :mod:`dimr.zoo.train_draft`) and writes ``eval.json`` beside
the draft. ``task`` writes ``task.json`` there.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from dimr.zoo.smollm2_data import SMOLLM2_DATA, read_jsonl, task_answer


def _args(**kw) -> argparse.Namespace:
    base = {"max_new_tokens": 128, "topk": 16, "gen_batch": 24}
    base.update(kw)
    return argparse.Namespace(**base)


def eval_draft(work: Path | None = None, out: Path | None = None) -> dict:
    from dimr.gguf import gguf_file_hash, load_smollm2, smollm2_gguf_path
    from dimr.paths import dimr_home
    from dimr.zoo import smollm2_draft
    from dimr.zoo.train_draft import agreement, coverage, forward_ms, teacher_data

    work = work or dimr_home() / "train-draft"
    verifier, tok = load_smollm2()
    rows = read_jsonl(SMOLLM2_DATA / "prompts_heldout.jsonl")
    args = _args()
    tag = f"{gguf_file_hash(smollm2_gguf_path())[:12]}-n{args.max_new_tokens}-k{args.topk}"
    data = teacher_data(verifier, tok, rows, args, work / f"eval-{tag}-{len(rows)}.pt")
    t0 = time.time()
    draft = smollm2_draft.load_draft()
    load_s = time.time() - t0
    a = agreement(draft, data)
    costs = forward_ms({"verifier": verifier, "draft": draft})
    result = {
        "agreement": round(a["all"], 4), "agreement_code": round(a["code"], 4),
        "agreement_prose": round(a["prose"], 4), "eval_answer_tokens": a["tokens"], "eval_prompts": len(data),
        "sub_vocab_coverage": round(coverage(data, draft.lm_head.vocab_ids, draft.config.vocab_size), 4),
        "forward_ms": {k: round(v, 3) for k, v in costs.items()},
        "cost_ratio": round(costs["draft"] / costs["verifier"], 4),
        "load_seconds": round(load_s, 2), "threads": torch.get_num_threads(),
        "what": "shipped (bfloat16) draft in float32; greedy top-1 agreement with the float32 verifier on its "
                "greedy answers (<= 128 tokens) to the held-out prompts; one-token forwards, warm KV cache "
                "(128 tokens), median of 3x40",
    }
    out = out or smollm2_draft.DRAFT_DIR / "eval.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


@torch.inference_mode()
def eval_task(path: Path = SMOLLM2_DATA / "task_addition.jsonl", max_new: int = 96, batch: int = 20,
              out: Path | None = None, task_max: int | None = None) -> dict:
    """Greedy answers of the verifier to the task's chat prompts; accuracy of the last integer.

    With ``task_max`` the items are generated afresh (numbers 2..task_max) instead of read from ``path``.
    """
    from dimr.gguf import load_smollm2
    from dimr.zoo import smollm2_draft
    from dimr.zoo.smollm2_data import addition_problems, chat
    from dimr.zoo.train_draft import teacher_generate

    verifier, tok = load_smollm2()
    if task_max is None:
        rows = read_jsonl(path)
    else:
        rows = [{**p, "text": chat(tok, p["question"])} for p in addition_problems(13, 60, task_max)]
        path = Path(f"addition_problems(13, 60, {task_max})")
    prompts = [tok(r["text"], add_special_tokens=False)["input_ids"] for r in rows]
    gen = teacher_generate(verifier, prompts, max_new, 1, batch, tok.convert_tokens_to_ids("<|im_end|>"),
                           tok.pad_token_id)
    answers = [tok.decode(g["ids"][g["prompt_len"]:], skip_special_tokens=True) for g in gen]
    correct = [task_answer(a) == r["answer"] for a, r in zip(answers, rows, strict=True)]
    result = {"file": path.name, "items": len(rows), "accuracy": round(sum(correct) / len(rows), 4),
              "max_new_tokens": max_new,
              "checker": "integer after the first ####, else the last integer (smollm2_data.task_answer)",
              "items_detail": [{"question": r["question"], "answer": r["answer"], "completion": a, "correct": c}
                               for r, a, c in zip(rows, answers, correct, strict=True)]}
    out = out or smollm2_draft.DRAFT_DIR.parent / (f"task-max{task_max}.json" if task_max else "task.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="measure the SmolLM2 pair")
    ap.add_argument("what", choices=["draft", "task"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--task-max", type=int, default=None, help="task: fresh items with numbers up to this")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = eval_draft(args.work) if args.what == "draft" else eval_task(task_max=args.task_max)
    print(json.dumps({k: v for k, v in result.items() if k != "items_detail"}, indent=1))


if __name__ == "__main__":
    main()

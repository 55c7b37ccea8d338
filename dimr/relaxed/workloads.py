"""The held-out workloads of ``dimr bench-relaxed``, chosen from what each pair ships (``dimr/zoo/data``).

``mini`` (and every pair without data of its own): ``arithmetic`` (the mini task's held-out word problems with
worked steps; quality = exact match) and ``code`` (HumanEval prompts; quality = log-likelihood).

``smollm2`` (``dimr/zoo/data/smollm2``):

- ``instruct``: the held-out written instructions and prose requests of ``prompts_heldout.jsonl`` (kind
  ``prose``), in SmolLM2's chat template; quality = the full verifier's log-likelihood per output token;
- ``task``: the addition word problems of ``task_addition.jsonl``, in the chat template; quality = exact match
  of the answer (:func:`dimr.zoo.smollm2_data.task_answer`);
- ``code``: code continuation, raw Python (no template) from the held-out standard-library files of the
  pair's calibration set (``heldout_code.jsonl``, never seen by the draft's distillation): the second piece
  of about 500 characters of each file (past its header), files of at least 200 characters; quality =
  log-likelihood.

Log-likelihood is Σ log p_full(y_t | ·) / T at temperature 1 over one output: "how likely the verifier finds
what was written", a quality for free text that needs no reference answer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dimr.errors import DimrError

DEFAULT_WORKLOADS = ("arithmetic", "code")
PAIR_WORKLOADS = {"smollm2": ("instruct", "task", "code")}
EXACT = ("arithmetic", "task")  # workloads whose quality is exact-match accuracy; the others use log-likelihood
WORKLOADS = ("arithmetic", "code", "instruct", "task")
DEFAULTS = {  # (prompts, max new tokens) per pair family and workload
    "default": {"arithmetic": (40, 96), "code": (16, 64)},
    "smollm2": {"instruct": (40, 96), "task": (40, 96), "code": (40, 64)},
}


@dataclass
class Workload:
    name: str
    prompts: list[str]
    answers: list[int | None]
    max_new_tokens: int
    metric: str = "loglik"  # "exact" (accuracy) or "loglik"


def family(pair: str) -> str:
    return pair if pair in PAIR_WORKLOADS else "default"


def workloads_for(pair: str) -> tuple[str, ...]:
    """The workloads ``pair`` has data for."""
    return PAIR_WORKLOADS.get(pair, DEFAULT_WORKLOADS)


def check_workloads(pair: str, names: list[str]) -> list[str]:
    """``names`` if ``pair`` has them all, else a :class:`DimrError` naming the ones it has."""
    have = workloads_for(pair)
    bad = [n for n in names if n not in have]
    if not names or bad:
        raise DimrError(f"pair {pair!r} has the workloads {', '.join(have)}; --workloads takes some of them"
                        + (f" (not {', '.join(bad)})" if bad else ""))
    return names


def load_workload(name: str, n: int | None = None, max_new_tokens: int | None = None, data_dir: Path | None = None,
                  pair: str = "mini") -> Workload:
    """The first ``n`` held-out prompts of workload ``name`` of ``pair`` (defaults: :data:`DEFAULTS`)."""
    from dimr.zoo import DATA_DIR, task

    fam = family(pair)
    if name not in workloads_for(pair):
        check_workloads(pair, [name])
    n_default, tokens_default = DEFAULTS[fam][name]
    n = n or n_default
    max_new_tokens = max_new_tokens or tokens_default
    data_dir = data_dir or DATA_DIR
    metric = "exact" if name in EXACT else "loglik"
    if fam == "smollm2":
        from dimr.zoo.smollm2_data import read_jsonl

        if name == "instruct":
            rows = [r for r in read_jsonl(data_dir / "smollm2" / "prompts_heldout.jsonl") if r["kind"] == "prose"]
            return Workload(name, [r["text"] for r in rows[:n]], [None] * len(rows[:n]), max_new_tokens, metric)
        if name == "task":
            rows = read_jsonl(data_dir / "smollm2" / "task_addition.jsonl")[:n]
            return Workload(name, [r["text"] for r in rows], [int(r["answer"]) for r in rows], max_new_tokens,
                            metric)
        return Workload(name, code_prefixes(data_dir / "heldout_code.jsonl", n), [None] * n, max_new_tokens, metric)
    if name == "arithmetic":
        path = data_dir / "heldout_task.jsonl"
        if path.is_file():
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()][:n]
        else:  # the generator with the held-out seed of the mini recipe
            rows = [{"prompt": p.prompt, "answer": p.answer} for p in task.generate(1235, n)]
        return Workload(name, [r["prompt"] for r in rows], [int(r["answer"]) for r in rows], max_new_tokens, metric)
    rows = [json.loads(line) for line in (data_dir / "humaneval_prompts.jsonl").read_text().splitlines()
            if line.strip()][:n]
    return Workload(name, [r.get("text") or r["prompt"] for r in rows], [None] * len(rows), max_new_tokens, metric)


def code_prefixes(path: Path, n: int, max_chars: int = 500, min_chars: int = 200) -> list[str]:
    """Up to ``n`` code prefixes: the second ``max_chars`` piece (the first if there is one) of each file."""
    from dimr.zoo.corpus import chunk

    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        text = json.loads(line)["text"]
        if len(text) < min_chars:
            continue
        pieces = [p for p in chunk(text, max_chars) if len(p.strip()) >= 80]
        if pieces:
            out.append(pieces[min(1, len(pieces) - 1)])
        if len(out) == n:
            break
    return out


def checker(workload: Workload) -> Callable[[str, int | None], float]:
    """(output text, answer) → 1.0/0.0 for exact-match workloads, NaN for the others."""
    if workload.name == "arithmetic":
        from dimr.zoo.task import is_correct

        return lambda text, answer: float(is_correct(text, answer))
    if workload.name == "task":
        from dimr.zoo.smollm2_data import task_answer

        return lambda text, answer: float(task_answer(text) == answer)
    return lambda text, answer: math.nan

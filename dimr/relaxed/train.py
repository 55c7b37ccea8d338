"""Train a DIVERSED head for a pair on a task: ``dimr diversed train --pair mini --task arithmetic``.

Tasks (the reward is sequence-level, as in the paper):

- ``arithmetic``: the mini pair's word problems (``dimr.zoo.task``), training prompts drawn with a seed disjoint
  from the held-out set; reward 1 if the answer after ``####`` is right, else 0 (like GSM8K's); with
  ``exact+steps`` plus the share of correct worked steps (dense, for pairs whose exact match is rare).
- ``addition`` (``smollm2``): the pair's single-step addition word problems in its chat template, training
  problems drawn with a seed of their own and never one of the held-out ``task_addition.jsonl`` questions;
  reward 1 if the answer (:func:`dimr.zoo.smollm2_data.task_answer`) is right, else 0; with ``exact+sum`` plus
  1 if the right sum appears anywhere in the answer (partial credit: a 0/1 reward the rollouts never earn
  teaches nothing);
- ``toy-draft`` / ``toy-full``: a dense toy reward that favours the draft (resp. the full verifier): the share
  of rollout tokens that are that model's greedy choice. Used by the tests; it shows which way w moves.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from dimr.errors import DimrError
from dimr.relaxed.diversed import (
    EnsembleHead,
    RewardFn,
    TrainConfig,
    TrainLog,
    rollout,
    save_head,
    train_head,
    w_by_token_type,
)

TASKS = ("arithmetic", "addition", "toy-draft", "toy-full")
PAIR_TASK = {"smollm2": "addition"}  # a pair's own verifiable task; arithmetic for the others
REWARDS = {"arithmetic": ("exact", "exact+steps"), "addition": ("exact", "exact+sum")}  # per task; others: exact
TRAIN_SEED = 4321  # problem generator seed for training prompts (held-out problems are excluded)
REPORT_PROMPTS = 8  # held-out prompts the trained head is rolled out on for its w-by-token-type report


def agreement_reward(model, prompts: list[Tensor]) -> RewardFn:
    """R = share of rollout tokens that are ``model``'s own greedy choice given the rollout's prefix."""
    @torch.no_grad()
    def reward(i: int, tokens: Tensor) -> float:
        if tokens.numel() == 0:
            return 0.0
        ids = torch.cat([prompts[i], tokens])[None]
        logits = model(input_ids=ids, logits_to_keep=tokens.numel() + 1).logits[0, :-1]
        return float((logits.argmax(-1) == tokens).float().mean())

    return reward


def default_task(pair: str) -> str:
    return PAIR_TASK.get(pair, "arithmetic")


def check_task(task: str, reward_kind: str) -> None:
    """One line (DimrError) for an unknown task, or a reward the task does not offer."""
    if task not in TASKS:
        raise DimrError(f"unknown task {task!r}; use one of {', '.join(TASKS)}")
    kinds = REWARDS.get(task, ("exact",))
    if reward_kind not in kinds:
        raise DimrError(f"unknown reward {reward_kind!r} for task {task}; use {' or '.join(kinds)}")


def task_setup(task: str, tokenizer, draft, full, n_prompts: int, device: torch.device, reward_kind: str = "exact"
               ) -> tuple[list[Tensor], RewardFn, list[Tensor]]:
    """Training prompts (token ids), the reward for ``task`` (``reward_kind``: one of :data:`REWARDS`) and a few
    held-out prompts for the report."""
    check_task(task, reward_kind)

    def encode(texts: list[str]) -> list[Tensor]:
        return [tokenizer(t, return_tensors="pt", add_special_tokens=False).input_ids[0].to(device) for t in texts]

    if task == "addition":
        from dimr.zoo.smollm2_data import SMOLLM2_DATA, addition_problems, chat, integers, read_jsonl, task_answer

        held = read_jsonl(SMOLLM2_DATA / "task_addition.jsonl")
        exclude = {r["question"] for r in held}
        problems = [p for p in addition_problems(TRAIN_SEED, 2 * n_prompts + len(held))
                    if p["question"] not in exclude][:n_prompts]
        if len(problems) < n_prompts:
            raise DimrError(f"only {len(problems)} distinct addition problems outside the held-out set; "
                            "pass fewer --prompts")

        def reward(i: int, tokens: Tensor) -> float:
            text, answer = tokenizer.decode(tokens, skip_special_tokens=True), problems[i]["answer"]
            exact = float(task_answer(text) == answer)
            return exact + (float(answer in integers(text)) if reward_kind == "exact+sum" else 0.0)

        return encode([chat(tokenizer, p["question"]) for p in problems]), reward, encode(
            [r["text"] for r in held[:REPORT_PROMPTS]])
    if task == "arithmetic":
        from dimr.relaxed.bench import step_accuracy
        from dimr.relaxed.workloads import load_workload
        from dimr.zoo import task as arithmetic

        held_out = load_workload("arithmetic", 10_000)
        problems = arithmetic.generate(TRAIN_SEED, n_prompts, exclude=set(held_out.prompts))

        def reward(i: int, tokens: Tensor) -> float:
            text = tokenizer.decode(tokens, skip_special_tokens=True)
            exact = float(arithmetic.is_correct(text, problems[i].answer))
            return exact + (step_accuracy(text) if reward_kind == "exact+steps" else 0.0)

        return ([tokenizer(p.prompt, return_tensors="pt").input_ids[0].to(device) for p in problems], reward,
                [tokenizer(p, return_tensors="pt").input_ids[0].to(device) for p in held_out.prompts[:REPORT_PROMPTS]])
    texts = [f"Line {k}: the quick brown fox {k * 7 % 13} jumps" for k in range(n_prompts)]
    prompts = [tokenizer(t, return_tensors="pt").input_ids[0].to(device) for t in texts]
    return prompts, agreement_reward(draft if task == "toy-draft" else full, prompts), prompts[:REPORT_PROMPTS]


def train_for_pair(pair: str, task: str | None, out: Path, config: TrainConfig, n_prompts: int = 256,
                   device: str | None = None, pairs_file: Path | None = None, reward_kind: str = "exact",
                   progress: Callable[[int, TrainLog], None] | None = None
                   ) -> tuple[EnsembleHead, TrainLog, Path, dict]:
    """Load ``pair``, train a head on ``task`` (None: the pair's own) and save it (safetensors + fingerprinted JSON)
    at ``out``; the JSON also holds the trained head's w by token type on held-out rollouts, returned last."""
    from dimr.decoding import Decoder
    from dimr.decoding.sampling import Sampler

    task = task or default_task(pair)
    check_task(task, reward_kind)  # before the models load
    dec = Decoder.load(pair, device=device, pairs_file=pairs_file)
    draft, full = dec.draft.model, dec.full.model
    prompts, reward, report = task_setup(task, dec.tokenizer, draft, full, n_prompts, dec.device, reward_kind)
    head, log = train_head(draft, full, prompts, reward, config, eos=dec.eos_token_ids(), progress=progress)
    sampler = Sampler(config.temperature, config.top_p)
    generator = torch.Generator(device=full.device).manual_seed(config.seed + 1)
    pad = full.config.pad_token_id if full.config.pad_token_id is not None else 0
    rolls = rollout(head, draft, full, report, sampler, config.max_new_tokens, generator, dec.eos_token_ids(), pad)
    by_type = w_by_token_type(head, draft, full, report, rolls, dec.tokenizer, sampler)
    path = save_head(head, out, pair=pair, draft=draft, full=full, task=task, config=config, log=log,
                     extra={"n_prompts": n_prompts, "reward": reward_kind, "w_by_token_type": by_type,
                            "w_report_prompts": len(report)})
    return head, log, path, by_type

"""Train a DIVERSED head for a pair on a task: ``dimr diversed train --pair mini --task arithmetic``.

Tasks (the reward is sequence-level, as in the paper):

- ``arithmetic``: the mini pair's word problems (``dimr.zoo.task``), training prompts drawn with a seed disjoint
  from the held-out set; reward 1 if the answer after ``####`` is right, else 0 (like GSM8K's); with
  ``exact+steps`` plus the share of correct worked steps (dense, for pairs whose exact match is rare).
- ``toy-draft`` / ``toy-full``: a dense toy reward that favours the draft (resp. the full verifier): the share
  of rollout tokens that are that model's greedy choice. Used by the tests; it shows which way w moves.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from dimr.errors import DimrError
from dimr.relaxed.diversed import EnsembleHead, RewardFn, TrainConfig, TrainLog, save_head, train_head

TASKS = ("arithmetic", "toy-draft", "toy-full")
REWARDS = ("exact", "exact+steps")
TRAIN_SEED = 4321  # problem generator seed for training prompts (held-out problems are excluded)


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


def task_setup(task: str, tokenizer, draft, full, n_prompts: int, device: torch.device, reward_kind: str = "exact"
               ) -> tuple[list[Tensor], RewardFn]:
    """Training prompts (token ids) and the reward for ``task`` (arithmetic: ``exact`` or ``exact+steps``)."""
    if task not in TASKS:
        raise DimrError(f"unknown task {task!r}; use one of {', '.join(TASKS)}")
    if task == "arithmetic":
        from dimr.relaxed.bench import step_accuracy
        from dimr.relaxed.workloads import load_workload
        from dimr.zoo import task as arithmetic

        held = set(load_workload("arithmetic", 10_000).prompts)
        problems = arithmetic.generate(TRAIN_SEED, n_prompts, exclude=held)
        prompts = [tokenizer(p.prompt, return_tensors="pt").input_ids[0].to(device) for p in problems]

        if reward_kind not in REWARDS:
            raise DimrError(f"unknown reward {reward_kind!r}; use one of {', '.join(REWARDS)}")

        def reward(i: int, tokens: Tensor) -> float:
            text = tokenizer.decode(tokens, skip_special_tokens=True)
            exact = float(arithmetic.is_correct(text, problems[i].answer))
            return exact + (step_accuracy(text) if reward_kind == "exact+steps" else 0.0)

        return prompts, reward
    texts = [f"Line {k}: the quick brown fox {k * 7 % 13} jumps" for k in range(n_prompts)]
    prompts = [tokenizer(t, return_tensors="pt").input_ids[0].to(device) for t in texts]
    return prompts, agreement_reward(draft if task == "toy-draft" else full, prompts)


def train_for_pair(pair: str, task: str, out: Path, config: TrainConfig, n_prompts: int = 256,
                   device: str | None = None, pairs_file: Path | None = None, reward_kind: str = "exact",
                   progress: Callable[[int, TrainLog], None] | None = None) -> tuple[EnsembleHead, TrainLog, Path]:
    """Load ``pair``, train a head on ``task`` and save it (safetensors + fingerprinted JSON) at ``out``."""
    from dimr.decoding import Decoder

    dec = Decoder.load(pair, device=device, pairs_file=pairs_file)
    draft, full = dec.draft.model, dec.full.model
    prompts, reward = task_setup(task, dec.tokenizer, draft, full, n_prompts, dec.device, reward_kind)
    head, log = train_head(draft, full, prompts, reward, config, eos=dec.eos_token_ids(), progress=progress)
    path = save_head(head, out, pair=pair, draft=draft, full=full, task=task, config=config, log=log,
                     extra={"n_prompts": n_prompts, "reward": reward_kind})
    return head, log, path

"""DIVERSED on the real pair: the addition task's training set is disjoint from the held-out one, and a few
REINFORCE steps on smollm2 (offline, under a minute) train, save and report w by token type."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from dimr import gguf
from dimr.relaxed.diversed import TOKEN_TYPES, TrainConfig
from dimr.relaxed.train import task_setup, train_for_pair
from dimr.zoo.smollm2_data import SMOLLM2_DATA, read_jsonl

pytestmark = pytest.mark.skipif(importlib.util.find_spec(gguf.SMOLLM2_MODULE) is None,
                                reason=f"needs the GGUF file: {gguf.INSTALL_HINT}")


def test_addition_training_prompts_exclude_the_held_out_problems():
    from dimr.pairs import get_pair, load_tokenizer

    tok = load_tokenizer(get_pair("smollm2"))
    prompts, reward, report = task_setup("addition", tok, None, None, 200, torch.device("cpu"))
    held = {r["question"] for r in read_jsonl(SMOLLM2_DATA / "task_addition.jsonl")}
    texts = [tok.decode(p) for p in prompts]
    assert len(set(texts)) == 200 and not any(q in t for t in texts for q in held)
    assert all(t.startswith("<|im_start|>system") and t.endswith("<|im_start|>assistant\n") for t in texts)
    assert len(report) == 8 and any(q in tok.decode(report[0]) for q in held)  # the report uses held-out items
    question = texts[0].split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
    a, b = (int(w) for w in question.split() if w.isdigit())
    right, wrong = (tok(f"{a} + {b} = {s}.", return_tensors="pt").input_ids[0] for s in (a + b, a + b + 1))
    assert reward(0, right) == 1.0 and reward(0, wrong) == 0.0
    _, partial, _ = task_setup("addition", tok, None, None, 200, torch.device("cpu"), reward_kind="exact+sum")
    said, drifted = (tok(f"{a} + {b} = {a + b}. Then {t}", return_tensors="pt").input_ids[0] for t in ("", 7))
    assert partial(0, right) == 2.0 and partial(0, wrong) == 0.0  # right and ends on it / never says it
    assert partial(0, drifted) == 1.0 and reward(0, drifted) == 0.0  # says the sum, then drifts to another number
    assert partial(0, said) == 2.0


def test_diversed_trains_on_smollm2_in_a_few_steps(tmp_path):
    config = TrainConfig(steps=2, batch=2, max_new_tokens=8, temperature=0.0, lam=0.05, seed=0)
    head, log, path, by_type = train_for_pair("smollm2", None, tmp_path / "head.safetensors", config, n_prompts=4)
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["task"] == "addition" and meta["pair"] == "smollm2" and len(log.rewards) == 2
    assert head.linear.weight.abs().sum() > 0  # it moved from the 0.5/0.5 start
    assert set(by_type) <= set(TOKEN_TYPES) and sum(d["n"] for d in by_type.values()) > 0
    for d in by_type.values():
        assert 0 <= d["q10"] <= d["q50"] <= d["q90"] <= 1 and 0 <= d["mean"] <= 1
    assert meta["w_by_token_type"] == json.loads(json.dumps(by_type))

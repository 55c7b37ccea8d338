"""The SmolLM2 pair's shipped data: hashes, splits, chat template, task checker."""

import hashlib
import json

from dimr.zoo import smollm2_data as sd

DATA = sd.SMOLLM2_DATA


def test_shipped_files_match_their_hashes():
    want = json.loads((DATA / "hashes.json").read_text())
    assert {"prompts_train.jsonl", "prompts_heldout.jsonl", "prose_train.jsonl", "prose_heldout.jsonl",
            "task_addition.jsonl", "sources.json"} <= set(want)
    for name, digest in want.items():
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == digest, name
    assert sum((DATA / name).stat().st_size for name in want) < 2e6


def test_heldout_prompts_are_chat_prompts_and_not_trained_on():
    heldout = sd.read_jsonl(DATA / "prompts_heldout.jsonl")
    train = sd.read_jsonl(DATA / "prompts_train.jsonl")
    for kind in ("code", "prose"):
        assert sum(r["kind"] == kind for r in heldout) >= 40
    assert not {r["prompt"] for r in heldout} & {r["prompt"] for r in train}
    for r in heldout + train[:20]:
        assert r["text"].startswith("<|im_start|>system\n")
        assert r["text"].endswith(f"<|im_start|>user\n{r['prompt']}<|im_end|>\n<|im_start|>assistant\n")


def test_prose_split_is_disjoint():
    train = {r["text"] for r in sd.read_jsonl(DATA / "prose_train.jsonl")}
    heldout = {r["text"] for r in sd.read_jsonl(DATA / "prose_heldout.jsonl")}
    assert len(heldout) >= 40 and len(train) > len(heldout) and not train & heldout


def test_botchan_parsing():
    raw = ("Project Gutenberg's Botchan\n*** START OF THIS PROJECT GUTENBERG EBOOK BOTCHAN ***\nProduced by X\n"
           "A NOTE\nCHAPTER I\nBecause of an hereditary\nrecklessness, I jumped.\nCHAPTER II.\nThe end came.\n"
           "*** END OF THIS PROJECT GUTENBERG EBOOK BOTCHAN ***\nlicence text")
    text = sd.botchan_text(raw)
    assert text == ("CHAPTER I\n\nBecause of an hereditary recklessness, I jumped.\n\nCHAPTER II.\n\n"
                    "The end came.\n")
    assert sd.prose_chunks(text, 30) == ["Because of an hereditary recklessness, I jumped.", "The end came."]


def test_task_items_and_checker():
    rows = sd.read_jsonl(DATA / "task_addition.jsonl")
    assert len(rows) >= 40 and len({r["question"] for r in rows}) == len(rows)
    assert rows == [{**p, "text": r["text"]} for p, r in zip(sd.addition_problems(13, len(rows)), rows,
                                                             strict=True)]
    assert sd.task_answer("36 + 21 = 57. So Mia has 57 marbles.") == 57
    assert sd.task_answer("The answer is 1,024.") == 1024
    assert sd.task_answer("no number") is None
    assert sd.integers("3 + 1,024 = 1,027, not -2.") == [3, 1024, 1027, -2] and sd.integers("none") == []
    assert sd.task_answer("30 + 84 = 114.\n#### 114\nLena has 114 books.\n#### 2") == 114

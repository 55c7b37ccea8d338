"""The shipped mini pair: offline loading and shapes, the task's answer checker, the recorded hashes."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
import torch

from dimr import zoo
from dimr.zoo import corpus, task
from dimr.zoo import train_mini as tm

# The documented shapes (docs/mini.md).
VERIFIER_SHAPE = {"model_type": "llama", "num_hidden_layers": 12, "hidden_size": 128,
                  "intermediate_size": 384, "num_attention_heads": 4, "vocab_size": 4096}
DRAFT_SHAPE = {"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 128,
               "intermediate_size": 384, "num_attention_heads": 4, "vocab_size": 4096}


# --- the task -----------------------------------------------------------------------------------

@pytest.mark.parametrize("completion, answer", [
    (" 3*7=21. 36+21: 6+1=7, 3+2=5, so 57. #### 57", 57),
    ("#### 0", 0),
    ("####12", 12),
    ("#### 103\nQ: next problem #### 5", 103),
    ("so 57. ####  57 apples", 57),
])
def test_checker_accepts(completion, answer):
    assert task.is_correct(completion, answer)


@pytest.mark.parametrize("completion, answer", [
    ("so 57.", 57),                       # no final answer marker
    ("#### 5", 57),                       # prefix of the answer
    ("#### 570", 57),                     # longer number
    ("#### 75", 57),                      # digits reversed
    ("#### 58 #### 57", 57),              # only the first marker counts
    ("", 0),
])
def test_checker_rejects(completion, answer):
    assert not task.is_correct(completion, answer)


def test_extract_answer():
    assert task.extract_answer("A: 9-3=6 #### 6") == 6
    assert task.extract_answer("#### -4") == -4
    assert task.extract_answer("no answer") is None


def test_worked_steps_by_hand():
    assert task.add_steps(36, 21) == "36+21: 6+1=7, 3+2=5, so 57."
    assert task.add_steps(47, 38) == "47+38: 7+8=15, 4+3+1=8, so 85."
    assert task.add_steps(87, 38) == "87+38: 7+8=15, 8+3+1=12, so 125."
    assert task.add_steps(126, 8) == "126+8: 6+8=14, 2+0+1=3, 1+0=1, so 134."
    assert task.sub_steps(52, 27) == "52-27: 12-7=5, 4-2=2, so 25."
    assert task.sub_steps(105, 98) == "105-98: 15-8=7, 9-9=0, 0-0=0, so 7."
    with pytest.raises(ValueError):
        task.sub_steps(3, 4)


def test_generated_solutions_are_right():
    """Every equation in 300 generated solutions holds, and the final answer is the checked one."""
    for p in task.generate(7, 300):
        assert p.prompt.startswith("Q: ") and p.prompt.endswith("\nA:")
        assert task.is_correct(p.solution, p.answer) and p.answer >= 0
        for lhs, rhs in re.findall(r"([\d+\-*]+)=(\d+)", p.solution):
            assert eval(lhs) == int(rhs), (lhs, rhs, p.solution)  # digits and + - * only
        for a, op, b, res in re.findall(r"(\d+)([+-])(\d+): [^#]*?so (\d+)\.", p.solution):
            assert (int(a) + int(b) if op == "+" else int(a) - int(b)) == int(res)
    assert len({p.prompt for p in task.generate(7, 300)}) == 300


def test_generate_is_seeded_and_excludes():
    a, b = task.generate(3, 50), task.generate(3, 50)
    assert a == b
    held = {p.prompt for p in a[:10]}
    assert not held & {p.prompt for p in task.generate(3, 50, exclude=held)}


# --- the shipped files ----------------------------------------------------------------------------

def test_pair_is_registered_and_loads_offline():
    from dimr.pairs import get_pair, load_model, load_tokenizer

    pair = get_pair("mini")
    assert pair.local and pair.dtype == "float32"
    assert pair.calibration == str(zoo.DATA_DIR / "heldout_code.jsonl")
    tok = load_tokenizer(pair)
    verifier, draft = load_model(pair, "verifier", "cpu"), load_model(pair, "draft", "cpu")
    for model, shape in ((verifier, VERIFIER_SHAPE), (draft, DRAFT_SHAPE)):
        cfg = model.config.to_dict()
        assert {k: cfg[k] for k in shape} == shape
        assert model.dtype == torch.float32 and len(model.model.layers) == shape["num_hidden_layers"]
    assert len(tok) == 4096
    ids = tok("x = 1024\n")["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert tok.convert_ids_to_tokens(ids).count("0") == 1  # digits are single tokens: 1, 0, 2, 4
    assert [t for t in tok.convert_ids_to_tokens(ids) if t.isdigit()] == ["1", "0", "2", "4"]
    with torch.no_grad():
        v = verifier(input_ids=torch.tensor([ids])).logits
        d = draft(input_ids=torch.tensor([ids])).logits
    assert v.shape == d.shape == (1, len(ids), 4096)


def test_pair_reproduces_its_recorded_task_completion():
    """Greedy decoding of the shipped verifier gives the completion recorded in metrics.json."""
    from dimr.pairs import get_pair, load_model, load_tokenizer

    pair = get_pair("mini")
    tok, verifier = load_tokenizer(pair), load_model(pair, "verifier", "cpu")
    metrics = json.loads((zoo.MINI_DIR / "metrics.json").read_text())["eval"]
    example = metrics["task"]["verifier"]["examples"][0]
    ids = torch.tensor([tok(example["prompt"])["input_ids"]])
    out = verifier.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                            max_new_tokens=tm.MAX_NEW_TOKENS, eos_token_id=tok.eos_token_id,
                            pad_token_id=tok.pad_token_id)
    completion = tok.decode(out[0, ids.size(1):], skip_special_tokens=True)
    assert completion == example["completion"]
    assert task.extract_answer(completion) is not None  # a trained verifier writes the answer format


def test_hashes_match_and_cover_every_shipped_file():
    recorded = json.loads((zoo.MINI_DIR / "hashes.json").read_text())
    files = tm.shipped_files(zoo.MINI_DIR, zoo.DATA_DIR)
    assert set(recorded) == set(files)
    for key in ("mini/verifier/model.safetensors", "mini/draft/model.safetensors", "mini/pair.json",
                "mini/verifier/tokenizer.json", "data/heldout_code.jsonl", "data/heldout_task.jsonl",
                "data/humaneval_prompts.jsonl"):
        assert key in recorded
    mismatched = [k for k, p in files.items() if tm.sha256(p) != recorded[k]]
    assert not mismatched
    assert sum(p.stat().st_size for p in files.values()) <= 30 * 2**20


def test_shipped_evaluation_files():
    code = tm._read_jsonl(zoo.DATA_DIR / "heldout_code.jsonl")
    assert 100 <= len(code) <= tm.HELDOUT_CODE_RECORDS
    per_file: dict[str, int] = {}
    for r in code:
        per_file[r["path"]] = per_file.get(r["path"], 0) + 1
    assert max(per_file.values()) <= tm.HELDOUT_CODE_PER_FILE and len(per_file) >= 20
    assert all(corpus.is_heldout(r["path"], tm.HELDOUT_FILE_FRACTION) and r["text"].strip() for r in code)
    problems = tm._read_jsonl(zoo.DATA_DIR / "heldout_task.jsonl")
    assert len(problems) == tm.N_TASK_HELDOUT
    assert all(task.is_correct(p["solution"], p["answer"]) for p in problems)
    assert [p["prompt"] for p in problems[:5]] == [p.prompt for p in task.generate(tm.SEED + 1, 5)]
    humaneval = tm._read_jsonl(zoo.DATA_DIR / "humaneval_prompts.jsonl")
    assert len(humaneval) == 164 and humaneval[0]["task_id"] == "HumanEval/0"
    assert all("def " in r["text"] and r["task_id"] == f"HumanEval/{i}" for i, r in enumerate(humaneval))


def test_heldout_split_is_deterministic():
    files = [f"pkg/mod{i}.py" for i in range(2000)]
    held = [f for f in files if corpus.is_heldout(f, 0.03)]
    assert held == [f for f in files if corpus.is_heldout(f, 0.03)]
    assert 20 < len(held) < 110
    assert not any(corpus.is_heldout(f, 0.0) for f in files)
    assert corpus.chunk("a\nb\nc\n", 2) == ["a\n", "b\n", "c\n"]


def test_skip_kl_scores_masks_with_the_slim_verifier():
    """The model card's skip profile is KL(full ‖ slim) of the real slim verifier, checked in numpy."""
    from dimr.pairs import get_pair, load_model, load_tokenizer
    from dimr.slim import slim_verifier

    pair = get_pair("mini")
    verifier, tok = load_model(pair, "verifier", "cpu"), load_tokenizer(pair)
    texts = ["def add(a, b):\n    return a + b\n", "for i in range(10):\n    print(i * i)\n"]
    out = tm.skip_kl(verifier, tok, texts, seed=0)
    mask = [j != 4 for j in range(12)]
    total, n = 0.0, 0
    with torch.no_grad():
        for t in texts:
            ids = torch.tensor([tok(t)["input_ids"][:tm.SEQ_LEN]])
            f = torch.log_softmax(verifier(input_ids=ids).logits[0].double(), -1).numpy()
            s = torch.log_softmax(slim_verifier(verifier, mask)(input_ids=ids).logits[0].double(), -1).numpy()
            total += float((np.exp(f) * (f - s)).sum())
            n += f.shape[0]
    assert out["single_layer_skip_kl"][4] == pytest.approx(total / n, rel=1e-4)
    assert len(out["single_layer_skip_kl"]) == 12 and min(out["single_layer_skip_kl"]) > 0


def test_cli_eval_without_pair_is_a_user_error(capsys, tmp_path):
    from dimr.cli import main

    with pytest.raises(SystemExit) as e:
        main(["zoo", "eval-mini", "--model-dir", str(tmp_path)])
    assert e.value.code == 2
    assert "train-mini" in capsys.readouterr().err


def test_batches_are_deterministic(tmp_path):
    import numpy as np

    rng = random.Random(0)
    np.save(tmp_path / "code.npy", np.array([rng.randrange(4096) for _ in range(5000)], dtype=np.uint16))
    np.save(tmp_path / "task.npy", np.arange(3000, dtype=np.uint16))
    np.save(tmp_path / "task_starts.npy", np.arange(0, 3000, 100))
    b = tm.Batches(tmp_path, seed=1)
    assert torch.equal(b.get(5), tm.Batches(tmp_path, seed=1).get(5))
    assert b.get(5).shape == (tm.BATCH, tm.SEQ_LEN + 1)
    assert not torch.equal(b.get(5), b.get(6))


def test_grow_preserves_the_function_and_places_the_layers():
    """Depth growth is exact: the grown 12-layer model gives the seed's logits, and training can move it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    def config(layers: int) -> LlamaConfig:
        return LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True)

    torch.manual_seed(0)
    small = LlamaForCausalLM(config(2)).eval()
    big = tm.grow(small, config(12), (0, 11)).eval()
    ids = torch.randint(0, 64, (2, 17))
    with torch.no_grad():
        torch.testing.assert_close(big(input_ids=ids).logits, small(input_ids=ids).logits, rtol=0, atol=1e-5)
    assert torch.equal(big.model.layers[11].mlp.up_proj.weight, small.model.layers[1].mlp.up_proj.weight)
    assert not big.model.layers[5].self_attn.o_proj.weight.any()
    assert big.model.layers[5].self_attn.q_proj.weight.any()  # new layers are random, only write-outs are zero
    loss = big(input_ids=ids, labels=ids).loss
    loss.backward()
    assert big.model.layers[5].self_attn.o_proj.weight.grad.abs().sum() > 0  # so training moves them
    with pytest.raises(ValueError):
        tm.grow(small, config(12), (0, 0))

    # The draft is cut out of the verifier: an independent copy equal to the slim verifier on those layers.
    draft = tm.take_layers(big, config(1), (11,)).eval()
    from dimr.slim import slim_verifier

    slim = slim_verifier(big, [i == 11 for i in range(12)])
    with torch.no_grad():
        torch.testing.assert_close(draft(input_ids=ids).logits, slim(input_ids=ids).logits, rtol=0, atol=1e-5)
    assert draft.model.layers[0].mlp.up_proj.weight.data_ptr() != big.model.layers[11].mlp.up_proj.weight.data_ptr()


def test_distill_loss_is_the_kl_divergence():
    import numpy as np
    from scipy.special import log_softmax, rel_entr

    torch.manual_seed(1)
    s, t = torch.randn(2, 3, 7, dtype=torch.float64), torch.randn(2, 3, 7, dtype=torch.float64)
    p = np.exp(log_softmax(t.numpy(), -1))
    q = np.exp(log_softmax(s.numpy(), -1))
    expected = rel_entr(p, q).sum(-1).mean()
    assert tm.distill_loss(s, t).item() == pytest.approx(expected, rel=1e-9)
    assert tm.distill_loss(t, t).item() == pytest.approx(0.0, abs=1e-12)


def test_quick_recipe_runs_every_stage_end_to_end(tmp_path):
    """`train-mini --quick`: seed -> grown verifier -> cut and distilled draft, in 2 data-parallel processes."""
    cfg = tm.quick_config(tmp_path / "mini", tmp_path / "data", tmp_path / "work")
    metrics = tm.run(cfg)
    assert set(metrics["bar"]) == {"loss_gap>=0.3", "verifier_task>=0.5", "task_gap>=0.2", "agreement>=0.5"}
    shapes = {name: json.loads((cfg.output / name / "config.json").read_text())["num_hidden_layers"]
              for name in ("verifier", "draft")}
    assert shapes == {"verifier": 12, "draft": 1}
    records = json.loads((cfg.output / "metrics.json").read_text())["training"]
    assert [records[s]["steps"] for s in ("seed", "verifier", "draft")] == [20, 20, 20]
    assert records["draft"]["loss"].startswith("KL") and records["verifier"]["loss"] == "cross-entropy"
    hashes = json.loads((cfg.output / "hashes.json").read_text())
    assert "mini/draft/model.safetensors" in hashes and "data/heldout_task.jsonl" in hashes
    assert metrics["wall_minutes_to_trained"] > 0

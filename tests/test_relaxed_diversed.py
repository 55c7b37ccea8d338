"""DIVERSED: the head trains the right way, saves with fingerprints, and runs from the CLI; bench-relaxed runs."""

from __future__ import annotations

import json

import pytest
import torch
from cli_runner import cli
from test_relaxed import tiny_models

from dimr.errors import DimrError
from dimr.relaxed.diversed import EnsembleHead, TrainConfig, load_head, save_head, train_head
from dimr.relaxed.train import agreement_reward


@pytest.fixture(scope="module")
def models():
    verifier, draft = tiny_models()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 64, (6,), generator=g) for _ in range(16)]
    return verifier, draft, prompts


TOY = TrainConfig(steps=10, batch=4, lr=0.05, lam=0.0, max_new_tokens=12, temperature=0.0)


def test_head_starts_at_one_half():
    head = EnsembleHead(8, 16)
    w = head(torch.randn(5, 8), torch.randn(5, 16))
    assert torch.equal(w, torch.full((5,), 0.5))


def test_head_starts_at_the_weight_asked_for(models):
    """``init_w`` moves only the start: w is exactly that on any input, the first rollouts are mixed with it,
    and a weight outside (0, 1) is refused."""
    head = EnsembleHead(8, 16, init_w=0.95)
    w = head(torch.randn(5, 8), torch.randn(5, 16))
    assert torch.allclose(w, torch.full((5,), 0.95), atol=1e-6)
    verifier, draft, prompts = models
    config = TrainConfig(steps=1, batch=2, lr=0.05, lam=0.0, max_new_tokens=6, temperature=0.0, init_w=0.95)
    _, log = train_head(draft, verifier, prompts, lambda i, y: 0.0, config)
    assert log.mean_w[0] == pytest.approx(0.95, abs=1e-5)
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(DimrError, match="strictly between 0 and 1"):
            EnsembleHead(8, 16, init_w=bad)


def test_reward_favouring_the_draft_drives_w_down(models):
    verifier, draft, prompts = models
    _, log = train_head(draft, verifier, prompts, agreement_reward(draft, prompts), TOY)
    assert log.mean_w[0] == pytest.approx(0.5)
    assert log.mean_w[-1] < 0.3


def test_reward_favouring_the_verifier_drives_w_up(models):
    verifier, draft, prompts = models
    _, log = train_head(draft, verifier, prompts, agreement_reward(verifier, prompts), TOY)
    assert log.mean_w[-1] > 0.5


def test_acceptance_regulariser_alone_drives_w_down(models):
    """With a constant reward only λ·Σ(1 − TV(draft, ν)) = λ·Σ(1 − w·TV) acts: w must fall."""
    verifier, draft, prompts = models
    config = TrainConfig(steps=4, batch=2, lr=0.05, lam=1.0, max_new_tokens=8, temperature=0.0)
    _, log = train_head(draft, verifier, prompts, lambda i, y: 1.0, config)
    assert log.mean_w[-1] < log.mean_w[0] == pytest.approx(0.5)


def test_save_load_checks_fingerprints(models, tmp_path):
    verifier, draft, _ = models
    head = EnsembleHead(32, 32)
    torch.nn.init.normal_(head.linear.weight)
    path = save_head(head, tmp_path / "h.safetensors", pair="toy", draft=draft, full=verifier, task="toy",
                     config=TOY, log=type("L", (), {"rewards": [], "mean_w": [], "acceptance": [], "seconds": 0})())
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["mixing"] == "probabilities" and len(meta["verifier_fingerprint"]) == 64
    loaded, _ = load_head(path, draft, verifier)
    assert torch.equal(loaded.linear.weight, head.linear.weight)
    with pytest.raises(DimrError, match="another verifier"):
        load_head(path, draft, draft)  # a 1-layer model is not the verifier it was trained for
    with pytest.raises(DimrError, match="no DIVERSED head"):
        load_head(tmp_path / "missing.safetensors")




def test_cli_train_decode_bench(capsys, tmp_path, tiny_pair):
    head = tmp_path / "head.safetensors"
    code, out, err = cli(capsys, "diversed", "train", "--pair", "tiny-random", "--task", "toy-draft", "--steps", "2",
                         "--batch", "2", "--prompts", "4", "--max-new-tokens", "6", "--out", str(head))
    assert code == 0, err
    assert head.is_file() and json.loads(head.with_suffix(".json").read_text())["task"] == "toy-draft"
    code, out, err = cli(capsys, "decode", "--pair", "tiny-random", "--mode", "sd", "--prompt", "Hi",
                         "--max-new-tokens", "8", "--verify", "diversed", "--head", str(head), "--param", "shift=-1",
                         "--json")
    assert code == 0, err
    assert len(json.loads(out)["tokens"]) == 8
    code, _, err = cli(capsys, "decode", "--pair", "tiny-random", "--mode", "sd", "--prompt", "Hi",
                       "--verify", "static", "--param", "w")
    assert code == 2 and "key=value" in err
    code, _, err = cli(capsys, "decode", "--pair", "tiny-random", "--mode", "ar", "--prompt", "Hi",
                       "--verify", "static", "--param", "w=0.5")
    assert code == 2 and "ar" in err
    rows, png = tmp_path / "rows.json", tmp_path / "pareto.png"
    code, out, err = cli(capsys, "bench-relaxed", "--pair", "tiny-random", "--workloads", "arithmetic,code",
                         "--methods", "static,diversed,fuzzy", "--gammas", "3", "--sweep-gamma", "3", "--n-arith", "2",
                         "--n-code", "1", "--arith-tokens", "6", "--code-tokens", "6", "--head", str(head),
                         "--json-out", str(rows), "--plot", str(png))
    assert code == 0, err
    data = json.loads(rows.read_text())["rows"]
    assert {r["method"] for r in data} == {"ar", "static", "diversed", "fuzzy"}
    assert png.stat().st_size > 1000 and "| workload |" in out
    assert (tmp_path / "pareto_length.png").stat().st_size > 1000  # output length against speed

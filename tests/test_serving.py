"""From a study to a serving stack: `dimr export --format hf` (a standalone checkpoint that plain transformers
loads, with the slim verifier's logits), self-speculation through HF's assisted generation, `-o -`, `--json`,
and the knee of a Pareto study."""

from __future__ import annotations

import json

import pytest
import torch
from cli_runner import cli
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from dimr.pairs import get_pair, load_model
from dimr.search import run_search
from dimr.slim import slim_verifier
from dimr.slim_config import apply_slim_config, load_slim_config

SMALL = dict(num_sequences=2, seq_len=16)


@pytest.fixture(scope="module")
def study_url(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('serving')}/s.db"
    result = run_search("tiny-random", 3, trials=4, storage=url, study="t", **SMALL)
    assert result.complete == 4 and result.best_mask.count("0") == 3
    return url


@pytest.fixture(scope="module")
def verifier():
    return load_model(get_pair("tiny-random"), "verifier", "cpu")


def test_hf_checkpoint_reloads_with_plain_transformers(capsys, tmp_path, study_url, verifier):
    out = tmp_path / "slim-hf"
    code, stdout, err = cli(capsys, "export", "t", "--storage", study_url, "--format", "hf", "-o", str(out), "--json")
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["format"] == "hf" and summary["output"] == str(out) and len(summary["kept_layers"]) == 5

    model = AutoModelForCausalLM.from_pretrained(out).eval()  # no dimr code involved
    assert model.config.num_hidden_layers == 5 and len(model.model.layers) == 5
    assert model.config.dimr_slim["mask"] == summary["mask"] == model.config.dimr_mask
    assert model.config.dimr_slim["fingerprint"] == load_slim_config(out / "dimr_slim.json").fingerprint
    with safe_open(out / "model.safetensors", "pt") as f:
        layers = {int(k.split(".")[2]) for k in f.keys() if k.startswith("model.layers.")}
    assert layers == set(range(5)), "the checkpoint holds the kept layers only, renumbered"
    assert (out / "generation_config.json").is_file()
    assert AutoTokenizer.from_pretrained(out)("def f():").input_ids

    slim = apply_slim_config(load_slim_config(out / "dimr_slim.json"), verifier)
    ids = torch.randint(0, verifier.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, slim(ids).logits)
        assert not torch.allclose(model(ids).logits, verifier(ids).logits)


def test_assisted_generation_with_the_slim_verifier_is_greedy(tmp_path, study_url, verifier, capsys):
    """The HF recipe: the slim verifier (in memory, sharing weights, or the exported checkpoint) as
    ``assistant_model`` of the full verifier gives exactly the full verifier's greedy tokens."""
    out = tmp_path / "hf"
    assert cli(capsys, "-q", "export", "t", "--storage", study_url, "--format", "hf", "-o", str(out))[0] == 0
    ids = AutoTokenizer.from_pretrained(out)("def fibonacci(n):", return_tensors="pt").input_ids
    greedy = dict(do_sample=False, max_new_tokens=24, pad_token_id=0)
    with torch.no_grad():
        plain = verifier.generate(ids, **greedy)
        shared = slim_verifier(verifier, load_slim_config(out / "dimr_slim.json").layer_mask)
        for assistant in (shared, AutoModelForCausalLM.from_pretrained(out).eval()):
            assert torch.equal(verifier.generate(ids, assistant_model=assistant, **greedy), plain)
    assert plain.shape[1] == ids.shape[1] + 24


def test_export_to_stdout_and_json(capsys, tmp_path, study_url):
    code, stdout, err = cli(capsys, "export", "t", "--storage", study_url, "-o", "-")
    assert code == 0, err
    cfg = json.loads(stdout)
    assert cfg["schema"] == "dimr.slim-config/1" and cfg["study"] == "t"
    assert not (tmp_path / "-").exists()
    code, stdout, _ = cli(capsys, "export", "t", "--storage", study_url, "-o", str(tmp_path / "s.json"), "--json")
    assert code == 0 and json.loads(stdout)["mask"] == cfg["mask"] == load_slim_config(tmp_path / "s.json").mask


@pytest.mark.parametrize("args, needle", [
    (["--format", "hf", "-o", "-"], "-o - writes the slim config"),
    (["-o", "-", "--json"], "drop --json"),
    (["--format", "hf", "-o", "{full}"], "not an empty directory"),
    (["--format", "hf", "-o", "{missing}/x"], "does not exist"),
])
def test_bad_export_hf(capsys, tmp_path, study_url, args, needle):
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    args = [a.format(full=full, missing=tmp_path / "nope") for a in args]
    code, stdout, err = cli(capsys, "export", "t", "--storage", study_url, *args)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1 and not stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"] and [p.name for p in full.iterdir()] == ["keep.txt"]


def test_pareto_export_without_budget_takes_the_knee_and_says_so(capsys, tmp_path):
    from dimr.search import pareto
    from dimr.studies import load_study
    from storage import open_storage

    url = f"sqlite:///{tmp_path}/p.db"
    run_search("tiny-random", 3, trials=8, objective="pareto", storage=url, study="p", **SMALL)
    code, stdout, err = cli(capsys, "export", "p", "--storage", url, "-o", str(tmp_path / "k.json"), "--json")
    assert code == 0 and "Pareto study: exporting the knee" in err and "--budget" in err
    study = load_study(open_storage(url), "p")
    knee = pareto.knee(study)
    assert json.loads(stdout)["trial"] == knee.number
    assert knee.number in {t.number for t in pareto.front(study)}
    code, stdout, _ = cli(capsys, "studies", "--storage", url, "--json")
    row = json.loads(stdout)[0]
    assert row["front_size"] == len(pareto.front(study)) and row["best_cost"] is not None
    code, stdout, _ = cli(capsys, "studies", "--storage", url)
    assert f"front of {row['front_size']} masks" in stdout

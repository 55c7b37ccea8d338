"""The CLI end to end on the tiny pair, and every bad input: one line, exit code 2, nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import cli

SEARCH = ["search", "--pair", "tiny-random", "--budget", "3", "--trials", "6", "--startup-trials", "2",
          "--num-sequences", "2", "--seq-len", "16"]


def test_search_show_export_apply(capsys, tmp_path):
    url = f"sqlite:///{tmp_path}/d.db"
    code, out, err = cli(capsys, *SEARCH, "--storage", url, "--study", "t", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["complete"] == 6 and result["evaluated"] == 6
    code, out, _ = cli(capsys, "studies", "--storage", url, "--json")
    assert [s["study"] for s in json.loads(out)] == ["t"]
    code, out, _ = cli(capsys, "show", "t", "--storage", url, "--json")
    shown = json.loads(out)
    assert shown["counts"]["complete"] == 6 and shown["best"][0]["mask"] == result["best_mask"]
    assert 0 <= shown["best"][0]["expected_acceptance"] <= 1
    code, out, _ = cli(capsys, "show", "t", "--storage", url)
    assert code == 0 and "top-1 agreement" in out
    # resume: the same command continues the study and evaluates nothing already done
    code, out, _ = cli(capsys, *SEARCH[:6], "8", *SEARCH[7:], "--storage", url, "--study", "t", "--json")
    assert json.loads(out)["evaluated"] == 2
    slim = tmp_path / "slim.json"
    code, out, err = cli(capsys, "export", "t", "--storage", url, "-o", str(slim))
    assert code == 0, err
    cfg = json.loads(slim.read_text())
    assert cfg["mask"] == result["best_mask"] and cfg["num_layers"] == 8

    from dimr.pairs import get_pair, load_model
    from dimr.slim_config import apply_slim_config, load_slim_config

    verifier = load_model(get_pair("tiny-random"), "verifier", "cpu")
    slim_model = apply_slim_config(load_slim_config(slim), verifier)
    assert slim_model.config.num_hidden_layers == 5


def test_pairs_lists_builtins(capsys):
    code, out, _ = cli(capsys, "pairs", "--json")
    names = [p["name"] for p in json.loads(out)]
    assert {"gemma2-2b-9b", "llama2-7b-70b", "qwen2.5-0.5b-7b", "qwen3-0.6b-32b", "tiny-random"} <= set(names)


def test_user_pairs_file(capsys, tmp_path):
    from dimr.pairs import get_pair

    tiny = get_pair("tiny-random")
    f = tmp_path / "pairs.toml"
    f.write_text(f'[pairs.mine]\ndraft = "{tiny.draft}"\nverifier = "{tiny.verifier}"\ndtype = "float32"\n')
    code, out, _ = cli(capsys, "pairs", "--pairs-file", str(f), "--json")
    mine = [p for p in json.loads(out) if p["name"] == "mine"]
    assert mine and mine[0]["verifier"] == tiny.verifier


BAD_CASES = ["unknown pair", "impossible budget", "fraction budget", "malformed url", "unreachable url",
             "missing dir", "missing calibration", "empty calibration", "short calibration", "too many trials"]


def _bad(tmp_path: Path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    short = tmp_path / "short.txt"
    short.write_text("def f(): pass\n")
    db = f"sqlite:///{tmp_path}/bad.db"
    return {
        "unknown pair": (["search", "--pair", "nope", "--storage", db], "unknown pair"),
        "impossible budget": ([*SEARCH[:4], "8", *SEARCH[5:], "--storage", db], "budget"),
        "fraction budget": ([*SEARCH[:4], "1.5", *SEARCH[5:], "--storage", db], "budget"),
        "malformed url": ([*SEARCH, "--storage", "not a url"], "malformed"),
        "unreachable url": ([*SEARCH, "--storage", "postgresql+psycopg://postgres@127.0.0.1:1/x"], "cannot reach"),
        "missing dir": ([*SEARCH, "--storage", f"sqlite:///{tmp_path}/no/such/dir.db"], "does not exist"),
        "missing calibration": ([*SEARCH, "--calibration", str(tmp_path / "none.jsonl"), "--storage", db],
                                "does not exist"),
        "empty calibration": ([*SEARCH, "--calibration", str(empty), "--storage", db], "empty"),
        "short calibration": ([*SEARCH, "--calibration", str(short), "--storage", db], "--seq-len"),
        "too many trials": ([*SEARCH[:4], "7", "--trials", "50", *SEARCH[7:], "--storage", db], "at most"),
    }


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_search_input(capsys, tmp_path, case):
    args, needle = _bad(tmp_path)[case]
    code, out, err = cli(capsys, *args)
    assert code == 2, (out, err)
    assert needle in err and err.startswith("error: ")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "bad.db").exists(), "bad input wrote a database"


def test_bad_export(capsys, tmp_path):
    from storage import open_storage

    url = f"sqlite:///{tmp_path}/e.db"
    open_storage(url)  # an empty dimr database (a missing one is refused: read-only commands create nothing)
    code, _, err = cli(capsys, "export", "nope", "--storage", url, "-o", str(tmp_path / "s.json"))
    assert code == 2 and "no study 'nope'" in err and len(err.strip().splitlines()) == 1
    # a study with no completed trial
    import optuna

    from dimr.search import SETTINGS_ATTR
    from storage import open_storage

    optuna.create_study(study_name="empty", storage=open_storage(url)).set_user_attr(SETTINGS_ATTR, {"pair": "x"})
    code, _, err = cli(capsys, "export", "empty", "--storage", url, "-o", str(tmp_path / "s.json"))
    assert code == 2 and "no completed trial" in err
    assert not (tmp_path / "s.json").exists()


def test_resume_conflict_refused(capsys, tmp_path):
    url = f"sqlite:///{tmp_path}/c.db"
    assert cli(capsys, *SEARCH[:6], "3", *SEARCH[7:], "--storage", url, "--study", "c")[0] == 0
    code, _, err = cli(capsys, *SEARCH[:6], "3", *SEARCH[7:], "--storage", url, "--study", "c", "--cost", "js")
    assert code == 2 and "other settings" in err and "cost" in err


def test_entry_point_bad_input_no_traceback(tmp_path):
    """The installed entry point (python -m dimr) prints one line and exits 2."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    p = subprocess.run([sys.executable, "-m", "dimr", "search", "--pair", "nope",
                        "--storage", f"sqlite:///{tmp_path}/x.db"], capture_output=True, text=True, env=env)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == ["error: unknown pair 'nope'; run `dimr pairs` to list them, or add it "
                                             "in a pairs TOML file"]
    assert not (tmp_path / "x.db").exists()


def test_quiet_turns_off_the_libraries_progress_bars(capsys, monkeypatch):
    """`-q`: results only, so transformers' and the hub's progress bars ("Loading weights") are off too."""
    import transformers

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    transformers.utils.logging.enable_progress_bar()
    try:
        code, _, _ = cli(capsys, "-q", "pairs", "--json")
        assert code == 0
        assert os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") == "1"
        assert not transformers.utils.logging.is_progress_bar_enabled()
    finally:
        transformers.utils.logging.enable_progress_bar()
        os.environ.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)

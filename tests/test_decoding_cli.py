"""`dimr decode` and `dimr bench-decode` through `dimr.cli.main`, on the tiny-random pair."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import pytest

from dimr.cli import main
from dimr.decoding import DecodeConfig, Thresholds
from dimr.decoding.bench import COLUMNS


@pytest.fixture(scope="module")
def slim_json(tiny_pair, tmp_path_factory):
    from dimr.pairs import load_model
    from dimr.slim_config import make_slim_config

    verifier = load_model(tiny_pair, "verifier", "cpu")
    cfg = make_slim_config(verifier, (True, True, False, True, True, False, True, True), pair="tiny-random",
                           verifier_id=tiny_pair.verifier, cost="kl", metrics={"cost": 0.1},
                           calibration="test", calibration_hash="0")
    good = cfg.save(tmp_path_factory.mktemp("slim") / "slim.json")
    bad = replace(cfg, fingerprint="0" * len(cfg.fingerprint)).save(good.parent / "other.json")
    return good, bad


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    try:
        main(args)
        code = 0
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_fingerprint_mismatch_is_one_line_exit_2(slim_json, capsys):
    _, bad = slim_json
    code, out, err = run_cli(["decode", "--pair", "tiny-random", "--slim", str(bad), "--prompt", "x"], capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and "was made for verifier" in err
    assert "Traceback" not in out + err


def test_user_errors_exit_2(slim_json, capsys):
    good, _ = slim_json
    for args in (["decode", "--pair", "tiny-random", "--mode", "via", "--prompt", "x"],  # no --slim
                 ["decode", "--pair", "tiny-random", "--mode", "ar", "--prompt", "x", "--gamma", "0"],
                 ["decode", "--pair", "tiny-random", "--mode", "ar"],  # no prompt
                 ["bench-decode", "--pair", "tiny-random", "--modes", "ar,fast"]):
        code, _, err = run_cli(args, capsys)
        assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, (args, err)


def test_decode_json_matches_python_api(slim_json, capsys, tmp_path):
    from dimr.decoding import Decoder

    good, _ = slim_json
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "def f(x):"}) + "\n" + json.dumps("import os") + "\n")
    code, out, _ = run_cli(["decode", "--pair", "tiny-random", "--slim", str(good), "--mode", "via",
                            "--prompts", str(prompts), "--max-new-tokens", "12", "--ignore-eos", "--json",
                            "--accept-threshold", "0.3"], capsys)
    assert code == 0
    results = json.loads(out)
    assert [r["prompt"] for r in results] == ["def f(x):", "import os"]
    dec = Decoder.load("tiny-random", slim=good, device="cpu")
    config = DecodeConfig(max_new_tokens=12, thresholds=Thresholds(accept=0.3))
    for r in results:
        api = dec.run(dec.encode(r["prompt"]), "via", config)
        assert r["tokens"] == api.tokens
        s = r["stats"]
        assert s["accepted"] + s["regenerated"] + s["escalated"] + s["bonus"] == s["tokens"] == 12


def test_decode_auto_goes_on_from_its_chooser_state(slim_json, capsys, tmp_path):
    """`--chooser-state`: auto's chooser is written after the prompts and read back by the next run, which adds to
    its counts; a file learned on another slim, a file dimr did not write, or another mode is one line, exit 2,
    and the file is left as it was."""
    good, _ = slim_json
    state = tmp_path / "auto.json"
    args = ["decode", "--pair", "tiny-random", "--mode", "auto", "--prompt", "def f(x):", "--max-new-tokens", "12",
            "--ignore-eos", "--json", "--chooser-state", str(state)]
    code, first, err = run_cli([*args, "--slim", str(good)], capsys)
    assert code == 0, err

    def tested() -> float:
        (chooser,) = json.loads(state.read_text())["choosers"].values()
        return sum(sum(counts) for counts in chooser["counts"].values())

    once = tested()
    assert once > 0
    code, second, err = run_cli([*args, "--slim", str(good)], capsys)
    assert code == 0, err
    assert tested() > once and json.loads(second)["tokens"] == json.loads(first)["tokens"]  # greedy: same text
    saved = state.read_text()
    garbage = tmp_path / "garbage.json"
    garbage.write_text('{"format": "dimr-auto-chooser/1", "choosers": {"0.0": {"counts": 3}}}')
    errors = []
    for bad in ([*args],  # no slim: not the decoder the state was learned on
                [*args[:-1], str(garbage), "--slim", str(good)],
                [*args, "--slim", str(good), "--mode", "sd"]):
        code, out, err = run_cli(bad, capsys)
        assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, (bad, err)
        assert "Traceback" not in out + err
        errors.append(err)
    assert state.read_text() == saved and "learned on pair tiny-random, slim" in errors[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["auto.json", "garbage.json"]  # no temporary file left


def test_decode_compiled_matches_eager(capsys):
    args = ["decode", "--pair", "tiny-random", "--mode", "ar", "--prompt", "def f(x):", "--max-new-tokens", "6",
            "--ignore-eos", "--json"]
    code, eager, _ = run_cli(args, capsys)
    assert code == 0
    code, compiled, err = run_cli([*args, "--compiled"], capsys)
    assert code == 0, err
    assert json.loads(compiled)["tokens"] == json.loads(eager)["tokens"]


def test_cli_threshold_defaults_match_library():
    import inspect

    from dimr import cli_decode

    params = inspect.signature(cli_decode.decode).parameters
    assert params["accept_threshold"].default.default == Thresholds().accept
    assert params["close_threshold"].default.default == Thresholds().close
    assert params["regen_threshold"].default.default == Thresholds().regen
    assert params["gamma"].default.default == DecodeConfig().gamma


def test_bench_decode_table(slim_json, capsys):
    good, _ = slim_json
    code, out, err = run_cli(["bench-decode", "--pair", "tiny-random", "--slim", str(good), "--modes",
                              "ar,sd,self,via", "--max-new-tokens", "6", "--prompts", str(_one_prompt())],
                             capsys)
    assert code == 0, err
    rows = {line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ")}
    assert {"ar", "sd", "self", "via", "hf-assisted"} <= rows
    assert "c_rel" in out


def test_bench_decode_compiled_rows(capsys):
    code, out, err = run_cli(["bench-decode", "--pair", "tiny-random", "--modes", "ar", "--no-hf", "--compiled",
                              "--max-new-tokens", "6", "--prompts", str(_one_prompt())], capsys)
    assert code == 0, err
    rows = {line.split("|")[1].strip(): line.split("|") for line in out.splitlines() if line.startswith("| ")}
    assert {"ar", "ar+c"} <= set(rows)
    assert rows["ar+c"][1 + COLUMNS.index("= ar")].strip() == "1/1"  # greedy: ar's tokens exactly
    assert "c_rel of the +c rows" in out


def _one_prompt():
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp()) / "prompts.jsonl"
    path.write_text(json.dumps({"text": "print(1)"}) + "\n")
    return path


def test_decode_auto_on_the_cpu_prices_by_the_times_it_measures_without_stats(slim_json, capsys, tmp_path):
    """Without `--stats` the tiers are still timed on the CPU (timing costs nothing there), so `auto` rescales its cost
    table by the forwards it runs, as in the benchmark; untimed, its chooser had priced every arm by the table
    alone and learned no step work."""
    good, _ = slim_json
    state = tmp_path / "auto.json"
    code, out, err = run_cli(["decode", "--pair", "tiny-random", "--slim", str(good), "--mode", "auto", "--prompt",
                              "def f(x):", "--max-new-tokens", "12", "--ignore-eos", "--chooser-state", str(state)],
                             capsys)
    assert code == 0, err
    (chooser,) = json.loads(state.read_text())["choosers"].values()
    assert chooser["scale"] and chooser["overhead"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))


def test_bench_row_names_give_their_mode_and_config():
    """A benchmark row name sets γ, hier's window and the draft's stop when unsure, and nothing else."""
    from dimr.decoding.bench import parse_spec

    base = DecodeConfig(max_new_tokens=8)
    assert parse_spec("ar", base) == ("ar", base)
    assert parse_spec("sd@6", base) == ("sd", replace(base, gamma=6))
    assert parse_spec("hier@2x8", base) == ("hier", replace(base, gamma=2, window=8))
    assert parse_spec("sd@6~0.3", base) == ("sd", replace(base, gamma=6, draft_stop=0.3))

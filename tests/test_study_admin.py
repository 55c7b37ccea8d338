"""Studies as other tools see them: deleting (`dimr delete`, and `optuna delete-study` followed by a new study
with the same id), and optuna-dashboard reading a dimr study with named objectives and one attribute per
setting."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from wsgiref.util import setup_testing_defaults

import optuna
import pytest
from cli_runner import cli
from sqlalchemy import text

from dimr.search import SETTINGS_ATTR, run_search
from storage import open_storage

SMALL = dict(num_sequences=2, seq_len=16)


def _ledger_rows(url: str, study_id: int) -> int:
    with open_storage(url).engine.connect() as c:
        return c.execute(text("SELECT count(*) FROM dimr_masks WHERE study_id = :s"), {"s": study_id}).scalar_one()


def test_optuna_delete_study_then_same_name_searches_again(capsys, tmp_path):
    """SQLite gives the recreated study the deleted one's id: its ledger rows must not count as done."""
    url = f"sqlite:///{tmp_path}/d.db"
    first = run_search("tiny-random", 3, trials=3, storage=url, study="d", **SMALL)
    old_id = open_storage(url).get_study_id_from_name("d")
    assert first.evaluated == 3 and _ledger_rows(url, old_id) == 3
    subprocess.run([str(Path(sys.executable).parent / "optuna"), "delete-study", "--storage", url, "--study-name", "d"],
                   check=True, capture_output=True)
    again = run_search("tiny-random", 3, trials=3, storage=url, study="d", **SMALL)
    assert open_storage(url).get_study_id_from_name("d") == old_id, "the premise: SQLite reused the id"
    assert again.complete == 3 and again.evaluated == 3 and again.best_mask is not None
    assert _ledger_rows(url, old_id) == 3
    code, _, err = cli(capsys, "export", "d", "--storage", url, "-o", str(tmp_path / "s.json"))
    assert code == 0, err


def test_dimr_delete_removes_the_study_and_its_ledger_rows(capsys, tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path}/d.db"
    run_search("tiny-random", 3, trials=2, storage=url, study="gone", **SMALL)
    run_search("tiny-random", 3, trials=2, storage=url, study="kept", **SMALL)
    st = open_storage(url)
    gone, kept = st.get_study_id_from_name("gone"), st.get_study_id_from_name("kept")
    capsys.readouterr()  # the searches' own output
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # not a terminal: no question can be asked
    code, _, err = cli(capsys, "delete", "gone", "--storage", url)
    assert code == 2 and "needs --yes" in err and len(err.strip().splitlines()) == 1
    code, _, err = cli(capsys, "delete", "nope", "--storage", url, "--yes")
    assert code == 2 and "no study 'nope'" in err
    assert _ledger_rows(url, gone) == 2
    monkeypatch.setenv("DIMR_STORAGE", url)  # the default --storage
    code, out, err = cli(capsys, "delete", "gone", "--yes")
    assert code == 0 and "deleted study gone (2 trials)" in out, err
    assert [s.study_name for s in optuna.get_all_study_summaries(open_storage(url), False)] == ["kept"]
    assert _ledger_rows(url, gone) == 0 and _ledger_rows(url, kept) == 2


def _dashboard_get(storage, path: str) -> dict:
    from optuna_dashboard import wsgi

    app = wsgi(storage)
    environ = {"PATH_INFO": path, "REQUEST_METHOD": "GET"}
    setup_testing_defaults(environ)
    status = []
    body = b"".join(app(environ, lambda s, _h, *_: status.append(s)))
    assert status[0].startswith("200"), (status, body[:200])
    return json.loads(body)


@pytest.mark.parametrize("objective, names", [("cost", ["cost"]), ("pareto", ["cost", "kept_fraction"])])
def test_optuna_dashboard_reads_names_and_settings(tmp_path, objective, names):
    url = f"sqlite:///{tmp_path}/d.db"
    run_search("tiny-random", 2, trials=3, storage=url, study="s", objective=objective, **SMALL)
    storage = open_storage(url)
    study_id = storage.get_study_id_from_name("s")
    detail = _dashboard_get(storage, f"/api/studies/{study_id}")
    assert detail["objective_names"] == names
    attrs = {a["key"]: a["value"] for a in detail["user_attrs"]}
    settings = optuna.load_study(study_name="s", storage=storage).user_attrs[SETTINGS_ATTR]
    assert attrs["pair"] == "tiny-random" and attrs["skip"] == "2" and attrs["objective"] == objective
    assert set(settings) <= set(attrs), "every setting is its own attribute (the JSON one stays as well)"
    assert len(detail["trials"]) == 3 and detail["best_trials"]


def test_train_mini_quick_never_writes_the_shipped_pair(tmp_path, monkeypatch):
    from dimr import zoo
    from dimr.cli_zoo import DATA_DIR, MINI_DIR, train_paths

    assert (MINI_DIR, DATA_DIR) == (zoo.MINI_DIR, zoo.DATA_DIR)

    monkeypatch.setenv("DIMR_HOME", str(tmp_path))
    output, data_dir, work = train_paths(None, None, None, quick=True)
    shipped = {zoo.MINI_DIR.resolve(), zoo.DATA_DIR.resolve()}
    assert output == tmp_path / "mini-quick" and data_dir == output / "data" and work.parent == tmp_path
    assert not {output.resolve(), data_dir.resolve()} & shipped
    assert train_paths(None, None, None, quick=False)[:2] == (zoo.MINI_DIR, zoo.DATA_DIR)
    assert train_paths(tmp_path / "o", None, None, quick=True)[1] == tmp_path / "o" / "data"


def test_listing_commands_import_neither_torch_nor_transformers(tmp_path):
    url = f"sqlite:///{tmp_path}/l.db"
    study = optuna.create_study(study_name="s", storage=url)
    study.add_trial(optuna.trial.create_trial(value=2e-5, user_attrs={"mask": "1101"}))
    code = ("import sys\nfrom dimr.cli import main\n"
            f"for args in (['studies', '--storage', {url!r}], ['show', 's', '--storage', {url!r}], ['--version']):\n"
            "    try:\n        main(args)\n    except SystemExit as e:\n        assert not e.code, e.code\n"
            "heavy = {'torch', 'transformers'} & set(sys.modules)\nassert not heavy, heavy\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert p.returncode == 0, p.stderr
    assert "2e-05" in p.stdout, "costs print in significant digits, not 0.0000"
    assert "1101" in p.stdout and "…" not in p.stdout, "a table written to a pipe is never cut"


def test_json_output_is_strict(capsys):
    def refuse(name):
        raise AssertionError(f"{name} is not JSON")

    code, out, _ = cli(capsys, "relaxed-methods", "--json")
    rows = json.loads(out, parse_constant=refuse)
    assert code == 0 and rows and "inf" in json.dumps(rows)  # an infinite parameter, written as a string
    code, out, _ = cli(capsys, "--version")
    assert code == 0 and out.startswith("dimr ")

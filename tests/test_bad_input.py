"""Bad input to every command, and a seeded fuzz of the slim-config and pairs-TOML loaders.

Every case gives one line on stderr (starting "error: "), exit code 2, no traceback, and writes nothing: the files
under the test's folder and the rows of an existing database are the same before and after.
"""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from cli_runner import cli

from dimr.errors import DimrError
from dimr.slim_config import load_slim_config

ROOT = Path(__file__).resolve().parents[1]
SECRET = "s3cretpw"
SEARCH = ["search", "--pair", "tiny-random", "--budget", "3", "--trials", "6", "--num-sequences", "2",
          "--seq-len", "16"]
DECODE = ["decode", "--pair", "tiny-random", "--mode", "ar", "--prompt", "hi", "--max-new-tokens", "2"]


@pytest.fixture(scope="module")
def study_db(tmp_path_factory) -> tuple[str, Path]:
    """A dimr study with complete trials (model-free evaluator), and a valid slim config exported from it."""
    sys.path.insert(0, str(ROOT / "tests"))
    from fault_driver import settings

    from dimr.pairs import get_pair, prepare
    from dimr.search import Search, SearchOptions
    from dimr.studies import export_slim_config, load_study
    from storage import open_storage
    from workers.synthetic import SleepEvaluator, SleepSpec

    prepare(get_pair("tiny-random"))  # built once here, so no case prints its first-build progress
    d = tmp_path_factory.mktemp("db")
    url = f"sqlite:///{d / 'dimr.db'}"
    Search(open_storage(url), "s", settings(), SearchOptions(6, 0, "swap", 0),
           SleepEvaluator(SleepSpec(latency_s=0))).run()
    export_slim_config(load_study(open_storage(url), "s"), d / "slim.json")
    return url, d / "slim.json"


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
            if not p.is_dir()}


def _rows(url: str) -> dict[str, int]:
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as c:
            names = sqlalchemy.inspect(c).get_table_names()
            return {n: c.exec_driver_sql(f'SELECT count(*) FROM "{n}"').scalar() for n in names}
    finally:
        engine.dispose()


def _inputs(tmp: Path, slim: Path) -> dict[str, Path]:
    """Bad files of every kind, written before the case runs (they are part of the 'before' snapshot)."""
    f = {}

    def put(name: str, data: bytes | str) -> Path:
        p = tmp / name
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
        f[name] = p
        return p

    put("binary.bin", bytes(range(256)) * 4)
    put("binary.jsonl", b"\x00\xff\xfe" * 50)
    put("empty.txt", "")
    put("short.txt", "a b")
    put("notdb.db", "this is a text file, not a database\n" * 10)
    put("prompts_bad.jsonl", '{"prompt": "ok"}\nnot json\n')
    put("prompts_noprompt.jsonl", '{"other": 1}\n')
    (tmp / "adir").mkdir()
    f["adir"] = tmp / "adir"
    (tmp / "emptymodel").mkdir()
    f["emptymodel"] = tmp / "emptymodel"
    gpt2 = tmp / "gpt2model"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_embd": 8, "n_head": 2,
                                                  "vocab_size": 32, "bos_token_id": 0, "eos_token_id": 0}))
    f["gpt2model"] = gpt2
    tiny = "verifier = '{v}'\ndraft = '{v}'\n"
    put("pairs_binary.toml", b"\x00\x01[pairs]\xff")
    put("pairs_invalid.toml", "[pairs.x\ndraft = ")
    put("pairs_unknown.toml", "[pairs.x]\ndraft = 'a'\nverifier = 'b'\ncolour = 'red'\n")
    put("pairs_type.toml", "[pairs.x]\ndraft = 3\nverifier = 'b'\n")
    put("pairs_missing.toml", "[pairs.x]\ndraft = 'a'\n")
    put("pairs_dtype.toml", "[pairs.x]\ndraft = 'a'\nverifier = 'b'\ndtype = 'int4'\n")
    put("pairs_toplevel.toml", "[models.x]\ndraft = 'a'\nverifier = 'b'\n")
    put("pairs_notable.toml", "[pairs]\nx = 'a'\n")
    put("pairs_nomodel.toml", "[pairs.x]\n" + tiny.format(v=f["emptymodel"]))
    put("pairs_gpt2.toml", "[pairs.x]\n" + tiny.format(v=gpt2))
    good = json.loads(slim.read_text())
    put("slim_nested.json", "[" * 100_000 + "]" * 100_000)
    put("slim_type.json", json.dumps({**good, "num_layers": "8"}))
    put("slim_mask.json", json.dumps({**good, "mask": "1" * 7}))
    put("slim_kept.json", json.dumps({**good, "kept_layers": [0, 1]}))
    put("slim_other_pair.json", json.dumps({**good, "pair": "tiny-random-other"}))
    put("slim_schema.json", json.dumps({**good, "schema": "other/1"}))
    put("slim_list.json", "[1, 2]")
    return f


def _cases(tmp: Path, db: str, slim: Path) -> dict[str, tuple[list[str], str]]:
    f = _inputs(tmp, slim)
    new = f"sqlite:///{tmp / 'new.db'}"
    s = [*SEARCH, "--storage", new]
    d = DECODE
    pf = "--pairs-file"
    return {
        # search
        "unknown pair": (["search", "--pair", "nope", "--storage", new], "unknown pair"),
        "budget all layers": ([*SEARCH[:4], "8", *SEARCH[5:], "--storage", new], "budget"),
        "budget fraction > 1": ([*SEARCH[:4], "1.5", *SEARCH[5:], "--storage", new], "budget"),
        "budget negative": ([*SEARCH[:3], "--budget=-1", *SEARCH[5:], "--storage", new], "budget"),
        "budget text": ([*SEARCH[:4], "abc", *SEARCH[5:], "--storage", new], "budget"),
        "too many trials": ([*SEARCH[:4], "7", "--trials", "50", *SEARCH[7:], "--storage", new], "at most"),
        "trials zero": ([*SEARCH[:6], "0", *SEARCH[7:], "--storage", new], "--trials"),
        "trials text": ([*SEARCH[:6], "abc", *SEARCH[7:], "--storage", new], "--trials"),
        "num-sequences zero": ([*SEARCH[:8], "0", *SEARCH[9:], "--storage", new], "--num-sequences"),
        "seq-len one": ([*SEARCH[:10], "1", "--storage", new], "--seq-len"),
        "unknown sampler": ([*s, "--sampler", "nope"], "--sampler"),
        "unknown cost": ([*s, "--cost", "nope"], "--cost"),
        "unknown objective": ([*s, "--objective", "nope"], "--objective"),
        "unknown option": ([*s, "--colour", "red"], "--colour"),
        "empty study name": ([*s, "--study", ""], "--study is empty"),
        "malformed url": ([*SEARCH, "--storage", "not a url"], "malformed"),
        "malformed url with password": ([*SEARCH, "--storage", f"postgresql://u:{SECRET}@h:x/db"], "malformed"),
        "unknown driver module": ([*SEARCH, "--storage", f"postgresql+nodriver://u:{SECRET}@h/db"], "driver"),
        "dialect without driver": ([*SEARCH, "--storage", f"nosuchdb://u:{SECRET}@h/db"], "driver"),
        "port not a number": ([*SEARCH, "--storage", "postgresql+psycopg://u@127.0.0.1:abc/db"], "malformed"),
        "unreachable server": ([*SEARCH, "--storage", f"postgresql+psycopg://u:{SECRET}@127.0.0.1:1/x"],
                               "cannot reach"),
        "sqlite dir missing": ([*SEARCH, "--storage", f"sqlite:///{tmp}/no/such/dir.db"], "does not exist"),
        "sqlite url is a directory": ([*SEARCH, "--storage", f"sqlite:///{f['adir']}"], "is a directory"),
        "sqlite url is not a database": ([*SEARCH, "--storage", f"sqlite:///{f['notdb.db']}"], "not an SQLite"),
        "calibration missing": ([*s, "--calibration", str(tmp / "none.jsonl")], "does not exist"),
        "calibration empty": ([*s, "--calibration", str(f["empty.txt"])], "empty"),
        "calibration short": ([*s, "--calibration", str(f["short.txt"])], "--seq-len"),
        "calibration binary": ([*s, "--calibration", str(f["binary.jsonl"])], "binary"),
        "calibration directory": ([*s, "--calibration", str(f["adir"]) + "/"], "directory"),
        "device unknown": ([*s, "--device", "banana"], "not a torch device"),
        "device unavailable": ([*s, "--device", "cuda:7"], "not available"),
        "ray address unreachable": ([*s, "--ray-address", "127.0.0.1:1"], "cannot reach Ray"),
        "ray address malformed": ([*s, "--ray-address", "nohost"], "host:port"),
        "pairs file missing": ([*s, pf, str(tmp / "none.toml")], "does not exist"),
        "pairs file directory": ([*s, pf, str(f["adir"])], "directory"),
        "pairs file binary": ([*s, pf, str(f["pairs_binary.toml"])], "binary"),
        "pairs file invalid": ([*s, pf, str(f["pairs_invalid.toml"])], "not valid TOML"),
        "pairs file unknown key": ([*s, pf, str(f["pairs_unknown.toml"])], "unknown key"),
        "pairs file wrong type": ([*s, pf, str(f["pairs_type.toml"])], "must be a non-empty string"),
        "pairs file missing key": ([*s, pf, str(f["pairs_missing.toml"])], "lacks verifier"),
        "pairs file bad dtype": ([*s, pf, str(f["pairs_dtype.toml"])], "dtype"),
        "pairs file other table": ([*s, pf, str(f["pairs_toplevel.toml"])], "[pairs]"),
        "pairs file pair not a table": ([*s, pf, str(f["pairs_notable.toml"])], "not a table"),
        "verifier folder without model": (["search", "--pair", "x", pf, str(f["pairs_nomodel.toml"]),
                                           "--storage", new], "cannot load"),
        "unsupported family": (["search", "--pair", "x", pf, str(f["pairs_gpt2.toml"]), "--storage", new],
                               "does not support model type 'gpt2'"),
        # studies, show, export: read-only, on a mistyped or foreign database
        "studies on missing file": (["studies", "--storage", new], "does not exist"),
        "studies on directory": (["studies", "--storage", f"sqlite:///{f['adir']}"], "is a directory"),
        "studies on text file": (["studies", "--storage", f"sqlite:///{f['notdb.db']}"], "not an SQLite"),
        "studies malformed url": (["studies", "--storage", f"mysql://u:{SECRET}@h:port/db"], "malformed"),
        "show on missing file": (["show", "s", "--storage", new], "does not exist"),
        "show unknown study": (["show", "nope", "--storage", db], "no study 'nope'"),
        "show top zero": (["show", "s", "--storage", db, "--top", "0"], "--top"),
        "show without study": (["show", "--storage", db], "Missing argument"),
        "export to directory": (["export", "s", "--storage", db, "-o", str(f["adir"])], "is a directory"),
        "export to empty path": (["export", "s", "--storage", db, "-o", ""], "is a directory"),
        "export under /proc": (["export", "s", "--storage", db, "-o", "/proc/dimr-slim.json"], "cannot write"),
        "export to missing folder": (["export", "s", "--storage", db, "-o", str(tmp / "no" / "s.json")],
                                     "does not exist"),
        "export unknown trial": (["export", "s", "--storage", db, "-o", str(tmp / "o.json"), "--trial", "999"],
                                 "no trial 999"),
        "export trial and budget": (["export", "s", "--storage", db, "-o", str(tmp / "o.json"), "--trial", "0",
                                     "--budget", "2"], "not both"),
        "export unknown study": (["export", "nope", "--storage", db, "-o", str(tmp / "o.json")], "no study"),
        "export on missing file": (["export", "s", "--storage", new, "-o", str(tmp / "o.json")], "does not exist"),
        # decode, bench-decode
        "temperature nan": ([*d, "--temperature", "nan"], "not a finite number"),
        "temperature negative": ([*d, "--temperature=-1"], "temperature"),
        "top-p zero": ([*d, "--top-p", "0"], "top_p"),
        "gamma zero": ([*d, "--gamma", "0"], "gamma"),
        "draft-stop nan": ([*d, "--draft-stop", "nan"], "not a finite number"),
        "accept threshold inf": ([*d, "--accept-threshold", "inf"], "not a finite number"),
        "threads negative": ([*d, "--threads=-1"], "--threads"),
        "decode device unknown": ([*d, "--device", "banana"], "not a torch device"),
        "decode device unavailable": ([*d, "--device", "cuda:7"], "not available"),
        "prompts binary": ([*d[:5], "--prompts", str(f["binary.jsonl"])], "binary"),
        "prompts directory": ([*d[:5], "--prompts", str(f["adir"])], "directory"),
        "prompts missing": ([*d[:5], "--prompts", str(tmp / "none.jsonl")], "does not exist"),
        "prompts not json": ([*d[:5], "--prompts", str(f["prompts_bad.jsonl"])], "line 2 is not JSON"),
        "prompts without prompt": ([*d[:5], "--prompts", str(f["prompts_noprompt.jsonl"])], "no \"prompt\""),
        "prompt and prompts": ([*d, "--prompts", str(f["prompts_bad.jsonl"])], "exactly one"),
        "via without slim": (["decode", "--pair", "tiny-random", "--prompt", "hi"], "needs a slim"),
        "slim missing": ([*d, "--slim", str(tmp / "none.json")], "does not exist"),
        "slim binary": ([*d, "--slim", str(f["binary.bin"])], "binary"),
        "slim directory": ([*d, "--slim", str(f["adir"])], "directory"),
        "slim nested": ([*d, "--slim", str(f["slim_nested.json"])], "not valid JSON"),
        "slim wrong type": ([*d, "--slim", str(f["slim_type.json"])], "num_layers is str"),
        "slim mask length": ([*d, "--slim", str(f["slim_mask.json"])], "mask"),
        "slim kept layers": ([*d, "--slim", str(f["slim_kept.json"])], "kept_layers"),
        "slim schema": ([*d, "--slim", str(f["slim_schema.json"])], "schema"),
        "slim not an object": ([*d, "--slim", str(f["slim_list.json"])], "schema"),
        "slim other pair": ([*d, "--slim", str(f["slim_other_pair.json"])], "made for pair"),
        "bench unknown mode": (["bench-decode", "--pair", "tiny-random", "--modes", "ar,nope"], "unknown mode"),
        "bench self without slim": (["bench-decode", "--pair", "tiny-random", "--modes", "ar,self"], "slim"),
        "bench prompts binary": (["bench-decode", "--pair", "tiny-random", "--modes", "ar", "--prompts",
                                  str(f["binary.jsonl"])], "binary"),
        "pairs command binary file": (["pairs", pf, str(f["pairs_binary.toml"])], "binary"),
        "pairs command unknown key": (["pairs", pf, str(f["pairs_unknown.toml"])], "unknown key"),
        "unknown command": (["serach"], "serach"),
        # relaxed, zoo
        "diversed steps zero": (["diversed", "train", "--pair", "tiny-random", "--steps", "0"], "--steps"),
        "diversed threads negative": (["diversed", "train", "--pair", "tiny-random", "--threads=-2"], "--threads"),
        "diversed init-w one": (["diversed", "train", "--pair", "tiny-random", "--init-w", "1"], "--init-w"),
        "diversed reward of another task": (["diversed", "train", "--pair", "tiny-random", "--reward", "exact+sum"],
                                            "use exact or exact+steps"),
        "bench-relaxed unknown method": (["bench-relaxed", "--pair", "tiny-random", "--methods", "nope"],
                                         "unknown method"),
        "bench-relaxed bad workload": (["bench-relaxed", "--pair", "tiny-random", "--workloads", "poems"],
                                       "--workloads"),
        "bench-relaxed bad gammas": (["bench-relaxed", "--pair", "tiny-random", "--gammas", "a,b"], "--gammas"),
        "bench-relaxed threads negative": (["bench-relaxed", "--pair", "tiny-random", "--threads=-1"],
                                           "--threads"),
        "bench-relaxed resume without file": (["bench-relaxed", "--pair", "tiny-random", "--resume"],
                                              "--resume continues the rows of --json-out"),
        "bench-relaxed resume missing file": (["bench-relaxed", "--pair", "tiny-random", "--resume", "--json-out",
                                               str(tmp / "none.json")], "drop --resume"),
        "bench-relaxed resume not a run": (["bench-relaxed", "--pair", "tiny-random", "--resume", "--json-out",
                                            str(f["short.txt"])], "not a bench-relaxed JSON"),
        "bench-relaxed would overwrite": (["bench-relaxed", "--pair", "tiny-random", "--json-out",
                                           str(f["short.txt"])], "exists: add --resume"),
        "zoo eval-mini no pair": (["zoo", "eval-mini", "--model-dir", str(tmp / "none")], "no trained pair"),
        "zoo eval-mini write and quick": (["zoo", "eval-mini", "--write", "--quick"], "drop --quick"),
        "zoo train-mini steps zero": (["zoo", "train-mini", "--steps", "0"], "--steps"),
    }


def _case_names() -> list[str]:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        slim = Path(d) / "slim.json"
        slim.write_text("{}")
        return list(_cases(Path(d), "sqlite:///x.db", slim))


@pytest.mark.parametrize("case", _case_names())
def test_bad_input_one_line_exit_2_nothing_written(capsys, tmp_path, study_db, case):
    db, slim = study_db
    args, needle = _cases(tmp_path, db, slim)[case]
    files, rows = _files(tmp_path), _rows(db)
    code, out, err = cli(capsys, *args)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and SECRET not in err + out
    assert needle in lines[0], lines[0]
    assert _files(tmp_path) == files, "a refused command wrote a file"
    assert _rows(db) == rows, "a refused command wrote rows"


def test_read_only_commands_create_no_tables_on_an_empty_postgres(capsys, pg_url):
    for args in (["studies"], ["show", "s"], ["export", "s", "-o", "/tmp/never.json"]):
        code, _, err = cli(capsys, *args, "--storage", pg_url)
        assert code == 2 and "holds no studies" in err, err
    assert _rows(pg_url) == {}


@pytest.mark.parametrize("args,needle", [
    (["search", "--pair", "tiny-random", "--trials", "6", "--storage", f"postgresql+nodriver://u:{SECRET}@h/db"],
     "driver"),
    (["studies", "--storage", "sqlite:///{tmp}/typo.db"], "does not exist"),
    (["decode", "--pair", "tiny-random", "--mode", "ar", "--prompt", "x", "--temperature", "nan"], "finite"),
])
def test_real_process_exit_codes(tmp_path, args, needle):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    p = subprocess.run([sys.executable, "-m", "dimr", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and SECRET not in p.stderr, p.stderr
    assert not list(tmp_path.iterdir())


def test_user_strings_print_verbatim(capsys, tmp_path):
    """A study named like a rich emoji code or markup prints as it is, so it can be copied back."""
    sys.path.insert(0, str(ROOT / "tests"))
    from fault_driver import settings

    from dimr.search import Search, SearchOptions
    from storage import open_storage
    from workers.synthetic import SleepEvaluator, SleepSpec

    url = f"sqlite:///{tmp_path / 'd.db'}"
    for name in ("run:fire:1", "[bold]x[/]"):
        Search(open_storage(url), name, settings(), SearchOptions(2, 0, "swap", 0),
               SleepEvaluator(SleepSpec(latency_s=0))).run()
    code, out, _ = cli(capsys, "studies", "--storage", url, "--json")
    assert code == 0 and {r["study"] for r in json.loads(out)} == {"run:fire:1", "[bold]x[/]"}
    for name in ("run:fire:1", "[bold]x[/]"):
        code, out, _ = cli(capsys, "show", name, "--storage", url)
        assert code == 0 and out.startswith(f"{name}  pair synthetic"), out


# --- seeded fuzz of the two loaders ------------------------------------------------------------------------------

SLIM_TYPES = {"schema": str, "pair": str, "verifier": str, "fingerprint": str, "num_layers": int, "kept_layers": list,
              "mask": str, "cost": str, "metrics": dict, "calibration": str, "calibration_hash": str,
              "revision": (str, type(None)), "commit": (str, type(None)), "weights": (str, type(None)),
              "study": (str, type(None)), "trial": (int, type(None)),
              "dimr_version": str, "created_at": str}


def _slim_mutations(good: dict, rng: random.Random) -> list[dict]:
    """Mutations of a valid slim config that must all be refused."""
    out: list[dict] = []
    junk = [None, True, -1, 0, 1.5, "", "x", [], {}, [1, "a"], {"a": []}, "1" * 5000, 10**30]
    for _ in range(150):
        cfg, key = copy.deepcopy(good), rng.choice(sorted(good))
        kind = rng.randrange(4)
        if kind == 0:  # a wrong-typed value
            cfg[key] = rng.choice([v for v in junk if isinstance(v, bool) or not isinstance(v, SLIM_TYPES[key])])
        elif kind == 1:  # a field missing, or one more
            if key in ("revision", "commit", "weights", "study", "trial", "dimr_version", "created_at"):
                cfg[f"x_{key}"] = 1
            else:
                del cfg[key]
        elif kind == 2:  # the mask disagreeing with num_layers or kept_layers
            which = rng.randrange(4)
            if which == 0:
                cfg["num_layers"] += rng.choice([-1, 1, 100])
            elif which == 1:
                i = rng.randrange(len(cfg["mask"]))
                cfg["mask"] = cfg["mask"][:i] + ("0" if cfg["mask"][i] == "1" else "1") + cfg["mask"][i + 1:]
            elif which == 2:
                cfg["kept_layers"] = sorted(set(cfg["kept_layers"]) ^ {rng.randrange(cfg["num_layers"] + 3)})
            else:
                cfg["mask"] = rng.choice(["", "0" * cfg["num_layers"], "2" * cfg["num_layers"], "1" * 9000])
        else:  # out-of-range or malformed values
            cfg.update(rng.choice([{"num_layers": 0}, {"num_layers": -8}, {"trial": -1}, {"fingerprint": "abc"},
                                   {"fingerprint": "Z" * 64}, {"cost": "nope"}, {"metrics": {"cost": "high"}},
                                   {"metrics": {"cost": True}}, {"metrics": []}, {"pair": ""}, {"verifier": " "},
                                   {"schema": "dimr.slim-config/2"}]))
        out.append(cfg)
    return out


def test_fuzz_slim_config_loader(tmp_path, study_db):
    _, slim = study_db
    good = json.loads(slim.read_text())
    load_slim_config(slim)
    rng = random.Random(20261201)
    path = tmp_path / "m.json"
    refused = 0
    for cfg in _slim_mutations(good, rng):
        path.write_text(json.dumps(cfg))
        with pytest.raises(DimrError):
            load_slim_config(path)
        refused += 1
    raw = slim.read_bytes()
    for _ in range(150):  # byte-level damage: refused, or (a harmless byte in a string) loaded; never a crash
        b = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            op, i = rng.randrange(3), rng.randrange(len(b))
            if op == 0:
                b[i] = rng.randrange(256)
            elif op == 1:
                del b[i:]
            else:
                b[i:i] = _random_bytes(rng, rng.randint(1, 8))
        path.write_bytes(bytes(b))
        try:
            load_slim_config(path)
        except DimrError:
            refused += 1
    assert refused >= 250


def _random_bytes(rng: random.Random, n: int) -> bytes:
    return bytes(rng.randrange(256) for _ in range(n))


TOML_GOOD = {"draft": "models/draft", "verifier": "models/verifier", "revision": "main", "dtype": "float32",
             "calibration": "calib.txt", "description": "a pair"}


def _toml(pairs: dict) -> str:
    lines = []
    for name, spec in pairs.items():
        lines.append(f'[pairs."{name}"]')
        for k, v in spec.items():
            lines.append(f"{k} = {json.dumps(v) if not isinstance(v, bool) else str(v).lower()}")
    return "\n".join(lines) + "\n"


def test_fuzz_pairs_toml_loader(tmp_path):
    from dimr.pairs import _user_pairs

    rng = random.Random(1201)
    path = tmp_path / "pairs.toml"
    path.write_text(_toml({"p": TOML_GOOD}))
    pair = _user_pairs(path)["p"]
    assert pair.calibration == str((tmp_path / "calib.txt").resolve())  # relative to the TOML file
    refused = 0
    for _ in range(150):  # structural: each refused
        spec, key = dict(TOML_GOOD), rng.choice(sorted(TOML_GOOD))
        kind = rng.randrange(3)
        if kind == 0:
            spec[key] = rng.choice([3, 1.5, True, [1], {"a": 1}, ["x"]] + ([""] if key != "description" else []))
        elif kind == 1:
            if key in ("draft", "verifier"):
                del spec[key]
            else:
                spec[rng.choice(["colour", "layers", "Draft", "verifier_path"])] = "x"
        else:
            spec["dtype"] = rng.choice(["int4", "fp32", "", "Float32", "auto "])
        path.write_text(_toml({"p": spec}))
        with pytest.raises(DimrError):
            _user_pairs(path)
        refused += 1
    raw = _toml({"p": TOML_GOOD}).encode()
    for _ in range(150):  # byte-level damage: refused or loaded; never a crash
        b = bytearray(raw)
        i = rng.randrange(len(b))
        b[i:i + rng.randint(0, 3)] = _random_bytes(rng, rng.randint(1, 3))
        path.write_bytes(bytes(b))
        try:
            _user_pairs(path)
        except DimrError:
            refused += 1
    assert refused >= 250


def test_train_mini_checkpoints_load_weights_only(tmp_path):
    """A checkpoint holding a pickled object (code on load) is refused: `weights_only=True`."""
    import pickle

    import torch

    from dimr.zoo.train_mini import load_checkpoint

    path = tmp_path / "x.ckpt"
    torch.save({"model": {}, "step": 1, "evil": optuna.study.StudyDirection}, path)
    with pytest.raises(pickle.UnpicklingError):
        load_checkpoint(path)
    torch.save({"model": {"w": torch.ones(2)}, "step": 3, "elapsed": 1.5, "losses": [1.0]}, path)
    assert load_checkpoint(path)["step"] == 3


def test_ci_requires_the_databases():
    assert "DIMR_REQUIRE_DB=1" in (ROOT / ".ci" / "run").read_text()


def test_absent_database_server_skips_unless_required(tmp_path):
    """Without a PostgreSQL server a test that needs one is skipped with the reason; DIMR_REQUIRE_DB=1 fails it."""
    test = tmp_path / "test_needs_pg.py"
    test.write_text("def test_x(pg_url):\n    pass\n")
    shutil_copy = (ROOT / "tests" / "conftest.py").read_text()
    (tmp_path / "conftest.py").write_text(shutil_copy)
    env = {**os.environ, "DIMR_TEST_PG": "postgresql+psycopg://postgres@127.0.0.1:1/test", "PYTHONPATH": str(ROOT)}
    env.pop("DIMR_REQUIRE_DB", None)
    run = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(test)]
    skipped = subprocess.run(run, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout and "not reachable" in skipped.stdout
    failed = subprocess.run(run, capture_output=True, text=True, cwd=tmp_path, env={**env, "DIMR_REQUIRE_DB": "1"},
                            timeout=120)
    assert failed.returncode == 1 and "DIMR_REQUIRE_DB=1 requires it" in failed.stdout

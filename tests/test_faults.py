"""Fault injection through real processes and real databases: kills at exact set-up points and at random
moments, a PostgreSQL outage (a private server this module starts on its own port), a read-only SQLite file,
a full disk, kills during export, and a Ray driver killed with kill -9.

Every check reads the database with plain `optuna.load_study` and SQL, never with dimr's own readers: completed
trials are unchanged, the count is exact after resume, no mask is completed twice, nothing is left RUNNING.
"""

from __future__ import annotations

import glob
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from optuna.trial import TrialState

ROOT = Path(__file__).resolve().parents[1]
DRIVER = [sys.executable, str(ROOT / "tests" / "fault_driver.py")]
SETUP_POINTS = ("setup:before-create", "setup:before-commit", "setup:after-commit")


def drive(url: str, trials: int, *extra: str, env: dict | None = None, timeout: float = 120,
          study: str = "s") -> subprocess.CompletedProcess:
    return subprocess.run([*DRIVER, url, study, str(trials), *extra], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def start(url: str, trials: int, *extra: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([*DRIVER, url, "s", str(trials), *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def trials_of(url: str, study: str = "s") -> list[optuna.trial.FrozenTrial]:
    storage = optuna.storages.RDBStorage(url)
    try:
        return optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)
    finally:
        storage.engine.dispose()


def sql(url: str, query: str) -> list[tuple]:
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as c:
            return [tuple(r) for r in c.exec_driver_sql(query)]
    finally:
        engine.dispose()


def completed(url: str) -> dict[int, tuple[str, float]]:
    return {t.number: (t.user_attrs["mask"], t.value) for t in trials_of(url) if t.state == TrialState.COMPLETE}


def check_finished(url: str, trials: int, before: dict[int, tuple[str, float]] | None = None) -> None:
    """Exactly ``trials`` complete, unique masks, nothing RUNNING, ``before`` unchanged, and the ledger
    agreeing (one complete row per completed mask)."""
    ts = trials_of(url)
    done = {t.number: (t.user_attrs["mask"], t.value) for t in ts if t.state == TrialState.COMPLETE}
    assert len(done) == trials
    masks = [m for m, _ in done.values()]
    assert len(set(masks)) == len(masks), "a mask was completed twice"
    assert not [t.number for t in ts if t.state == TrialState.RUNNING]
    for number, value in (before or {}).items():
        assert done[number] == value, f"completed trial {number} changed"
    ledger = sql(url, "SELECT mask_key FROM dimr_masks WHERE state = 'complete'")
    assert sorted(k for (k,) in ledger) == sorted(masks)


def one_line_error(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for w in words:
        assert w in lines[0]


# --- a private PostgreSQL server -------------------------------------------------------------------------------

def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl")) or [p for p in [shutil.which("pg_ctl")] if p]
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivatePostgres:
    """A PostgreSQL cluster of this test module: `initdb` in a temp dir, `pg_ctl` on its own port, as the
    ``postgres`` user when run as root (initdb refuses root)."""

    def __init__(self):
        bindir = _pg_bin()
        if bindir is None:
            pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
        self.bin, self.port = bindir, _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="dimr-pg-"))
        self.data, self.log = self.dir / "data", self.dir / "log"
        self.user = "postgres" if os.geteuid() == 0 else None
        if self.user:
            shutil.chown(self.dir, self.user)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.start()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        cmd = [str(self.bin / tool), *args]
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-o",
                  f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def fresh_db(self) -> str:
        name = f"d{random.getrandbits(40):x}"
        engine = sqlalchemy.create_engine(self.url, isolation_level="AUTOCOMMIT")
        with engine.connect() as c:
            c.exec_driver_sql(f"CREATE DATABASE {name}")
        engine.dispose()
        return self.url.rsplit("/", 1)[0] + "/" + name

    def close(self) -> None:
        try:
            self.stop()
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def private_pg():
    pg = PrivatePostgres()
    yield pg
    pg.close()


@pytest.fixture(params=["sqlite", "postgres"])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'dimr.db'}"
    return request.getfixturevalue("private_pg").fresh_db()


# --- kills -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("point", SETUP_POINTS)
def test_kill_at_each_setup_point_then_resume(url, point):
    killed = drive(url, 12, env={"DIMR_CRASH_AT": point})
    assert killed.returncode == -signal.SIGKILL
    studies = sql(url, "SELECT study_name FROM studies")
    if point == "setup:after-commit":  # the whole set-up is there: settings and every seed
        (study_id,) = sql(url, "SELECT study_id FROM studies")[0]
        keys = {k for (k,) in sql(url, f"SELECT key FROM study_user_attributes WHERE study_id = {study_id}")}
        assert {"dimr_settings", "dimr_seeds"} <= keys  # (and one attribute per setting, for the dashboard)
        (seeds,) = sql(url, "SELECT value_json FROM study_user_attributes WHERE key = 'dimr_seeds'")[0]
        assert sql(url, "SELECT count(*) FROM trials WHERE state = 'WAITING'")[0][0] == json.loads(seeds) > 0
    else:  # nothing of the study
        assert studies == []
    resumed = drive(url, 12)
    assert resumed.returncode == 0, resumed.stderr
    assert "not made by dimr" not in resumed.stderr
    check_finished(url, 12)
    seeds = [t for t in trials_of(url) if t.user_attrs.get("phase") == "seed"]
    assert seeds and all(t.state == TrialState.COMPLETE for t in seeds)


def test_kill_before_the_profile_is_stored_then_resume(url):
    """Killed after scoring the single-skip profile, before storing it: the study has no profile (its trials are
    intact), and the next run scores it again and stores it."""
    killed = drive(url, 12, env={"DIMR_CRASH_AT": "profile:before-publish"})
    assert killed.returncode == -signal.SIGKILL
    (study_id,) = sql(url, "SELECT study_id FROM studies")[0]
    keys = {k for (k,) in sql(url, f"SELECT key FROM study_user_attributes WHERE study_id = {study_id}")}
    assert "dimr_seeds" in keys and "dimr_profile" not in keys
    resumed = drive(url, 12)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["profiled"] == 8
    check_finished(url, 12)
    (profile,) = sql(url, "SELECT value_json FROM study_user_attributes WHERE key = 'dimr_profile'")[0]
    assert len(json.loads(profile)) == 8


@pytest.mark.parametrize("seed", [1, 2])
def test_random_kills_lose_nothing(url, seed):
    rng, before, kills = random.Random(seed), {}, 0
    for _ in range(3):  # 0.3 s evaluations: no run can finish its remaining trials before its kill (≤ 4 s)
        proc = start(url, 40, "--latency", "0.3")
        time.sleep(rng.uniform(1.5, 4.0))
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        kills += proc.returncode == -signal.SIGKILL
        try:
            now = completed(url)
        except (KeyError, sqlalchemy.exc.SQLAlchemyError):  # killed before the study (or its tables) existed
            continue
        for number, value in before.items():
            assert now[number] == value
        before = now
    assert kills >= 2
    final = drive(url, 40)
    assert final.returncode == 0, final.stderr
    check_finished(url, 40, before)


# --- database faults -------------------------------------------------------------------------------------------

def test_postgres_outage_short_is_ridden_out_long_is_one_line(private_pg):
    url = private_pg.fresh_db()
    env = {"DIMR_DB_RETRY_S": "8"}
    proc = start(url, 20, "--latency", "0.2", env=env)
    _wait_for_complete(url, 3)
    private_pg.stop()
    time.sleep(3)
    private_pg.start()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err  # a 3 s outage: retried, finished
    check_finished(url, 20)

    proc = start(url, 50, "--latency", "0.2", env=env)  # 56 masks skip 3 of 8 layers
    _wait_for_complete(url, 23)
    before = completed(url)
    private_pg.stop()
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        private_pg.start()
    one_line_error(subprocess.CompletedProcess(proc.args, proc.returncode, out, err), "lost the database")
    running = [t.number for t in trials_of(url) if t.state == TrialState.RUNNING]
    resumed = drive(url, 50)
    assert resumed.returncode == 0, resumed.stderr
    check_finished(url, 50, before)
    failed = {t.number for t in trials_of(url) if t.state == TrialState.FAIL}
    assert set(running) <= failed  # the trials in flight were failed by the next run, and retried


def test_psycopg_pipeline_cleanup_warning_is_not_printed():
    """When the server goes away inside a pipeline, psycopg warns that it could not end the pipeline on the lost
    connection; the command's own one-line error says so already. That warning alone is dropped: psycopg's other
    warnings still reach stderr."""
    code = ("import logging, storage.rdb; log = logging.getLogger('psycopg'); "
            "log.warning('error ignored terminating %r: %s', '<psycopg.Pipeline [BAD]>', 'the connection is lost'); "
            "log.warning('another warning')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines() == ["another warning"]


def _wait_for_complete(url: str, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if sql(url, "SELECT count(*) FROM trials WHERE state = 'COMPLETE'")[0][0] >= n:
                return
        except sqlalchemy.exc.SQLAlchemyError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} trials completed within {timeout} s")


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


def test_read_only_sqlite_is_one_line_and_unchanged(tmp_path):
    rw, ro = tmp_path / "rw", tmp_path / "ro"
    rw.mkdir()
    ro.mkdir()
    url = f"sqlite:///{rw / 'dimr.db'}"
    assert drive(url, 5).returncode == 0
    if os.geteuid() == 0:  # root ignores file modes: a read-only bind mount
        if not (_mount("--bind", str(rw), str(ro)) and _mount("-o", "remount,bind,ro", str(ro))):
            pytest.skip("cannot make a read-only bind mount here (no mount privilege)")
        target = f"sqlite:///{ro / 'dimr.db'}"
    else:
        (rw / "dimr.db").chmod(0o444)
        rw.chmod(0o555)
        target = url
    try:
        before = sql(url, "SELECT count(*) FROM trials")
        proc = drive(target, 10)
        one_line_error(proc, "refuses writes")
        assert sql(url, "SELECT count(*) FROM trials") == before
    finally:
        if os.geteuid() == 0:
            _mount_cleanup(ro)
        else:
            rw.chmod(0o755)
            (rw / "dimr.db").chmod(0o644)
    assert drive(url, 10).returncode == 0
    check_finished(url, 10)


def _mount_cleanup(path: Path) -> None:
    subprocess.run(["umount", str(path)], capture_output=True)


def test_full_disk_is_one_line_then_resumes(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if not _mount("-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)):
        pytest.skip("cannot mount a small tmpfs here (no mount privilege) to fill a disk")
    try:
        url = f"sqlite:///{disk / 'dimr.db'}"
        assert drive(url, 5).returncode == 0
        before = completed(url)
        filler = disk / "filler"
        try:
            with open(filler, "wb") as f:  # every free block
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
        except OSError:
            pass
        proc = drive(url, 50)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        export = subprocess.run([sys.executable, "-m", "dimr", "export", "s", "--storage", url, "-o",
                                 str(disk / "slim.json")], capture_output=True, text=True, cwd=ROOT, timeout=120)
        one_line_error(export, "cannot write")
        assert not list(disk.glob("*slim.json*"))
        filler.unlink()
        resumed = drive(url, 30)
        assert resumed.returncode == 0, resumed.stderr
        check_finished(url, 30, before)
    finally:
        _mount_cleanup(disk)


def test_ctrl_c_exits_130_and_says_what_was_saved(tmp_path):
    url = f"sqlite:///{tmp_path / 'dimr.db'}"
    cmd = [sys.executable, "-m", "dimr", "search", "--pair", "tiny-random", "--budget", "3", "--trials", "50",
           "--num-sequences", "2", "--seq-len", "16", "--storage", url, "--study", "c"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as in a terminal
    _wait_for_complete(url, 3, timeout=120)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("interrupted: study c keeps ") and "Traceback" not in err, err
    ts = trials_of(url, "c")
    assert int(line.split(" keeps ")[1].split()[0]) == sum(t.state == TrialState.COMPLETE for t in ts)
    assert not [t for t in ts if t.state == TrialState.RUNNING]  # handed back before exiting


# --- export ----------------------------------------------------------------------------------------------------

def test_kill_during_export_leaves_the_old_file_and_no_stray(tmp_path):
    url = f"sqlite:///{tmp_path / 'dimr.db'}"
    assert drive(url, 6).returncode == 0
    out = tmp_path / "slim.json"
    export = [sys.executable, "-m", "dimr", "export", "s", "--storage", url, "-o", str(out)]
    first = subprocess.run(export, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert first.returncode == 0, first.stderr
    old = out.read_bytes()
    killed = subprocess.run(export, capture_output=True, text=True, cwd=ROOT, timeout=120,
                            env={**os.environ, "DIMR_CRASH_AT": "export:before-rename"})
    assert killed.returncode == -signal.SIGKILL
    assert out.read_bytes() == old  # never a partial file
    assert len(list(tmp_path.glob(".slim.json.*.tmp"))) == 1  # what the kill left
    again = subprocess.run(export, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert again.returncode == 0, again.stderr
    assert json.loads(out.read_text())["trial"] == json.loads(old)["trial"]
    assert not list(tmp_path.glob(".slim.json.*.tmp"))  # swept by the next export


# --- Ray -------------------------------------------------------------------------------------------------------

def _processes_naming(text: str) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text.encode() in (entry / "cmdline").read_bytes():
                out.append(int(entry.name))
        except OSError:
            pass
    return out


def test_ray_driver_killed_leaves_no_process_and_no_temp_dir(tmp_path):
    pytest.importorskip("ray")
    ray_temp = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))  # short: Ray's unix sockets live under it
    url = f"sqlite:///{tmp_path / 'dimr.db'}"
    proc = start(url, 40, "--workers", "2", "--latency", "0.2", "--ray-temp", str(ray_temp))
    _wait_for_complete(url, 2, timeout=120)
    assert _processes_naming(str(ray_temp))  # Ray runs under the temp dir
    before = completed(url)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (_processes_naming(str(ray_temp)) or list(ray_temp.iterdir())):
        time.sleep(0.5)
    assert not _processes_naming(str(ray_temp)), "a Ray process outlived its driver"
    assert not list(ray_temp.iterdir()), "the Ray temp dir (with its auth token) was left behind"
    ray_temp.rmdir()
    resumed = drive(url, 40)
    assert resumed.returncode == 0, resumed.stderr
    check_finished(url, 40, before)

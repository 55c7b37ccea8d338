"""The Ray worker pool and the search driver on a real Ray instance and the local PostgreSQL server.

One private Ray instance serves the module (the test process is its head); CLI drivers run as
subprocesses that join it by address, as `dimr search --ray-address` does on a cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from optuna.trial import TrialState

from dimr.calibration import load_calibration
from dimr.masks import Budget
from dimr.pairs import get_pair, load_tokenizer
from dimr.search import Search, SearchOptions, StudySettings
from storage import open_storage
from workers import EvalSpec
from workers.local import MaskScorer

ray = pytest.importorskip("ray")
from workers.ray_pool import LocalRay, RayPool, cpu_share  # noqa: E402
from workers.synthetic import SleepActor, SleepSpec  # noqa: E402

SKIP, SEQS, LEN = 3, 4, 32
CLI = [sys.executable, "-m", "dimr", "search", "--pair", "tiny-random", "--budget", str(SKIP),
       "--num-sequences", str(SEQS), "--seq-len", str(LEN), "--startup-trials", "4", "--study", "s", "--json"]


@pytest.fixture(scope="module")
def cluster():
    local = LocalRay(num_cpus=2)
    yield local
    local.close()


@pytest.fixture(scope="module")
def setup():
    pair = get_pair("tiny-random")
    calib = load_calibration(pair.calibration, load_tokenizer(pair), num_sequences=SEQS, seq_len=LEN)
    settings = StudySettings.for_pair(pair, Budget(8, SKIP), calib)
    return settings, EvalSpec(pair=pair, input_ids=calib.input_ids, cost="kl")


def trials(url: str, study: str = "s") -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=study, storage=open_storage(url)).trials


def complete_masks(url: str) -> list[str]:
    return [t.user_attrs["mask"] for t in trials(url) if t.state == TrialState.COMPLETE]


def drain(pool: RayPool, n: int) -> dict:
    got: dict = {}
    while len(got) < n:
        got.update(pool.wait(timeout=30))
    return got


def test_cpu_share_leaves_a_core_free():
    assert cpu_share(2, 2) == 0.5 and cpu_share(2, 64) * 64 <= 1.0
    assert cpu_share(16, 4) == 0.5 and cpu_share(1, 4) == 0.01


def test_pool_scores_like_the_local_scorer(cluster, setup):
    _, spec = setup
    pool = RayPool(spec, workers=2, address=cluster.address)
    try:
        assert pool.slots == 2 and pool.num_layers == 8
        assert pool.ahead == 0 and pool.depth == 1  # a small pool: one task per actor, as ever
        assert ray.available_resources().get("CPU", 0) >= 1  # the actors leave a core to everything else
        masks = [tuple(i not in (j, j + 1, j + 2) for i in range(8)) for j in range(4)]
        for ticket, mask in enumerate(masks):
            pool.submit(ticket, mask)
        got = drain(pool, len(masks))
        local = MaskScorer(spec)
        for ticket, mask in enumerate(masks):
            ev = got[ticket]
            assert ev.mask == mask and ev.worker in ("ray-0", "ray-1")
            assert ev.cost == pytest.approx(local.score(mask).cost, rel=1e-4, abs=1e-6)
        assert {ev.worker for ev in got.values()} == {"ray-0", "ray-1"}  # both actors took work
        assert pool.block_influence() == pytest.approx(local.block_influence(), rel=1e-4)
    finally:
        pool.close()


class KillingPool(RayPool):
    """The real pool; from ticket ``at`` on, once, it SIGKILLs the process of the actor that gets the next
    mask (`_dispatch` gives it to the first idle actor), and after that only the same actor (``victim``)."""

    def __init__(self, *args, at: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.at, self.killed, self.victim = at, [], None

    def submit(self, ticket, mask):
        if ticket >= self.at and not self.killed and "idle" in self._state:
            i = self._state.index("idle")
            if self.victim in (None, i):
                self.victim = i
                self.killed.append((ticket, ray.get(self._actors[i].pid.remote())))
                os.kill(self.killed[-1][1], signal.SIGKILL)
        super().submit(ticket, mask)


def test_actor_killed_mid_trial_is_retried_then_pool_shrinks(cluster, setup, pg_url):
    settings, spec = setup
    pool = KillingPool(spec, workers=2, address=cluster.address, max_restarts=1, at=6)
    try:
        before = set(pool.worker_pids())
        result = Search(open_storage(pg_url), "s", settings, SearchOptions(14, 4), pool).run()
        assert result.complete == 14 and len(pool.killed) == 1
        ticket, pid = pool.killed[0]
        ts = trials(pg_url)
        killed = ts[ticket]
        assert killed.state == TrialState.FAIL and "Actor" in killed.user_attrs["error"]
        retry = [t for t in ts if t.user_attrs.get("retry_of") == ticket]
        assert len(retry) == 1 and retry[0].state == TrialState.COMPLETE
        assert retry[0].user_attrs["mask"] == killed.user_attrs["mask"]
        masks = complete_masks(pg_url)
        assert len(masks) == 14 == len(set(masks))
        # the actor restarts (verifier reloaded, new process) and the pool is whole again
        while len(pool.worker_pids()) < 2:
            pool.wait(timeout=1)
        after = set(pool.worker_pids())
        assert pool.slots == 2 and pid not in after and len(after & before) == 1
        # out of restarts: the next kill shrinks the pool, and the study still gets its trials
        pool.at, pool.killed = len(ts), []
        result = Search(open_storage(pg_url), "s", settings, SearchOptions(28, 4), pool).run()
        assert result.complete == 28 and len(pool.killed) == 1
        for _ in range(300):  # the pool learns the actor is gone for good when its probe fails
            if pool.slots == 1:
                break
            pool.wait(timeout=1)
        assert pool.slots == 1 and len(pool.worker_pids()) == 1
        masks = complete_masks(pg_url)
        assert len(masks) == 28 == len(set(masks))
    finally:
        pool.close()


def test_pool_of_four_runs_two_deep_without_the_driver(cluster):
    pool = RayPool(SleepSpec(latency_s=0.4), workers=4, address=cluster.address, actor_cls=SleepActor)
    try:
        assert pool.slots == 4 and pool.ahead == 4 and pool.depth == 2
        masks = [tuple(i not in (j % 8, (j + 3) % 8) for i in range(8)) for j in range(9)]
        for ticket, mask in enumerate(masks):
            pool.submit(ticket, mask)
        assert pool._load == [2, 2, 2, 2] and len(pool._queue) == 1  # idle actors first, then two deep
        time.sleep(1.2)  # no driver call in here
        first_call = time.time()
        got = drain(pool, len(masks))
        by_worker: dict[str, list] = {}
        for ticket in range(8):
            by_worker.setdefault(got[ticket].worker, []).append(got[ticket].extra)
        assert len(by_worker) == 4
        for first, second in (sorted(runs, key=lambda r: r["started"]) for runs in by_worker.values()):
            # one after the other on the actor, and the second began before the driver called the pool again
            assert first["ended"] <= second["started"] < first_call
        assert got[8].extra["started"] >= first_call  # the ninth mask waited in the pool's queue for a driver call
        assert pool._load == [0, 0, 0, 0] and pool._state == ["idle"] * 4
    finally:
        pool.close()


class DeepKillingPool(RayPool):
    """The real pool; once, after a submit from ticket ``at`` on leaves an actor with two tasks outstanding,
    it SIGKILLs that actor's process (``killed``: the two tickets and the pid)."""

    def __init__(self, *args, at: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.at, self.killed = at, None
        self.pids = self.worker_pids()  # asked now: a busy actor answers only after its score tasks

    def submit(self, ticket, mask):
        super().submit(ticket, mask)
        if ticket >= self.at and self.killed is None and 2 in self._load:
            i = self._load.index(2)
            tickets = sorted(t for t, j, _ in self._work.values() if j == i)
            self.killed = (tickets, self.pids[i])
            os.kill(self.pids[i], signal.SIGKILL)


def test_actor_killed_with_two_tasks_outstanding(cluster, pg_url):
    settings = StudySettings(pair="sleep", verifier="sleep", fingerprint="-", num_layers=8, skip=3, cost="kl",
                             calibration="-", calibration_hash="-", num_sequences=0, seq_len=0)
    pool = DeepKillingPool(SleepSpec(latency_s=0.3), workers=4, address=cluster.address, actor_cls=SleepActor,
                           max_restarts=1, at=10)
    try:
        assert pool.ahead == 4
        result = Search(open_storage(pg_url), "s", settings, SearchOptions(30, 0, "swap", 0), pool).run()
        assert result.complete == 30 and pool.killed is not None
        tickets, pid = pool.killed
        assert len(tickets) == 2
        ts = trials(pg_url)
        for ticket in tickets:  # both die with the actor, and both masks are evaluated again
            assert ts[ticket].state == TrialState.FAIL and "Actor" in ts[ticket].user_attrs["error"]
            retry = [t for t in ts if t.user_attrs.get("retry_of") == ticket]
            assert len(retry) == 1 and retry[0].state == TrialState.COMPLETE
            assert retry[0].user_attrs["mask"] == ts[ticket].user_attrs["mask"]
        masks = complete_masks(pg_url)
        assert len(masks) == 30 == len(set(masks))
        assert sorted(result.retried) == tickets
        for _ in range(120):  # the actor restarts (a new process) and the pool is whole again
            if pool._state == ["idle"] * 4:
                break
            pool.wait(timeout=1)
        assert pool.slots == 4 and pool._load == [0] * 4 and not pool._work and not pool._probes
        assert pid not in pool.worker_pids()
    finally:
        pool.close()


def _cli(url: str, wanted: int, address: str, env: dict, workers: int = 2) -> subprocess.Popen:
    args = ["--trials", str(wanted), "--storage", url, "--workers", str(workers), "--ray-address", address]
    return subprocess.Popen(CLI + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _env(cluster: LocalRay) -> dict:
    return {**os.environ, **cluster.join_env(), "PYTHONPATH": os.getcwd()}


def test_two_cli_drivers_share_one_postgres_study(cluster, pg_url):
    procs = [_cli(pg_url, 16, cluster.address, _env(cluster)) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    results = [json.loads(out) for out, _ in outs]
    masks = complete_masks(pg_url)
    assert len(masks) == 16 == len(set(masks)), "a mask was completed twice"
    assert sum(r["evaluated"] for r in results) == 16  # nothing paid for twice
    assert all(r["complete"] == 16 for r in results)
    assert not [t for t in trials(pg_url) if t.state == TrialState.RUNNING]


def test_driver_sigkill_resumes_without_loss(cluster, pg_url):
    env = _env(cluster)
    proc = _cli(pg_url, 30, cluster.address, env, workers=1)  # one actor: a Ray pool all the same
    engine = sqlalchemy.create_engine(pg_url)
    count = "SELECT count(*) FROM trials WHERE state = 'COMPLETE'"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the driver never completed 10 trials"
            try:
                with engine.connect() as c:
                    if c.exec_driver_sql(count).scalar() >= 10:
                        break
            except sqlalchemy.exc.ProgrammingError:  # tables not created yet
                pass
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        before = trials(pg_url)
        done = {t.number: t.user_attrs["mask"] for t in before if t.state == TrialState.COMPLETE}
        stuck = [t for t in before if t.state == TrialState.RUNNING]
        with engine.connect() as c:  # every claimed trial has a heartbeat, so other hosts could fail it
            beats = {r[0] for r in c.exec_driver_sql("SELECT trial_id FROM trial_heartbeats")}
        # (a trial the driver had asked for but not yet claimed a mask for holds nothing: no owner, no beat)
        stuck = [t for t in stuck if "owner" in t.user_attrs]
        assert {t._trial_id for t in stuck} <= beats
    finally:
        engine.dispose()
        if proc.poll() is None:
            proc.kill()
    out = subprocess.run(CLI + ["--trials", "30", "--storage", pg_url, "--workers", "1", "--ray-address",
                                cluster.address], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    after = trials(pg_url)
    assert result["complete"] == 30 and result["evaluated"] == 30 - len(done)
    for number, mask in done.items():  # nothing completed was lost or touched
        assert after[number].state == TrialState.COMPLETE and after[number].user_attrs["mask"] == mask
    for t in stuck:  # the dead driver's trials failed, and their masks were evaluated again
        assert after[t.number].state == TrialState.FAIL
        assert [r.user_attrs["mask"] for r in after if r.user_attrs.get("retry_of") == t.number] == [
            t.user_attrs["mask"]]
    masks = complete_masks(pg_url)
    assert len(masks) == 30 == len(set(masks))


def test_cli_local_instance_writes_nothing_to_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    tmp = Path(tempfile.mkdtemp(prefix="dimr-t-"))  # short: Ray's socket paths live under TMPDIR
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(home), TMPDIR=str(tmp), PYTHONPATH=os.getcwd())
    url = f"sqlite:///{tmp_path / 'd.db'}"
    out = subprocess.run(CLI + ["--trials", "8", "--storage", url, "--workers", "2"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout)["complete"] == 8 == len(set(complete_masks(url)))
    assert not (home / ".ray").exists()
    assert not list(tmp.glob("dimr-ray-*")), "the run's Ray temp dir was left behind"
    shutil.rmtree(tmp)

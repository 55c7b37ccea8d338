"""Scale simulation of the search driver: 32 then 64 simulated workers on Ray, a study on PostgreSQL.

Each worker is a Ray actor whose "evaluation" is a synthetic cost of the mask plus a fixed latency
(1 s by default). The driver is the real `Search` (TPE with constant liar, the mask ledger, heartbeats)
behind the real `RayPool`; only the actor body is synthetic. Printed side by side per worker count:

* trials/s in steady state and end to end, against the ideal ``workers / latency``;
* the overhead that implies per 1 s evaluation (``ideal / achieved - 1``);
* the sampler's ask latency (and the whole ask: sampler + Optuna + ledger writes) per trial near 100, 500 and
  1000 completed trials (a batch ask's time shared by the trials it started), and trials per sampler call;
* the database's share of the driver's time per trial (SQL time / wall time per trial).

    python benchmarks/scale.py                     # 32 and 64 workers, 1000 trials each, 1 s latency
    python benchmarks/scale.py --workers 8 --trials 200 --latency 0.5
    python benchmarks/scale.py --workers 64 --samplers tpe swap   # also dimr's default sampler
"""

from __future__ import annotations

import argparse
import bisect
import os
import random
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sqlalchemy  # noqa: E402
from sqlalchemy import event  # noqa: E402

from dimr.search import Search, SearchOptions, StudySettings  # noqa: E402
from storage import open_storage  # noqa: E402
from workers.ray_pool import LocalRay, RayPool  # noqa: E402

ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
MARKS = (100, 500, 1000)


@dataclass(frozen=True)
class SyntheticSpec:
    """What a simulated worker needs (duck-types `EvalSpec` for the pool: ``device``)."""

    num_layers: int = 32
    latency_s: float = 1.0
    seed: int = 0
    device: str = "cpu"


@dataclass(frozen=True)
class SyntheticEval:
    """Duck-types `workers.base.Evaluation` without importing torch into 64 actor processes."""

    mask: tuple[bool, ...]
    cost: float
    seconds: float
    worker: str
    started: float = 0.0  # wall clock (time.time()) in the actor: this host's clock, as the driver's
    ended: float = 0.0

    def metrics(self) -> dict:
        return {"top1_agreement": 1.0, "expected_acceptance": 1.0, "tokens": 0, "seconds": self.seconds,
                "worker": self.worker}


class SyntheticScorer:
    """A Ray actor body with `ScorerActor`'s methods: cost = weights of the skipped layers + pair terms."""

    def __init__(self, spec: SyntheticSpec, name: str):
        rng = random.Random(spec.seed)
        self.spec, self.name = spec, name
        self.weights = [rng.random() * (1.5 if i in (0, spec.num_layers - 1) else 1.0)
                        for i in range(spec.num_layers)]

    def ready(self) -> int:
        return self.spec.num_layers

    def pid(self) -> int:
        return os.getpid()

    def score(self, mask: tuple[bool, ...]) -> SyntheticEval:
        started, t0 = time.time(), time.perf_counter()
        time.sleep(self.spec.latency_s)
        skipped = [i for i, keep in enumerate(mask) if not keep]
        runs = sum(b - a == 1 for a, b in zip(skipped, skipped[1:], strict=False))  # adjacent skips hurt more
        cost = sum(self.weights[i] for i in skipped) + 0.3 * runs
        return SyntheticEval(tuple(mask), cost, time.perf_counter() - t0, self.name, started, time.time())

    def block_influence(self) -> list[float]:
        return list(self.weights)


class TimedSearch(Search):
    """The real driver, timing its own steps (nothing replaced)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asks: list[tuple[int, float, float]] = []  # (trial started, 1-based; whole ask s, sampler s)
        self.done_at: list[float] = []  # monotonic time of each completion
        self.busy = {"ask": 0.0, "tell": 0.0, "check": 0.0}
        self._sampler_s = 0.0
        self.fits, self.started = 0, 0  # sampler calls (one fit each) and trials started
        base = self.sampler  # dimr's budget sampler, around TPE or the swap proposer
        base.propose = self._timed(base.propose)  # one call per ask: one trial, or a batch from one fit

    def _timed(self, inner):
        def timed(*args):
            t = time.perf_counter()
            self.fits += 1
            try:
                return inner(*args)
            finally:
                self._sampler_s += time.perf_counter() - t
        return timed

    def _ask(self, want: int = 1) -> int:
        """Timed per trial: a batch's ask and sampler time are shared by the trials it started."""
        self._sampler_s = 0.0
        before = len(self._inflight) + self.result.pruned_duplicates
        t = time.perf_counter()
        held = super()._ask(want)
        dt = time.perf_counter() - t
        self.busy["ask"] += dt
        n = max(1, len(self._inflight) + self.result.pruned_duplicates - before)
        self.started += n
        self.asks.extend((self.started - n + k + 1, dt / n, self._sampler_s / n) for k in range(n))
        return held

    def _tell(self, ticket, outcome) -> None:
        t = time.perf_counter()
        super()._tell(ticket, outcome)
        self.busy["tell"] += time.perf_counter() - t
        self.done_at.append(time.monotonic())

    def _fail_dead_trials(self) -> None:
        t = time.perf_counter()
        super()._fail_dead_trials()
        self.busy["check"] += time.perf_counter() - t


class SqlClock:
    """Wall time the driver's main thread spends inside SQL statements."""

    def __init__(self, engine: sqlalchemy.Engine):
        self.main = threading.main_thread().ident
        self.seconds, self.statements = 0.0, 0
        self._start: dict[int, float] = {}
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)

    def _before(self, *args) -> None:
        self._start[threading.get_ident()] = time.perf_counter()

    def _after(self, *args) -> None:
        ident = threading.get_ident()
        t0 = self._start.pop(ident, None)
        if t0 is not None and ident == self.main:
            self.seconds += time.perf_counter() - t0
            self.statements += 1


def fresh_database() -> tuple[str, callable]:
    name = f"dimr_scale_{uuid.uuid4().hex[:8]}"
    admin = sqlalchemy.create_engine(ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.exec_driver_sql(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with admin.connect() as c:
            c.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()

    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}", drop


def _pg_cpu(url: str, since: dict[int, float] | None = None) -> dict[int, float] | float:
    """CPU seconds of the PostgreSQL backends serving ``url``'s database (a local server: /proc)."""
    name = url.rsplit("/", 1)[1]
    admin = sqlalchemy.create_engine(ADMIN)
    with admin.connect() as c:
        pids = [r[0] for r in c.exec_driver_sql(f"SELECT pid FROM pg_stat_activity WHERE datname = '{name}'")]
    admin.dispose()
    tick = os.sysconf("SC_CLK_TCK")
    now = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            now[pid] = (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError):
            pass
    if since is None:
        return now
    return sum(v - since.get(pid, 0.0) for pid, v in now.items())


def _median_near(asks: list[tuple[int, float, float]], mark: int, col: int) -> float | None:
    """The median over the 20 trials started nearest the ``mark``-th (asks come in batches and waves)."""
    near = sorted(asks, key=lambda a: abs(a[0] - mark))[:20]
    return statistics.median(a[col] for a in near) if near and abs(near[0][0] - mark) <= mark // 10 else None


def _rate(done_at: list[float], lo: int, hi: int) -> float | None:
    if len(done_at) < hi:
        return None
    return (hi - lo) / (done_at[hi - 1] - done_at[lo - 1])


class Slots:
    """The pool, limited to ``n`` trials in flight: n simulated workers out of the pool's actors."""

    def __init__(self, pool: RayPool, n: int):
        self.pool, self.n, self.num_layers = pool, n, pool.num_layers
        self.submitted: list[float] = []  # wall clock of every submit, in order
        self.arrived: list[float] = []  # wall clock of every result handed to the driver, in order
        self.ray_ms: list[tuple[float, float]] = []  # per result: (submit → actor start, actor end → driver)
        self.runs: list[tuple[str, float, float]] = []  # per result: (worker, actor start, actor end), wall clock
        self._sent: dict[int, float] = {}

    @property
    def slots(self) -> int:
        return min(self.n, self.pool.slots)

    @property
    def ahead(self) -> int:
        """The pool's masks queued ahead, only when these ``n`` workers are the whole pool: with fewer, masks
        queued ahead would run on idle actors beyond ``n`` and the simulation would have more workers."""
        return min(self.pool.ahead, self.n) if self.n >= self.pool.slots else 0

    def submit(self, ticket: int, mask: tuple[bool, ...]) -> None:
        now = time.time()
        self.submitted.append(now)
        self._sent[ticket] = now
        self.pool.submit(ticket, mask)

    def wait(self, timeout: float | None = None):
        out = self.pool.wait(timeout)
        now = time.time()
        for ticket, ev in out:
            self.arrived.append(now)
            if isinstance(ev, SyntheticEval):
                self.ray_ms.append((1e3 * (ev.started - self._sent.pop(ticket)), 1e3 * (now - ev.ended)))
                self.runs.append((ev.worker, ev.started, ev.ended))
        return out

    def cycle_ms(self) -> dict[str, float]:
        """Where a worker's time between two evaluations goes, in the steady state: Ray's dispatch (submit →
        actor start; running ahead, this includes the wait behind the actor's running mask), Ray's return
        (actor end → the driver's wait returns), the driver's gap (a result arrived → the mask that refills
        the place it freed submitted; running ahead, that mask waits on the actor, not the actor on it), and
        the actor's idle gap (its end → its next start), means in ms."""
        n, ahead = len(self.ray_ms), self.ahead
        core = slice(n // 10, n - self.n - ahead)  # past the start, before the drain
        gaps = [1e3 * (s - a) for a, s in zip(self.arrived, self.submitted[self.n + ahead:], strict=False)][core]
        ray = self.ray_ms[core]
        starts: dict[str, list[float]] = {}
        for worker, start, _ in self.runs:
            starts.setdefault(worker, []).append(start)
        for v in starts.values():
            v.sort()
        idle = []
        for worker, start, end in self.runs[core]:
            later = starts[worker][bisect.bisect_right(starts[worker], start):]
            if later:
                idle.append(1e3 * (later[0] - end))
        mean = statistics.fmean
        return {"dispatch": mean(d for d, _ in ray), "return": mean(r for _, r in ray), "driver": mean(gaps),
                "idle": mean(idle) if idle else None}

    def block_influence(self) -> list[float]:
        return self.pool.block_influence()

    def close(self) -> None:
        pass


def run_one(pool: RayPool, workers: int, trials: int, latency: float, skip: int, sampler: str = "tpe") -> dict:
    url, drop = fresh_database()
    try:
        storage = open_storage(url)
        clock = SqlClock(storage.engine)
        layers = pool.num_layers
        settings = StudySettings(pair="synthetic", verifier="synthetic", fingerprint="-",
                                 num_layers=layers, skip=skip, cost="kl", calibration="-",
                                 calibration_hash="-", num_sequences=0, seq_len=0)
        options = SearchOptions(trials, 0 if sampler == "swap" else 10, sampler, 0)
        slots = Slots(pool, workers)
        search = TimedSearch(storage, "scale", settings, options, slots)
        sql0 = clock.seconds
        pg0 = _pg_cpu(url)
        t0, cpu0 = time.monotonic(), time.thread_time()
        result = search.run()
        wall, cpu = time.monotonic() - t0, time.thread_time() - cpu0
        pg = _pg_cpu(url, pg0)
        storage.engine.dispose()
    finally:
        drop()
    n = result.evaluated
    lo, hi = min(100, n // 10) or 1, max(1, n - workers)
    steady = _rate(search.done_at, lo, hi)
    ideal = workers / latency
    out = {"sampler": sampler, "workers": workers, "trials": n, "wall_s": wall, "ideal": ideal, "end_to_end": n / wall,
           "steady": steady, "overhead": (ideal / steady - 1) if steady else None,
           "sql_ms_per_trial": 1e3 * (clock.seconds - sql0) / n, "sql_per_trial": clock.statements / n,
           "db_share": (clock.seconds - sql0) / wall, "busy_share": sum(search.busy.values()) / wall,
           "busy": {k: v / wall for k, v in search.busy.items()},
           "cpu_ms_per_trial": 1e3 * cpu / n, "pg_cpu_ms_per_trial": 1e3 * pg / n,
           "per_fit": search.started / max(1, search.fits), "cycle": slots.cycle_ms(), "ahead": slots.ahead}
    for m in MARKS:
        out[f"ask_{m}"] = _median_near(search.asks, m, 1)
        out[f"sampler_{m}"] = _median_near(search.asks, m, 2)
        a, b = max(1, m - 100), min(m, n)
        out[f"rate_{m}"] = _rate(search.done_at, a, b) if b - a >= 50 else None
    return out


def _f(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_table(rows: list[dict], latency: float, file=None) -> None:
    lines = [
        ("sampler", lambda r: r.get("sampler", "tpe")),
        ("workers", lambda r: str(r["workers"])),
        ("completed trials", lambda r: str(r["trials"])),
        (f"ideal trials/s (workers / {latency:g} s)", lambda r: _f(r["ideal"], ".1f")),
        ("achieved trials/s, steady state", lambda r: _f(r["steady"], ".1f")),
        ("achieved trials/s, end to end", lambda r: _f(r["end_to_end"], ".1f")),
        (f"overhead per {latency:g} s evaluation", lambda r: _f(None if r["overhead"] is None
                                                                 else 100 * r["overhead"], ".1f") + " %"),
    ]
    lines += [(f"trials/s over trials {max(1, m - 100)}-{m}", lambda r, m=m: _f(r[f"rate_{m}"], ".1f"))
              for m in MARKS]
    lines += [("trials started per sampler call", lambda r: _f(r.get("per_fit"), ".1f"))]
    lines += [(f"sampler ask ms per trial @ trial {m}", lambda r, m=m: _f(r[f"sampler_{m}"] and 1e3 * r[f"sampler_{m}"],
                                                                ".1f")) for m in MARKS]
    lines += [(f"whole ask ms per trial @ trial {m}", lambda r, m=m: _f(r[f"ask_{m}"] and 1e3 * r[f"ask_{m}"], ".1f"))
              for m in MARKS]
    lines += [
        ("SQL statements per trial (driver)", lambda r: _f(r["sql_per_trial"], ".1f")),
        ("SQL ms per trial (driver)", lambda r: _f(r["sql_ms_per_trial"], ".2f")),
        ("database share of driver wall time", lambda r: _f(100 * r["db_share"], ".1f") + " %"),
        ("driver CPU ms per trial (main thread)", lambda r: _f(r["cpu_ms_per_trial"], ".1f")),
        ("PostgreSQL CPU ms per trial", lambda r: _f(r["pg_cpu_ms_per_trial"], ".1f")),
        ("driver+DB CPU per trial / evaluation", lambda r: _f(100 * (r["cpu_ms_per_trial"] + r["pg_cpu_ms_per_trial"])
                                                              / (1e3 * latency), ".1f") + " %"),
        ("one core's load at this worker count", lambda r: _f(r["workers"] / latency * (
            r["cpu_ms_per_trial"] + r["pg_cpu_ms_per_trial"]) / 10, ".0f") + " %"),
        ("driver busy share (ask+tell+checks)", lambda r: _f(100 * r["busy_share"], ".1f") + " %"),
        ("a worker's wait, ms: Ray dispatch", lambda r: _f(r["cycle"]["dispatch"], ".1f")),
        ("a worker's wait, ms: Ray return", lambda r: _f(r["cycle"]["return"], ".1f")),
        ("a worker's wait, ms: the driver", lambda r: _f(r["cycle"]["driver"], ".1f")),
        ("a worker's idle gap, ms (end -> next start)", lambda r: _f(r["cycle"]["idle"], ".1f")),
        ("masks queued ahead of the workers", lambda r: str(r.get("ahead", 0))),
    ]
    width = max(len(name) for name, _ in lines)
    for name, fn in lines:
        print(f"{name:<{width}}  " + "  ".join(f"{fn(r):>10}" for r in rows), file=file or sys.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--latency", type=float, default=1.0)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--skip", type=int, default=8)
    ap.add_argument("--samplers", nargs="+", default=["tpe"], choices=["tpe", "swap", "random"],
                    help="tpe: the issue's TPE with constant liar; swap: dimr's default")
    args = ap.parse_args()
    local = LocalRay(num_cpus=os.cpu_count() or 1)
    try:
        spec = SyntheticSpec(num_layers=args.layers, latency_s=args.latency)
        rows = []
        for w in args.workers:
            # A pool of exactly w actors: the pool runs ahead onto its own actors only (see `Slots.ahead`).
            t0 = time.monotonic()
            pool = RayPool(spec, workers=w, actor_cls=SyntheticScorer, cpus_per_worker=0.01, max_restarts=0)
            print(f"# {pool.slots} actors up in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
            for sampler in args.samplers:
                rows.append(run_one(pool, w, args.trials, args.latency, args.skip, sampler))
                print(f"# {sampler}, {w} workers done in {rows[-1]['wall_s']:.1f} s", file=sys.stderr, flush=True)
            pool.close()
            print_table(rows, args.latency, file=sys.stderr)  # partial results, in case of a long run
    finally:
        local.close()
    print_table(rows, args.latency)


if __name__ == "__main__":
    main()

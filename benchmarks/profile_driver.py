"""Profile the search driver alone: the real `Search` on PostgreSQL, 64 trials in flight, instant results.

    python benchmarks/profile_driver.py --sampler tpe --trials 300

No Ray and no latency: an in-process evaluator answers the oldest trial in flight at once, so every second
of the run is the driver's (sampler, Optuna, the ledger, SQL). Prints CPU per trial, SQL statements per trial
by kind, and cProfile's top functions by cumulative time. `benchmarks/scale.py` measures the same driver
behind real Ray actors.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import event  # noqa: E402

from benchmarks.scale import SyntheticScorer, SyntheticSpec, _pg_cpu, fresh_database  # noqa: E402
from dimr.search import Search, SearchOptions, StudySettings  # noqa: E402
from storage import open_storage  # noqa: E402


class Instant:
    """The `workers.Evaluator` interface with ``slots`` trials in flight, answered at once, oldest first."""

    def __init__(self, slots: int, num_layers: int):
        self.slots, self.num_layers = slots, num_layers
        self.scorer = SyntheticScorer(SyntheticSpec(num_layers=num_layers, latency_s=0.0), "instant")
        self.queue: list = []

    def submit(self, ticket: int, mask: tuple[bool, ...]) -> None:
        self.queue.append((ticket, mask))

    def wait(self, timeout: float | None = None):
        ticket, mask = self.queue.pop(0)
        return [(ticket, self.scorer.score(mask))]

    def block_influence(self) -> list[float]:
        return self.scorer.block_influence()

    def close(self) -> None:
        self.queue.clear()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sampler", default="tpe", choices=["tpe", "swap", "random"])
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--skip", type=int, default=8)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    url, drop = fresh_database()
    try:
        storage = open_storage(url)
        kinds: collections.Counter = collections.Counter()
        event.listen(storage.engine, "before_cursor_execute",
                     lambda conn, cursor, statement, *a: kinds.update([re.sub(r"\s+", " ", statement)[:80]]))
        settings = StudySettings(pair="synthetic", verifier="synthetic", fingerprint="-", num_layers=args.layers,
                                 skip=args.skip, cost="kl", calibration="-", calibration_hash="-",
                                 num_sequences=0, seq_len=0)
        options = SearchOptions(args.trials, 0 if args.sampler == "swap" else 10, args.sampler, 0)
        search = Search(storage, "profile", settings, options, Instant(args.slots, args.layers))
        kinds.clear()
        pg0 = _pg_cpu(url)
        profile = cProfile.Profile()
        cpu0, wall0 = time.thread_time(), time.monotonic()
        profile.enable()
        result = search.run()
        profile.disable()
        cpu, wall, n = time.thread_time() - cpu0, time.monotonic() - wall0, result.evaluated
        pg = _pg_cpu(url, pg0)
        storage.engine.dispose()
    finally:
        drop()
    print(f"{args.sampler}: {n} trials, {args.slots} in flight; driver CPU {1e3 * cpu / n:.1f} ms/trial (profiled), "
          f"PostgreSQL CPU {1e3 * pg / n:.1f} ms/trial, {sum(kinds.values()) / n:.1f} SQL statements/trial, "
          f"wall {wall:.1f} s")
    for statement, count in kinds.most_common(12):
        print(f"  {count / n:5.2f}/trial  {statement}")
    pstats.Stats(profile).sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()

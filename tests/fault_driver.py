"""A search driver for fault-injection tests, run as a real process: ``python tests/fault_driver.py URL STUDY
TRIALS [--workers N] [--latency S] [--ray-temp DIR]``.

The real `dimr.search.Search` on a real database, with a model-free evaluator (`workers.synthetic`): in-process
for one worker, a local Ray pool of `SleepActor`s for more. Prints the result as JSON; a `DimrError` is one line
on stderr and exit code 2, as in the CLI. ``DIMR_CRASH_AT`` (`storage.crash`) kills it at a named point.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dimr.errors import DimrError  # noqa: E402
from dimr.search import Search, SearchOptions, StudySettings  # noqa: E402
from storage import StorageError, open_storage  # noqa: E402
from workers.synthetic import SleepEvaluator, SleepSpec  # noqa: E402

LAYERS, SKIP = 8, 3


def settings() -> StudySettings:
    return StudySettings(pair="synthetic", verifier="synthetic", fingerprint="0" * 64, num_layers=LAYERS, skip=SKIP,
                         cost="kl", calibration="none", calibration_hash="0" * 64, num_sequences=1, seq_len=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("study")
    ap.add_argument("trials", type=int)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--ray-temp", default=None)
    args = ap.parse_args()
    spec = SleepSpec(num_layers=LAYERS, latency_s=args.latency)
    try:
        storage = open_storage(args.url)
        if args.workers > 1:
            from workers.ray_pool import RayPool
            from workers.synthetic import SleepActor

            evaluator = RayPool(spec, workers=args.workers, actor_cls=SleepActor, num_cpus=2,
                                temp_dir=args.ray_temp)
        else:
            evaluator = SleepEvaluator(spec)
        try:
            result = Search(storage, args.study, settings(), SearchOptions(args.trials, 0, "swap", 0), evaluator).run()
        finally:
            evaluator.close()
    except (DimrError, StorageError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(asdict(result)))


if __name__ == "__main__":
    main()

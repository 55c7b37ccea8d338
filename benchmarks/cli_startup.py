"""How long a listing command takes, start to exit: `dimr studies` against `optuna studies` on one database.

    python benchmarks/cli_startup.py --runs 7

Both list the same SQLite database of three studies (made here with Optuna alone). Prints each command's median
wall time over ``--runs`` fresh processes and the ratio dimr / optuna; the target is at most 1.5. `dimr studies`
imports neither torch nor transformers (`--check-imports` asserts it).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna


def make_db(path: Path) -> str:
    url = f"sqlite:///{path}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for i in range(3):
        study = optuna.create_study(study_name=f"s{i}", storage=url)
        study.set_user_attr("dimr_settings", {"pair": "tiny-random", "cost": "kl", "skip": 2, "num_layers": 8})
        for n in range(20):
            study.add_trial(optuna.trial.create_trial(value=1.0 / (n + 1), user_attrs={"mask": "11011011"}))
    return url


def wall(cmd: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--check-imports", action="store_true", help="fail if `dimr studies` imports torch")
    args = ap.parse_args()
    bin_dir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory() as tmp:
        url = make_db(Path(tmp) / "bench.db")
        if args.check_imports:
            code = (f"import sys; from dimr.cli import main\ntry: main(['studies', '--storage', {url!r}])\n"
                    "except SystemExit: pass\nassert 'torch' not in sys.modules and 'transformers' not in sys.modules")
            subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
            print("dimr studies imports neither torch nor transformers")
        dimr = wall([str(bin_dir / "dimr"), "studies", "--storage", url], args.runs)
        ref = wall([str(bin_dir / "optuna"), "studies", "--storage", url], args.runs)
    print(f"dimr studies   {dimr:.2f} s (median of {args.runs})")
    print(f"optuna studies {ref:.2f} s")
    print(f"ratio          {dimr / ref:.2f} (target <= 1.5)")


if __name__ == "__main__":
    main()

"""Re-score on the CPU every mask a study scored elsewhere (e.g. on a GPU) and compare the costs.

    python benchmarks/rescore_cpu.py --storage sqlite:///gpu-out/gpu.db --study gpu --pair mini

The study's stored settings give the calibration (file, sequences, length); its hash must match.
"""

from __future__ import annotations

import argparse
import json

import optuna

from dimr.calibration import load_calibration
from dimr.masks import mask_from_key
from dimr.pairs import get_pair, load_tokenizer
from dimr.search import SETTINGS_ATTR
from workers import EvalSpec
from workers.local import MaskScorer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--storage", required=True)
    ap.add_argument("--study", required=True)
    ap.add_argument("--pair", required=True)
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=args.study, storage=args.storage)
    settings = study.user_attrs[SETTINGS_ATTR]
    settings = settings if isinstance(settings, dict) else json.loads(settings)
    pair = get_pair(args.pair)
    calib = load_calibration(pair.calibration, load_tokenizer(pair), settings["num_sequences"], settings["seq_len"])
    if calib.hash != settings["calibration_hash"]:
        raise SystemExit(f"calibration hash {calib.hash} differs from the study's {settings['calibration_hash']}")
    scorer = MaskScorer(EvalSpec(pair=pair, input_ids=calib.input_ids, cost=settings["cost"], device="cpu"))
    rows = []
    for t in study.trials:
        if t.state == optuna.trial.TrialState.COMPLETE:
            ev = scorer.score(mask_from_key(t.user_attrs["mask"]))
            rows.append((t.user_attrs["mask"], t.value, ev.cost, t.user_attrs.get("seconds", float("nan")), ev.seconds))
    rows.sort(key=lambda r: r[1])
    print("| mask | stored cost | CPU cost | stored s | CPU s |\n|---|---|---|---|---|")
    for r in rows[:5]:
        mask, stored, cpu, stored_s, cpu_s = r
        print(f"| {mask} | {stored:.6f} | {cpu:.6f} | {stored_s:.3f} | {cpu_s:.3f} |")
    worst = max(abs(cpu - stored) / max(abs(stored), 1e-12) for _, stored, cpu, _, _ in rows)
    print(f"\n{len(rows)} masks; max relative cost difference {worst:.2e}; mean seconds per evaluation: stored "
          f"{sum(r[3] for r in rows) / len(rows):.3f}, CPU {sum(r[4] for r in rows) / len(rows):.3f}")


if __name__ == "__main__":
    main()

"""VIA-SD's routing thresholds, tuned: a sweep on held-out prompts, its Pareto set, and the decoder config.

:func:`sweep` decodes the prompts with ``via`` at every (accept, close, regen) of a grid, beside ``ar``, and
scores each point: measured tokens/s (wall and CPU), the cost model's tokens/s from the point's own forward
calls (:func:`~dimr.decoding.costs.predict_from_counts`), and quality against ``ar``: the mean per-token
log-likelihood of the output under the full verifier, outputs equal to ``ar``'s (greedy) and, where the
prompts carry answers (the pair's task), exact-match accuracy. :func:`pareto_set` keeps the points no other
point beats on speed and every quality at once; :class:`DecoderConfig` is the file that holds them, read
back by ``dimr decode --config FILE [--point K]``.

The decoder config is plain JSON with schema ``dimr.decoder-config/1``, bound to one pair and one slim
config (its mask and verifier fingerprint): loading refuses a file made for another pair or slim verifier,
and anything malformed, with one line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from dimr import __version__
from dimr.errors import DimrError
from dimr.userfiles import utc_now, write_atomic

SCHEMA = "dimr.decoder-config/1"
SPEEDS = ("predicted", "measured")  # which tokens/s the Pareto set is taken on
MAX_BYTES = 1 << 20
MAX_POINTS = 10_000


@dataclass(frozen=True)
class Prompt:
    text: str
    answer: int | None = None  # the task's integer answer, when the prompt comes from a task


@dataclass
class Point:
    """One swept threshold setting and what it gave (``task_accuracy`` None without answers)."""

    accept: float
    close: float
    regen: float
    tokens_per_second: float
    tokens_per_cpu_second: float
    predicted_tokens_per_second: float
    loglik: float  # mean log-likelihood per output token under the full verifier (higher is better)
    same_as_ar: float | None  # fraction of outputs equal to ar's (greedy only)
    task_accuracy: float | None
    full_per_token: float


# --- the Pareto set -------------------------------------------------------------------------------------

def pareto_set(values: Sequence[Sequence[float]]) -> list[int]:
    """Indices of the rows of ``values`` (one objective per column, all maximised) that no other row
    dominates (≥ on every objective and > on one), in input order. Equal rows all stay."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return []
    ge = (v[:, None, :] >= v[None, :, :]).all(-1)  # ge[j, i]: row j is at least row i everywhere
    gt = (v[:, None, :] > v[None, :, :]).any(-1)
    dominated = (ge & gt).any(0)
    return [int(i) for i in np.flatnonzero(~dominated)]


def objectives(point: Point, speed: str) -> list[float]:
    """What the Pareto set maximises: speed, log-likelihood, and task accuracy (else outputs equal to ar)."""
    tps = point.predicted_tokens_per_second if speed == "predicted" else point.tokens_per_second
    exact = point.task_accuracy if point.task_accuracy is not None else point.same_as_ar
    return [tps, point.loglik] + ([] if exact is None else [exact])


LOGLIK_TOLERANCE = 0.01  # nats per token: a default point may give up this much log-likelihood against ar


def _exact(p) -> float | None:
    """Exact match of a point (or the ar reference, a dict): task accuracy, else equality with ar."""
    get = p.get if isinstance(p, dict) else lambda k: getattr(p, k)
    return get("task_accuracy") if get("task_accuracy") is not None else get("same_as_ar")


def default_point(points: Sequence[Point], speed: str, ar: dict) -> int:
    """The fastest point that loses nothing measurable against ``ar`` (exact match at least ar's, log-likelihood
    within :data:`LOGLIK_TOLERANCE`); if none does, the best one on (exact match, log-likelihood)."""
    floor = _exact(ar)
    keeps = [i for i, p in enumerate(points) if p.loglik >= ar["loglik"] - LOGLIK_TOLERANCE
             and (floor is None or (_exact(p) is not None and _exact(p) >= floor))]
    if keeps:
        return max(keeps, key=lambda i: objectives(points[i], speed)[0])
    return max(range(len(points)), key=lambda i: (_exact(points[i]) or 0.0, points[i].loglik))


# --- held-out prompts -----------------------------------------------------------------------------------

def task_prompts(pair: str, n: int) -> list[Prompt]:
    """The first ``n`` prompts of the pair's held-out task with their answers: ``smollm2``'s chat-formatted
    addition problems, the ``mini`` pair's arithmetic word problems; none for other pairs."""
    from dimr.zoo import DATA_DIR

    path = {"smollm2": DATA_DIR / "smollm2" / "task_addition.jsonl", "mini": DATA_DIR / "heldout_task.jsonl"}.get(pair)
    if path is None:
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()][:n]
    return [Prompt(r.get("text") or r["prompt"], int(r["answer"])) for r in rows]


def read_prompts(path: Path, n: int | None = None) -> list[Prompt]:
    """A JSONL file of {"prompt" (or "text"): str, "answer": int (optional)} or bare strings."""
    from dimr.userfiles import read_text

    out = []
    for k, line in enumerate(read_text(path, "prompts file", "pass a JSONL file").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            raise DimrError(f"{path} line {k} is not JSON; write one JSON object or string per line") from None
        item = {"prompt": item} if isinstance(item, str) else item
        text = (item.get("prompt") or item.get("text")) if isinstance(item, dict) else None
        answer = item.get("answer") if isinstance(item, dict) else None
        integer = isinstance(answer, int) and not isinstance(answer, bool)
        if not isinstance(text, str) or not (answer is None or integer):
            raise DimrError(f"{path} line {k} needs a \"prompt\" string and at most an integer \"answer\"; fix it")
        out.append(Prompt(text, answer))
    if not out:
        raise DimrError(f"prompts file {path} holds no prompt; add one JSON line per prompt")
    return out[:n]


def answer_of(completion: str) -> int | None:
    """The task checker: the integer after the first ``####``, else the last integer."""
    from dimr.zoo.smollm2_data import task_answer

    return task_answer(completion)


# --- the sweep ------------------------------------------------------------------------------------------

def grid(accept: Sequence[float], close: Sequence[float], regen: Sequence[float]) -> list[tuple[float, float, float]]:
    """Every (accept, close, regen) combination."""
    return [(a, c, r) for a in accept for c in close for r in regen]


def sweep(decoder, prompts: Sequence[Prompt], config, settings: Sequence[tuple[float, float, float]],
          on_point=None) -> tuple[dict, list[Point]]:
    """``ar`` then ``via`` at every (accept, close, regen) of ``settings`` on ``prompts`` (interleaved prompt by
    prompt, so a change of machine load hits every point alike) → (the ar reference as a dict, the points)."""
    import torch

    from dimr.decoding.bench import BenchRow, _decode, _score
    from dimr.decoding.costs import predict_from_counts
    from dimr.decoding.sequence import Thresholds
    from dimr.decoding.stats import DecodeStats

    if not prompts:
        raise DimrError("no prompts to tune on; pass --prompts FILE.jsonl (this pair has no task of its own)")
    costs = decoder.costs or decoder.measure_costs(reps=7)
    encoded = [decoder.encode(p.text) for p in prompts]
    names = ["ar"] + [f"via{i}" for i in range(len(settings))]
    configs = {"ar": config} | {f"via{i}": replace(config, thresholds=Thresholds(*s)) for i, s in enumerate(settings)}
    rows = [BenchRow(n, DecodeStats(n, config.gamma)) for n in names]
    with torch.inference_mode():
        for name in ("ar", "via0"):  # warm-up: first-call allocations are not part of the measurement
            _decode({"": decoder}, "ar" if name == "ar" else "via", encoded[0],
                    replace(configs[name], max_new_tokens=min(4, config.max_new_tokens)))
        for ids in encoded:
            for row in rows:
                tokens, stats = _decode({"": decoder}, "ar" if row.mode == "ar" else "via", ids, configs[row.mode])
                row.stats, row.outputs = row.stats.merge(stats), row.outputs + [tokens]
    _score(decoder, rows, encoded, config)
    answered = all(p.answer is not None for p in prompts)
    out = []
    for row in rows:
        s = row.stats
        accuracy = None
        if answered:
            texts = [decoder.tokenizer.decode(t, skip_special_tokens=True) for t in row.outputs]
            accuracy = sum(answer_of(t) == p.answer for t, p in zip(texts, prompts, strict=True)) / len(prompts)
        cfg = configs[row.mode]
        out.append(Point(cfg.thresholds.accept, cfg.thresholds.close, cfg.thresholds.regen, s.tokens_per_second,
                         s.tokens_per_cpu_second, predict_from_counts(s.tokens, s.calls, s.fed, costs, s.forwards),
                         -row.nll,
                         None if row.same_as_ar is None else row.same_as_ar / len(prompts), accuracy,
                         s.calls_per_token("full")))
        if on_point and row.mode != "ar":
            on_point(out[-1])
    ar = asdict(out[0])
    for k in ("accept", "close", "regen"):
        ar.pop(k)
    return ar, out[1:]


# --- the decoder config file ----------------------------------------------------------------------------

@dataclass
class DecoderConfig:
    """The Pareto set of a threshold sweep for ``via``, bound to a pair and a slim config."""

    pair: str
    slim_mask: str
    slim_fingerprint: str  # the verifier fingerprint the slim config was made for
    gamma: int
    temperature: float
    max_new_tokens: int
    prompts: int
    speed: str
    default: int
    ar: dict
    points: list[Point]
    dimr_version: str = __version__
    created_at: str = field(default_factory=utc_now)
    schema: str = SCHEMA

    def thresholds(self, point: int | None = None):
        from dimr.decoding.sequence import Thresholds

        k = self.default if point is None else point
        if not 0 <= k < len(self.points):
            raise DimrError(f"--point {k} is out of range: the decoder config holds points 0 to "
                            f"{len(self.points) - 1}; pick one of them")
        p = self.points[k]
        return Thresholds(p.accept, p.close, p.regen)

    def check(self, pair: str, slim) -> None:
        """Refuse this file for another pair or another slim config (``slim``: a loaded SlimConfig)."""
        if pair != self.pair:
            raise DimrError(f"decoder config was tuned for pair {self.pair!r}, not {pair!r}; run "
                            "`dimr tune-thresholds` for this pair")
        if slim is None:
            raise DimrError("a decoder config tunes via with a slim verifier; pass --slim with the slim config "
                            f"it was tuned for (mask {self.slim_mask})")
        if (slim.mask, slim.fingerprint) != (self.slim_mask, self.slim_fingerprint):
            raise DimrError(f"decoder config was tuned for slim mask {self.slim_mask}, not {slim.mask}; pass "
                            "that slim config or tune again with this one")

    def to_dict(self) -> dict:
        d = asdict(self)
        return {"schema": d.pop("schema"), **d}

    def save(self, path: Path) -> Path:
        """Write atomically: a temp file in the same folder, then a rename (never a half-written file)."""
        path = Path(path)
        text = json.dumps(_finite(self.to_dict()), indent=1, allow_nan=False) + "\n"
        if path.is_dir() or not path.parent.is_dir():
            raise DimrError(f"cannot write {path}: give a file path in an existing folder")
        return write_atomic(path, text)


def _finite(obj):
    """NaN/inf as strings (strict JSON has neither); read back by :func:`_number`."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def _number(v, what: str, optional: bool = False) -> float | None:
    if v is None and optional:
        return None
    if isinstance(v, str) and v in ("nan", "inf", "-inf"):
        return float(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{what} is {str(v)[:40]!r}, not a number")
    return float(v)


_TOP = {"schema": str, "pair": str, "slim_mask": str, "slim_fingerprint": str, "gamma": int, "temperature": None,
        "max_new_tokens": int, "prompts": int, "speed": str, "default": int, "ar": dict, "points": list,
        "dimr_version": str, "created_at": str}
_POINT = {f for f in Point.__dataclass_fields__}
_OPTIONAL_POINT = {"same_as_ar", "task_accuracy"}


def _parse(data) -> DecoderConfig:
    """A DecoderConfig from parsed JSON; ValueError naming the first problem."""
    if not isinstance(data, dict):
        raise ValueError(f"it is a JSON {type(data).__name__}, not an object")
    if data.get("schema") != SCHEMA:
        raise ValueError(f"schema is {str(data.get('schema'))[:40]!r}, not {SCHEMA!r}")
    if set(data) != set(_TOP):
        extra, missing = sorted(set(data) - set(_TOP)), sorted(set(_TOP) - set(data))
        raise ValueError("; ".join(x for x in (extra and f"unknown field(s) {', '.join(extra)[:80]}",
                                              missing and f"missing field(s) {', '.join(missing)}") if x))
    for k, kind in _TOP.items():
        if kind is not None and (not isinstance(data[k], kind) or isinstance(data[k], bool)):
            raise ValueError(f"{k} is {str(data[k])[:40]!r}, not {kind.__name__}")
    temperature = _number(data["temperature"], "temperature")
    if data["gamma"] < 1 or data["max_new_tokens"] < 0 or data["prompts"] < 1 or not temperature >= 0:
        raise ValueError("gamma, max_new_tokens, prompts or temperature is out of range")
    if data["speed"] not in SPEEDS:
        raise ValueError(f"speed is {data['speed'][:40]!r}, not one of {', '.join(SPEEDS)}")
    if set(data["slim_mask"]) - {"0", "1"} or "1" not in data["slim_mask"]:
        raise ValueError(f"slim_mask {data['slim_mask'][:40]!r} is not a layer mask of 0 and 1")
    if not 1 <= len(data["points"]) <= MAX_POINTS:
        raise ValueError(f"points holds {len(data['points'])} entries, not 1 to {MAX_POINTS}")
    points = []
    for i, p in enumerate(data["points"]):
        if not isinstance(p, dict) or set(p) != _POINT:
            raise ValueError(f"point {i} is not an object with exactly the fields {', '.join(sorted(_POINT))}")
        values = {k: _number(v, f"point {i} {k}", k in _OPTIONAL_POINT) for k, v in p.items()}
        for k in ("accept", "close", "regen"):
            if not (math.isfinite(values[k]) and values[k] >= 0):
                raise ValueError(f"point {i} {k} threshold {values[k]} is not a finite number ≥ 0")
        points.append(Point(**values))
    if not 0 <= data["default"] < len(points):
        raise ValueError(f"default {data['default']} is not the index of a point")
    return DecoderConfig(**{**data, "temperature": temperature, "points": points})


def load_decoder_config(path: Path) -> DecoderConfig:
    """Read a decoder config strictly; one-line DimrError for any problem."""
    from dimr.userfiles import read_text

    path = Path(path)
    fix = "write it with `dimr tune-thresholds --out FILE`"
    if path.is_file() and path.stat().st_size > MAX_BYTES:
        raise DimrError(f"decoder config {path} is over {MAX_BYTES >> 20} MiB, too big to be one; {fix}")
    text = read_text(path, "decoder config", fix)
    try:
        return _parse(json.loads(text))
    except (json.JSONDecodeError, RecursionError):
        raise DimrError(f"decoder config {path} is not valid JSON; {fix}") from None
    except ValueError as e:
        raise DimrError(f"decoder config {path} is malformed: {e}; {fix}") from None

"""The slim config: the published result of a study, and how to apply it safely.

A slim config is plain JSON (nothing executes on load) with schema ``dimr.slim-config/1``::

    {"schema": "dimr.slim-config/1", "pair": "tiny-random", "verifier": "/models/verifier", "revision": null,
     "fingerprint": "<sha256>", "num_layers": 8, "kept_layers": [0, 1, 3, 4, 6, 7], "mask": "11011011",
     "cost": "kl", "metrics": {"cost": 0.12, "top1_agreement": 0.9, "expected_acceptance": 0.85},
     "calibration": "<spec>", "calibration_hash": "<sha256>", "commit": "<hub commit>", "weights": "<digest>",
     "study": "s", "trial": 17,
     "dimr_version": "0.1.0", "created_at": "2026-11-30T14:00:00+00:00"}

A sublayer mask (`dimr.masks.SublayerMask`: some layer runs only its attention, ``a``, or only its MLP, ``m``)
is written with schema ``dimr.slim-config/2`` and its key as ``mask`` (``"11a1m0…"``); ``kept_layers`` then lists
the layers that run anything. A mask whose layers all run in full or not at all is a layer mask and keeps
schema 1, so configs that older dimr versions wrote and read are unchanged.

Applying it checks the verifier's :func:`fingerprint` (the architecture) and, when the config has one, its
weight digest (`dimr.hub.weight_digest`: which checkpoint), so a mask is never run on another model.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from dimr import __version__
from dimr.errors import DimrError
from dimr.masks import Mask, SublayerMask, mask_from_key
from dimr.slim import num_layers, slim_verifier
from dimr.userfiles import utc_now, write_atomic

SCHEMA = "dimr.slim-config/1"
SCHEMA_SUBLAYER = "dimr.slim-config/2"  # the mask may run a layer's attention or MLP alone
SCHEMAS = (SCHEMA, SCHEMA_SUBLAYER)

# Config fields that say nothing about the architecture, or that differ between a model built from its
# config (e.g. on the meta device) and the same checkpoint loaded from disk.
VOLATILE_CONFIG_KEYS = frozenset({
    "dtype", "torch_dtype", "transformers_version", "_name_or_path", "name_or_path", "architectures",
    "_commit_hash", "attn_implementation", "_attn_implementation", "_attn_implementation_internal",
    "_attn_implementation_autoset", "use_cache", "output_hidden_states", "output_attentions", "return_dict",
    "dimr_mask", "_experts_implementation", "experts_implementation",
})


def fingerprint(model: nn.Module) -> str:
    """sha256 of the verifier's architecture: its config (minus volatile fields) and parameter names+shapes.

    It identifies the architecture, not the weights: two checkpoints of one architecture share it (the
    config's ``verifier`` id tells them apart). A slim model has another fingerprint than its full model.
    """
    config = {k: v for k, v in model.config.to_dict().items() if k not in VOLATILE_CONFIG_KEYS}
    params = [[name, list(p.shape)] for name, p in model.named_parameters(remove_duplicate=False)]
    blob = json.dumps({"config": config, "parameters": params}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class SlimConfig:
    """A chosen layer mask and everything needed to apply it safely (see the module docstring)."""

    pair: str
    verifier: str
    fingerprint: str
    num_layers: int
    kept_layers: list[int]
    mask: str
    cost: str
    metrics: dict[str, float]
    calibration: str
    calibration_hash: str
    revision: str | None = None
    commit: str | None = None  # the verifier's resolved hub commit
    weights: str | None = None  # `dimr.hub.weight_digest` of the verifier: checked on apply when present
    study: str | None = None
    trial: int | None = None
    dimr_version: str = __version__
    created_at: str = field(default_factory=utc_now)
    schema: str = SCHEMA

    @property
    def is_sublayer(self) -> bool:
        return self.schema == SCHEMA_SUBLAYER

    @property
    def layer_mask(self) -> Mask:
        """The layer mask (ValueError for a sublayer config that runs some layer in part)."""
        return SublayerMask.from_key(self.mask).layer_mask() if self.is_sublayer else mask_from_key(self.mask)

    @property
    def routed_mask(self) -> Mask | SublayerMask:
        """What the slim verifier is built from: the layer mask, or the sublayer mask of a schema-2 config."""
        return SublayerMask.from_key(self.mask) if self.is_sublayer else mask_from_key(self.mask)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        # Strict JSON has no inf/nan (an infinite KL is possible): write them as strings.
        d["metrics"] = {k: (v if math.isfinite(v) else str(v)) for k, v in d["metrics"].items()}
        return {"schema": d.pop("schema"), **d}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"

    def save(self, path: str | Path) -> Path:
        """Write atomically (temp file in the same folder, then rename): a failure leaves no partial file, and
        temp files that killed writers left beside ``path`` are removed. The file's mode follows the umask."""
        path = Path(path)
        text = self.to_json()
        if path.is_dir():
            raise DimrError(f"cannot write {path}: it is a directory; give a file path, e.g. {path / 'slim.json'}")
        _sweep_temp_files(path)
        return write_atomic(path, text, crash_at="export:before-rename")


def _sweep_temp_files(path: Path) -> None:
    """Remove ``.NAME.PID.*.tmp`` beside ``path`` whose writer (PID, on this host) is dead."""
    from dimr.search.recovery import pid_alive

    try:
        stale = list(path.parent.glob(f".{glob.escape(path.name)}.*.tmp"))
    except OSError:
        return
    for tmp in stale:
        pid = tmp.name[len(path.name) + 2:].split(".", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            tmp.unlink(missing_ok=True)


def mask_fields(mask: Mask | SublayerMask | str) -> dict[str, Any]:
    """``mask``, ``kept_layers`` and ``schema`` of a slim config for a layer or sublayer mask (or its key): schema 1
    for a layer mask (a sublayer mask that runs each layer in full or not at all is one), else schema 2."""
    sub = SublayerMask.from_key(mask) if isinstance(mask, str) else (
        mask if isinstance(mask, SublayerMask) else SublayerMask.from_layer_mask(mask))
    key = sub.key
    return {"mask": key, "kept_layers": [i for i, c in enumerate(key) if c != "0"],
            "schema": SCHEMA if sub.is_layer_mask else SCHEMA_SUBLAYER}


def make_slim_config(
    verifier: nn.Module,
    mask: Mask | SublayerMask,
    *,
    pair: str,
    verifier_id: str,
    cost: str,
    metrics: dict[str, float],
    calibration: str,
    calibration_hash: str,
    revision: str | None = None,
    study: str | None = None,
    trial: int | None = None,
    verifier_fingerprint: str | None = None,
) -> SlimConfig:
    """A SlimConfig for ``mask`` (a layer or sublayer mask) on the full ``verifier`` (a real or meta-device
    model, or pass ``verifier_fingerprint`` when already known)."""
    n = num_layers(verifier)
    if len(mask) != n:
        raise DimrError(f"layer mask has {len(mask)} entries but the verifier has {n} layers; "
                        "export a mask made for this verifier")
    return SlimConfig(
        pair=pair, verifier=verifier_id, fingerprint=verifier_fingerprint or fingerprint(verifier),
        num_layers=n, **mask_fields(mask), cost=cost,
        metrics={k: float(v) for k, v in metrics.items()}, calibration=calibration,
        calibration_hash=calibration_hash, revision=revision, study=study, trial=trial,
    )


MAX_BYTES = 1 << 20  # a slim config is a few hundred bytes; anything this big is not one
MAX_LAYERS = 4096
_OPTIONAL = (str, type(None))
FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "schema": str, "pair": str, "verifier": str, "fingerprint": str, "num_layers": int, "kept_layers": list,
    "mask": str, "cost": str, "metrics": dict, "calibration": str, "calibration_hash": str, "revision": _OPTIONAL,
    "commit": _OPTIONAL, "weights": _OPTIONAL, "study": _OPTIONAL, "trial": (int, type(None)), "dimr_version": str,
    "created_at": str,
}
_KIND_NAMES = {str: "a string", int: "an integer", list: "a list", dict: "an object", type(None): "null"}
_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def _problem(data: dict) -> str | None:
    """What is wrong with a parsed slim config (types, ranges, mask vs num_layers vs kept_layers), or None."""
    from dimr.cost import COSTS

    unknown = sorted(set(data) - set(FIELD_TYPES))
    if unknown:
        return f"unknown field(s) {', '.join(unknown)}"
    for k, kind in FIELD_TYPES.items():
        v = data.get(k)
        if k in data and (not isinstance(v, kind) or isinstance(v, bool)):
            want = " or ".join(_KIND_NAMES[t] for t in (kind if isinstance(kind, tuple) else (kind,)))
            return f"{k} is {type(v).__name__} {str(v)[:40]!r}, not {want}"
    n, mask, kept = data["num_layers"], data["mask"], data["kept_layers"]
    if not 1 <= n <= MAX_LAYERS:
        return f"num_layers {n} is out of range (1 to {MAX_LAYERS})"
    if data["schema"] == SCHEMA_SUBLAYER:
        if len(mask) != n or set(mask) - set("1am0") or not set(mask) & {"a", "m"} or not set(mask) & {"1", "a"}:
            return (f"mask {mask[:40]!r} is not {n} characters of 1/a/m/0 with some a or m (schema 2) running at "
                    "least one attention")
    elif len(mask) != n or set(mask) - {"0", "1"} or "1" not in mask:
        return f"mask {mask[:40]!r} is not {n} characters of 0 and 1 keeping at least one layer"
    if kept != [i for i, c in enumerate(mask) if c != "0"]:
        return f"kept_layers {str(kept)[:40]} do not match mask {mask}"
    if not re.fullmatch(r"[0-9a-f]{64}", data["fingerprint"]):
        return "fingerprint is not a sha256 hex digest"
    if data["cost"] not in COSTS:
        return f"cost {data['cost'][:40]!r} is unknown (one of {', '.join(COSTS)})"
    if data.get("trial") is not None and data["trial"] < 0:
        return f"trial {data['trial']} is negative"
    for k, v in data["metrics"].items():
        if isinstance(v, bool) or not (isinstance(v, (int, float)) or v in _NON_FINITE):
            return f"metric {str(k)[:40]!r} is {str(v)[:40]!r}, not a number"
    if not all(data[k].strip() for k in ("pair", "verifier", "calibration", "calibration_hash")):
        return "pair, verifier, calibration and calibration_hash must not be empty"
    return None


def load_slim_config(path: str | Path) -> SlimConfig:
    """Read a slim config file, strictly: DimrError for a missing or binary file, bad JSON, another schema,
    missing or unknown fields, wrong types, out-of-range values, or a mask that disagrees with num_layers or
    kept_layers. Nothing of the file executes."""
    from dimr.userfiles import read_text

    path = Path(path)
    fix = "pass a file written by `dimr export`"
    if path.is_file() and path.stat().st_size > MAX_BYTES:
        raise DimrError(f"slim config {path} is over {MAX_BYTES >> 20} MiB, too big to be one; {fix}")
    text = read_text(path, "slim config", fix)
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        why = str(e) if isinstance(e, json.JSONDecodeError) else "nested too deep"
        raise DimrError(f"slim config {path} is not valid JSON ({why}); export it again") from None
    if not isinstance(data, dict) or data.get("schema") not in SCHEMAS:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise DimrError(f"slim config {path} has schema {str(got)[:40]!r}, not {' or '.join(map(repr, SCHEMAS))}; "
                        "export it again with this dimr")
    required = {f.name for f in dataclasses.fields(SlimConfig)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    missing = required - set(data)
    if missing:
        raise DimrError(f"slim config {path} lacks {', '.join(sorted(missing))}; export it again")
    problem = _problem(data)
    if problem:
        raise DimrError(f"slim config {path} is malformed: {problem}; export it again")
    data["metrics"] = {k: _NON_FINITE.get(v, v) if isinstance(v, str) else float(v) for k, v in data["metrics"].items()}
    return SlimConfig(**data)


def check_pair(cfg: SlimConfig, pair) -> None:
    """Refuse a slim config made for another pair (or, for hub pairs, another verifier) than ``pair``."""
    if cfg.pair != pair.name or (not pair.local and cfg.verifier != pair.verifier):
        raise DimrError(f"slim config {cfg.mask} was made for pair {cfg.pair!r} (verifier {cfg.verifier!r}), not "
                        f"{pair.name!r} ({pair.verifier!r}); export one from a study of this pair")


def apply_slim_config(cfg: SlimConfig | str | Path, verifier: nn.Module) -> nn.Module:
    """The slim verifier of ``cfg`` on ``verifier``, after checking that ``cfg`` was made for this model."""
    if not isinstance(cfg, SlimConfig):
        cfg = load_slim_config(cfg)
    got = fingerprint(verifier)
    if got != cfg.fingerprint:
        raise DimrError(f"slim config {cfg.mask} (pair {cfg.pair}) was made for verifier "
                        f"{cfg.fingerprint[:16]} but got {got[:16]}; export a config for this model")
    if cfg.weights is not None:
        from dimr.hub import weight_digest

        weights = weight_digest(verifier)
        if weights != cfg.weights:
            raise DimrError(f"slim config {cfg.mask} (pair {cfg.pair}) was made for the weights {cfg.weights[:16]} "
                            f"of {cfg.verifier} (commit {cfg.commit or '?'}) but these are {weights[:16]}: same "
                            "architecture, other checkpoint; load that checkpoint or export a config for this one")
    return slim_verifier(verifier, cfg.routed_mask)

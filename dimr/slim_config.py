"""The slim config: the published result of a study, and how to apply it safely.

A slim config is plain JSON (nothing executes on load) with schema ``dimr.slim-config/1``::

    {"schema": "dimr.slim-config/1", "pair": "tiny-random", "verifier": "/models/verifier", "revision": null,
     "fingerprint": "<sha256>", "num_layers": 8, "kept_layers": [0, 1, 3, 4, 6, 7], "mask": "11011011",
     "cost": "kl", "metrics": {"cost": 0.12, "top1_agreement": 0.9, "expected_acceptance": 0.85},
     "calibration": "<spec>", "calibration_hash": "<sha256>", "study": "s", "trial": 17,
     "dimr_version": "0.1.0", "created_at": "2026-11-30T14:00:00+00:00"}

Applying it checks the verifier's :func:`fingerprint` first, so a mask is never run on another model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from torch import nn

from dimr import __version__
from dimr.errors import DimrError
from dimr.masks import Mask, kept_layers, mask_from_key, mask_key
from dimr.slim import num_layers, slim_verifier

SCHEMA = "dimr.slim-config/1"

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


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


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
    study: str | None = None
    trial: int | None = None
    dimr_version: str = __version__
    created_at: str = field(default_factory=_now)
    schema: str = SCHEMA

    @property
    def layer_mask(self) -> Mask:
        return mask_from_key(self.mask)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        # Strict JSON has no inf/nan (an infinite KL is possible): write them as strings.
        d["metrics"] = {k: (v if math.isfinite(v) else str(v)) for k, v in d["metrics"].items()}
        return {"schema": d.pop("schema"), **d}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"

    def save(self, path: str | Path) -> Path:
        """Write atomically (temp file in the same folder, then rename): a failure leaves no partial file."""
        path = Path(path)
        text = self.to_json()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path


def make_slim_config(
    verifier: nn.Module,
    mask: Mask,
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
    """A SlimConfig for ``mask`` on the full ``verifier`` (a real or meta-device model, or pass
    ``verifier_fingerprint`` when already known)."""
    n = num_layers(verifier)
    if len(mask) != n:
        raise DimrError(f"layer mask has {len(mask)} entries but the verifier has {n} layers; "
                        "export a mask made for this verifier")
    return SlimConfig(
        pair=pair, verifier=verifier_id, fingerprint=verifier_fingerprint or fingerprint(verifier),
        num_layers=n, kept_layers=kept_layers(mask), mask=mask_key(mask), cost=cost,
        metrics={k: float(v) for k, v in metrics.items()}, calibration=calibration,
        calibration_hash=calibration_hash, revision=revision, study=study, trial=trial,
    )


def load_slim_config(path: str | Path) -> SlimConfig:
    """Read a slim config file; DimrError for a missing file, bad JSON, another schema or missing fields."""
    path = Path(path)
    if not path.is_file():
        raise DimrError(f"slim config {path} does not exist; pass a file written by `dimr export`")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DimrError(f"slim config {path} is not valid JSON ({e}); export it again") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise DimrError(f"slim config {path} has schema {got!r}, not {SCHEMA!r}; "
                        "export it again with this dimr")
    names = {f.name for f in dataclasses.fields(SlimConfig)}
    required = {f.name for f in dataclasses.fields(SlimConfig)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    missing = required - set(data)
    if missing:
        raise DimrError(f"slim config {path} lacks {', '.join(sorted(missing))}; export it again")
    data = {k: v for k, v in data.items() if k in names}
    try:
        data["metrics"] = {str(k): float(v) for k, v in data["metrics"].items()}
        cfg = SlimConfig(**data)
        mask = mask_from_key(str(cfg.mask))
        consistent = len(mask) == int(cfg.num_layers) and kept_layers(mask) == list(cfg.kept_layers)
    except (AttributeError, TypeError, ValueError, DimrError) as e:
        raise DimrError(f"slim config {path} has a malformed field ({e}); export it again") from None
    if not consistent:
        raise DimrError(f"slim config {path} is inconsistent (mask {cfg.mask} vs num_layers/kept_layers); "
                        "export it again")
    return cfg


def apply_slim_config(cfg: SlimConfig | str | Path, verifier: nn.Module) -> nn.Module:
    """The slim verifier of ``cfg`` on ``verifier``, after checking that ``cfg`` was made for this model."""
    if not isinstance(cfg, SlimConfig):
        cfg = load_slim_config(cfg)
    got = fingerprint(verifier)
    if got != cfg.fingerprint:
        raise DimrError(f"slim config {cfg.mask} (pair {cfg.pair}) was made for verifier "
                        f"{cfg.fingerprint[:16]} but got {got[:16]}; export a config for this model")
    return slim_verifier(verifier, cfg.layer_mask)

"""Relaxed verification: every method of the seeds as one choice of (π_rej, π_res, π_bonus).

Each method is a small frozen dataclass in its own module, callable as a
:data:`~dimr.decoding.verify.TargetsFn`, so it plugs into every decoding mode unchanged
(``Decoder.run(..., targets=rule)``; with ``via`` it applies where the full verifier decides). With its "off"
parameter each one returns the full verifier for all three targets, i.e. lossless decoding.

:data:`METHODS` names each method's main parameter, its off value and the sweep grid of ``dimr bench-relaxed``;
:func:`make_rule` builds a rule from ``--verify NAME --param k=v``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from dimr.decoding.verify import TargetsFn, lossless
from dimr.errors import DimrError
from dimr.relaxed.base import parse_float
from dimr.relaxed.cactus import Cactus
from dimr.relaxed.cascades import Cascade
from dimr.relaxed.contrastive import Contrastive
from dimr.relaxed.diversed import Diversed, EnsembleHead, load_head
from dimr.relaxed.fly import Fly
from dimr.relaxed.fuzzy import Fuzzy
from dimr.relaxed.mentored import Mentored
from dimr.relaxed.predict import Recorder, expected_accepted_length, survey_speedup
from dimr.relaxed.static import StaticEnsemble


@dataclass(frozen=True)
class Method:
    """A relaxed rule's entry: its class, main parameter, the value that makes it lossless, the sweep grid."""

    name: str
    cls: type
    param: str
    off: float
    grid: tuple[float, ...]
    summary: str
    needs_head: bool = False
    fixed: tuple[tuple[str, object], ...] = ()  # other parameters the sweep holds fixed
    ngram: str = ""  # why the rule cannot verify the n-gram proposer's drafts; "" = it can (one-hot p_d)

    def build(self, head: EnsembleHead | None = None, **params: object) -> TargetsFn:
        if self.needs_head:
            if head is None:
                raise DimrError("--verify diversed needs a trained head; pass --head head.safetensors")
            return self.cls(head, **params)
        return self.cls(**params)

    @property
    def parameters(self) -> list[str]:
        return [f.name for f in fields(self.cls) if f.name != "head"]


METHODS: dict[str, Method] = {m.name: m for m in [
    Method("lossless", type(None), "", 0.0, (), "the full verifier for all three targets"),
    Method("static", StaticEnsemble, "w", 1.0, (1.0, 0.8, 0.6, 0.4, 0.2, 0.0),
           "π = w·full + (1−w)·draft; acceptance 1 − w·TV"),
    Method("diversed", Diversed, "shift", math.inf, (math.inf, 0.0, -1.0, -2.0),
           "learned w_t = head(h_draft, h_full); shift moves the head's logit", needs_head=True,
           ngram="the head reads the draft model's last hidden state; the n-gram proposer has none"),
    Method("cactus", Cactus, "delta", 0.0, (0.0, 0.1, 0.5, 1.0, 3.0), "raise p_t on the drafted token, KL budget δ"),
    Method("mentored", Mentored, "budget", 0.0, (0.0, 0.05, 0.1, 0.2, 0.5),
           "mentor π closest to draft with KL(full‖π) ≈ D"),
    Method("fuzzy", Fuzzy, "threshold", -1.0, (-1.0, 0.05, 0.2, 0.4),
           "accept iff JS(draft, full) ≤ T; else sample full"),
    Method("cascade", Cascade, "alpha", -1.0, (-1.0, 0.1, 0.3, 0.6), "token-level deferral rule, lenience α"),
    Method("contrastive", Contrastive, "beta", 0.0, (0.0, 0.25, 0.5, 1.0),
           "p_c ∝ full^(1+β)/draft^β on plausible tokens", fixed=(("alpha", 0.1),),
           ngram="the amateur's log-probabilities are −inf off the drafted token, so the contrast "
                 "(1+β)·log p_t − β·log p_d is +inf there: there is no amateur to contrast with"),
    Method("fly", Fly, "theta", math.inf, (math.inf, 0.6, 0.3, 0.1),
           "accept a mismatch if the target is unsure and the next W−1 drafts match"),
]}


def parse_params(items: Sequence[str]) -> dict[str, str]:
    """``["w=0.5", "rule=chow"]`` → {"w": "0.5", "rule": "chow"}."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise DimrError(f"--param {item!r} is not key=value; write e.g. --param w=0.5")
        out[key.strip()] = value.strip()
    return out


def make_rule(name: str, params: dict[str, str] | None = None, head: EnsembleHead | None = None) -> TargetsFn:
    """The rule ``name`` with string ``params`` converted to each field's type."""
    if name not in METHODS:
        raise DimrError(f"unknown verification method {name!r}; use one of {', '.join(METHODS)}")
    method, params = METHODS[name], dict(params or {})
    if name == "lossless":
        if params:
            raise DimrError("--verify lossless takes no --param")
        return lossless
    types = {f.name: f.type for f in fields(method.cls)}
    typed: dict[str, object] = {}
    for key, value in params.items():
        if key not in method.parameters:
            raise DimrError(f"method {name} has no parameter {key!r}; it has {', '.join(method.parameters)}")
        kind = str(types[key])
        try:
            typed[key] = int(value) if kind == "int" else value if kind == "str" else parse_float(value)
        except ValueError:
            raise DimrError(f"--param {key}={value}: expected a number") from None
    try:
        return method.build(head, **typed)
    except ValueError as e:
        raise DimrError(str(e)) from None


def rule_from_cli(verify: str, params: Sequence[str], head_path: Path | None, draft=None, full=None
                  ) -> TargetsFn:
    """What ``dimr decode --verify --param --head`` builds (the head is checked against the loaded models)."""
    head = load_head(head_path, draft, full)[0] if head_path is not None else None
    if head is not None and verify != "diversed":
        raise DimrError("--head is only used by --verify diversed")
    return make_rule(verify, parse_params(params), head)


__all__ = ["METHODS", "Cactus", "Cascade", "Contrastive", "Diversed", "EnsembleHead", "Fly", "Fuzzy", "Mentored",
           "Method", "Recorder", "StaticEnsemble", "expected_accepted_length", "make_rule", "parse_params",
           "rule_from_cli", "survey_speedup"]

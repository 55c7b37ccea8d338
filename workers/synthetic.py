"""A model-free Ray actor body with `ScorerActor`'s methods, for tests of the pool: each ``score`` sleeps a
fixed latency and records, in the evaluation's ``extra``, when it started and ended (wall clock)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from workers.base import Evaluation


@dataclass(frozen=True)
class SleepSpec:
    """What a `SleepActor` needs (duck-types `EvalSpec` for the pool: ``device``)."""

    num_layers: int = 8
    latency_s: float = 0.2
    device: str = "cpu"


class SleepActor:
    """Cost = the skipped layers' indices weighted, plus a term per adjacent skipped pair; no model."""

    def __init__(self, spec: SleepSpec, name: str):
        self.spec, self.name = spec, name

    def ready(self) -> int:
        return self.spec.num_layers

    def pid(self) -> int:
        return os.getpid()

    def score(self, mask: tuple[bool, ...]) -> Evaluation:
        started = time.time()
        time.sleep(self.spec.latency_s)
        skipped = [i for i, keep in enumerate(mask) if not keep]
        runs = sum(b - a == 1 for a, b in zip(skipped, skipped[1:], strict=False))
        cost = sum(1.0 + i / len(mask) for i in skipped) + 0.3 * runs
        return Evaluation(tuple(mask), cost, 1.0, 1.0, 0, self.spec.latency_s, self.name,
                          {"started": started, "ended": time.time()})

    def block_influence(self) -> list[float]:
        return [1.0 + i / self.spec.num_layers for i in range(self.spec.num_layers)]


class SleepEvaluator:
    """The `Evaluator` interface in-process over one `SleepActor`: one slot, no model, no Ray."""

    slots = 1

    def __init__(self, spec: SleepSpec = SleepSpec()):
        self.actor, self.num_layers = SleepActor(spec, "local"), spec.num_layers
        self._queue: list[tuple[int, tuple[bool, ...]]] = []

    def submit(self, ticket: int, mask: tuple[bool, ...]) -> None:
        self._queue.append((ticket, tuple(mask)))

    def wait(self, timeout: float | None = None) -> list[tuple[int, Evaluation]]:
        out = [(t, self.actor.score(m)) for t, m in self._queue]
        self._queue.clear()
        return out

    def block_influence(self) -> list[float]:
        return self.actor.block_influence()

    def close(self) -> None:
        pass

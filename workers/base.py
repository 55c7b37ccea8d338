"""The evaluator interface between the search driver and whatever runs the verifier.

An evaluator takes masks (`submit`) and hands back finished evaluations (`wait`), in any order. It has
``slots`` places: the driver keeps that many trials in flight, plus ``ahead`` more if the evaluator has
that attribute (masks queued behind running ones, so a freed worker needs no driver round trip; 0 if
absent). A failed evaluation comes back as an exception in place of the result, so the driver can fail
that trial and retry it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # torch stays unimported for the commands that only read studies
    import torch

    from dimr.masks import SublayerMask
    from dimr.pairs import Pair


@dataclass(frozen=True)
class EvalSpec:
    """Everything a worker needs to build its scorer: picklable, so Ray actors can receive it."""

    pair: Pair
    input_ids: torch.Tensor  # the packed calibration tokens, [num_sequences, seq_len]
    cost: str = "kl"
    device: str | None = None
    batch_size: int = 4  # calibration sequences per forward: bounds one evaluation's working set
    prefix_reuse: bool = True  # keep every layer's input (cheaper evaluations, (L + 1) × the cache)
    gpus_per_worker: int = 1  # devices one worker spreads the verifier over (device_map="auto")
    cache_on_host: bool | None = None  # keep the cache on the host; None: when the device is short


@dataclass(frozen=True)
class Evaluation:
    """One mask scored on the calibration tokens (means over tokens)."""

    mask: tuple[bool, ...] | SublayerMask  # a layer mask, or a sublayer search's mask
    cost: float
    top1_agreement: float
    expected_acceptance: float
    tokens: int
    seconds: float
    worker: str = "local"
    extra: dict = field(default_factory=dict)

    def metrics(self) -> dict:
        return {"top1_agreement": self.top1_agreement, "expected_acceptance": self.expected_acceptance,
                "tokens": self.tokens, "seconds": self.seconds, "worker": self.worker}


class Evaluator(Protocol):
    num_layers: int
    slots: int
    # Optional: ``ahead: int``, masks to keep in flight beyond ``slots`` (the driver reads 0 when absent).

    def submit(self, ticket: int, mask: tuple[bool, ...] | SublayerMask) -> None:
        """Start scoring ``mask`` (a layer or sublayer mask); its result comes back from `wait` under ``ticket``."""

    def wait(self, timeout: float | None = None) -> list[tuple[int, Evaluation | BaseException]]:
        """Block until at least one submitted mask is done (or ``timeout``); return what finished."""

    def block_influence(self) -> list[float]:
        """ShortGPT's block influence per layer: 1 − cos(layer input, layer output) on calibration data."""

    # Optional, for sublayer searches: ``sublayer_influence() -> list[float]``, the same per attention and MLP
    # (`dimr.masks.sublayer_space` order).

    def close(self) -> None: ...

"""Layer masks, the budget, and the codecs between masks, keys and Optuna params.

A *layer mask* has one bool per verifier decoder layer (True = the layer runs). Its *key* is the mask as a
string, one char per layer ("1" keep, "0" skip: ``"11011111"``); its *params* are one Optuna categorical per
layer (``layer_07`` = 1 keeps layer 7), so a trial's params are its mask.

The budget: how many verifier layers the slim verifier skips, and masks that respect it.

``--budget 4`` skips exactly 4 layers; ``--budget 0.25`` skips round(0.25·L). A single-objective search
always wants the fewest skipped layers it may, so an "at most" budget would collapse to the exact one;
the cost-vs-compute trade-off belongs to a Pareto study instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from optuna.distributions import CategoricalDistribution

from dimr.errors import DimrError

Mask = tuple[bool, ...]
PARAM = "layer_{:02d}"
BIT = CategoricalDistribution((0, 1))


def mask_key(mask: Sequence[bool]) -> str:
    """The mask as a string, one char per layer: "1" keep, "0" skip (e.g. "11011111")."""
    return "".join("1" if m else "0" for m in mask)


def mask_from_key(key: str) -> Mask:
    """Inverse of :func:`mask_key`."""
    if not key or set(key) - {"0", "1"}:
        raise DimrError(
            f"layer mask {key!r} is not a string of 0s and 1s; write one 1 (keep) or 0 (skip) per layer"
        )
    return tuple(c == "1" for c in key)


def kept_layers(mask: Sequence[bool]) -> list[int]:
    """Indices of the layers that run."""
    return [i for i, m in enumerate(mask) if m]


def first_skipped(mask: Sequence[bool]) -> int:
    """Index of the first skipped layer, or ``len(mask)`` if the mask skips nothing."""
    return next((i for i, m in enumerate(mask) if not m), len(mask))


def mask_space(num_layers: int) -> dict[str, CategoricalDistribution]:
    """The Optuna search space of a verifier with ``num_layers`` layers: one 0/1 categorical per layer."""
    return {PARAM.format(i): BIT for i in range(num_layers)}


def params_to_mask(params: dict, num_layers: int) -> Mask:
    return tuple(bool(params[PARAM.format(i)]) for i in range(num_layers))


def mask_to_params(mask: Mask) -> dict[str, int]:
    return {PARAM.format(i): int(b) for i, b in enumerate(mask)}


@dataclass(frozen=True)
class Budget:
    num_layers: int
    skip: int

    @property
    def keep(self) -> int:
        return self.num_layers - self.skip

    def admits(self, mask: Mask) -> bool:
        return len(mask) == self.num_layers and sum(not b for b in mask) == self.skip

    def describe(self) -> str:
        return f"skip {self.skip} of {self.num_layers} layers"


def parse_budget(text: str | float | int, num_layers: int) -> Budget:
    """``"4"`` → skip 4 layers; ``"0.25"`` → skip round(0.25·L). Raises DimrError if impossible."""
    s = str(text).strip()
    try:
        value = float(s)
    except ValueError:
        raise DimrError(f"budget {s!r} is not a number; give layers to skip (4) or a fraction (0.25)") from None
    if value.is_integer() and "." not in s:
        skip = int(value)
    elif 0 < value < 1:
        skip = round(value * num_layers)
    else:
        raise DimrError(f"budget {s!r} is neither a whole layer count nor a fraction in (0, 1)")
    if not 1 <= skip <= num_layers - 1:
        raise DimrError(f"budget {s!r} skips {skip} of {num_layers} layers; "
                        f"skip between 1 and {num_layers - 1}")
    return Budget(num_layers, skip)


def random_mask(budget: Budget, rng: np.random.Generator) -> Mask:
    """A mask drawn uniformly among those that skip exactly ``budget.skip`` layers."""
    skipped = set(rng.choice(budget.num_layers, size=budget.skip, replace=False).tolist())
    return tuple(i not in skipped for i in range(budget.num_layers))


def project(mask: Mask, budget: Budget, rng: np.random.Generator) -> Mask:
    """The nearest budget mask (fewest flips): keep or skip random extra layers until the count fits."""
    bits = list(mask)
    skipped = [i for i, b in enumerate(bits) if not b]
    kept = [i for i, b in enumerate(bits) if b]
    if len(skipped) > budget.skip:
        for i in rng.choice(skipped, size=len(skipped) - budget.skip, replace=False):
            bits[int(i)] = True
    elif len(skipped) < budget.skip:
        for i in rng.choice(kept, size=budget.skip - len(skipped), replace=False):
            bits[int(i)] = False
    return tuple(bits)


def neighbour(mask: Mask, rng: np.random.Generator) -> Mask:
    """Swap one skipped layer with one kept layer: same budget, Hamming distance 2."""
    bits = list(mask)
    i = int(rng.choice([j for j, b in enumerate(bits) if not b]))
    k = int(rng.choice([j for j, b in enumerate(bits) if b]))
    bits[i], bits[k] = True, False
    return tuple(bits)


# --- sublayer masks ------------------------------------------------------------------------------------
#
# A *sublayer mask* decides each layer's attention and MLP on their own (2 bits a layer). Its key has one
# char per layer: "1" runs both, "a" attention only, "m" MLP only, "0" neither. A whole-layer key is the
# special case without "a"/"m", so every layer-mask key reads as the same sublayer mask.

SUBLAYER_CHARS = {(True, True): "1", (True, False): "a", (False, True): "m", (False, False): "0"}
_CHAR_BITS = {c: bits for bits, c in SUBLAYER_CHARS.items()}
ATTN_PARAM = "attn_{:02d}"
MLP_PARAM = "mlp_{:02d}"


@dataclass(frozen=True)
class SublayerMask:
    """Per layer: does its attention run (``attn``), does its MLP run (``mlp``)."""

    attn: Mask
    mlp: Mask

    def __post_init__(self) -> None:
        if len(self.attn) != len(self.mlp):
            raise ValueError(f"attn has {len(self.attn)} bits but mlp has {len(self.mlp)}")
        object.__setattr__(self, "attn", tuple(bool(b) for b in self.attn))
        object.__setattr__(self, "mlp", tuple(bool(b) for b in self.mlp))

    @classmethod
    def from_layer_mask(cls, mask: Sequence[bool]) -> SublayerMask:
        return cls(tuple(mask), tuple(mask))

    @classmethod
    def from_key(cls, key: str) -> SublayerMask:
        if not key or set(key) - set(_CHAR_BITS):
            raise DimrError(f"sublayer mask {key!r} is not a string of 1/a/m/0; write one char per layer: "
                            "1 (both run), a (attention only), m (MLP only), 0 (skip)")
        return cls(tuple(_CHAR_BITS[c][0] for c in key), tuple(_CHAR_BITS[c][1] for c in key))

    def __len__(self) -> int:
        return len(self.attn)

    @property
    def key(self) -> str:
        return "".join(SUBLAYER_CHARS[bits] for bits in zip(self.attn, self.mlp, strict=True))

    @property
    def is_layer_mask(self) -> bool:
        """True if every layer runs both sublayers or neither."""
        return self.attn == self.mlp

    def layer_mask(self) -> Mask:
        """The equivalent whole-layer mask; ValueError if some layer runs only one sublayer."""
        if not self.is_layer_mask:
            raise ValueError(f"sublayer mask {self.key} runs some layer only in part")
        return self.attn

    def first_partial(self) -> int:
        """Index of the first layer that does not run in full, or ``len(self)`` if none."""
        return next((i for i, (a, m) in enumerate(zip(self.attn, self.mlp, strict=True)) if not (a and m)),
                    len(self))

    def runs_nothing(self) -> bool:
        return not any(self.attn) and not any(self.mlp)


def as_sublayer_mask(mask: Sequence[bool] | SublayerMask) -> SublayerMask:
    """A layer mask as the sublayer mask that runs both or neither sublayer of each layer."""
    return mask if isinstance(mask, SublayerMask) else SublayerMask.from_layer_mask(mask)


def sublayer_space(num_layers: int) -> dict[str, CategoricalDistribution]:
    """The Optuna search space of sublayer masks: ``attn_07`` and ``mlp_07`` (0/1) per layer."""
    return {p.format(i): BIT for i in range(num_layers) for p in (ATTN_PARAM, MLP_PARAM)}


def params_to_sublayer_mask(params: dict, num_layers: int) -> SublayerMask:
    return SublayerMask(tuple(bool(params[ATTN_PARAM.format(i)]) for i in range(num_layers)),
                        tuple(bool(params[MLP_PARAM.format(i)]) for i in range(num_layers)))


def sublayer_mask_to_params(mask: SublayerMask) -> dict[str, int]:
    return {p.format(i): int(bits[i]) for i in range(len(mask))
            for p, bits in ((ATTN_PARAM, mask.attn), (MLP_PARAM, mask.mlp))}

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

    # What the search asks of a budget (`dimr.search`): a mask is one bool per layer; `CostBudget` is the
    # other kind, over sublayer bits.
    granularity = "layer"

    @property
    def bits(self) -> int:
        """Length of a search mask: one bit per layer."""
        return self.num_layers

    def space(self) -> dict[str, CategoricalDistribution]:
        return mask_space(self.num_layers)

    def to_params(self, mask: Mask) -> dict[str, int]:
        return mask_to_params(mask)

    def from_params(self, params: dict) -> Mask:
        return params_to_mask(params, self.num_layers)

    def key(self, mask: Mask) -> str:
        return mask_key(mask)

    def from_key(self, key: str) -> Mask:
        return mask_from_key(key)

    def routed(self, mask: Mask) -> Mask:
        """What the slim verifier is built from (`dimr.slim`): the layer mask itself."""
        return mask

    def random(self, rng: np.random.Generator) -> Mask:
        return random_mask(self, rng)

    def neighbour(self, mask: Mask, rng: np.random.Generator) -> Mask:
        return neighbour(mask, rng)

    def project(self, mask: Mask, rng: np.random.Generator) -> Mask:
        return project(mask, self, rng)

    def moves(self, mask: Mask, rng: np.random.Generator) -> list[Mask]:
        """The swap neighbourhood the swap proposer searches: every one-swap mask (``rng`` unused)."""
        return swaps(mask)

    def all_masks(self, limit: int) -> list[Mask] | None:
        """Every budget mask (in a fixed order), or None if there are more than ``limit``."""
        import itertools
        import math

        n, k = self.num_layers, self.skip
        if math.comb(n, k) > limit:
            return None
        return [tuple(i not in c for i in range(n)) for c in itertools.combinations(range(n), k)]

    def count(self) -> int:
        import math

        return math.comb(self.num_layers, self.skip)


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


def swaps(mask: Mask) -> list[Mask]:
    """Every mask one swap away (one skipped layer kept, one kept layer skipped)."""
    out = []
    skipped = [i for i, b in enumerate(mask) if not b]
    kept = [i for i, b in enumerate(mask) if b]
    for i in skipped:
        for j in kept:
            bits = list(mask)
            bits[i], bits[j] = True, False
            out.append(tuple(bits))
    return out


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


# --- cost budgets over sublayer masks ------------------------------------------------------------------
#
# A sublayer search's mask is a flat tuple of 2L bools, (attn_0, mlp_0, attn_1, mlp_1, ...), in the order of
# `sublayer_space`: the search machinery (novelty, the swap model's per-bit and pair features, Optuna's
# samplers) then works on bits whatever they mean. The budget is a cost: the slim's cost as a fraction of the
# full verifier's, ``fixed + Σ weight_b · kept_b``, from measured forward times or FLOPs (`dimr.search.budget`).

MOVES_MAX = 2048  # the most masks one `CostBudget.moves` neighbourhood holds (a random subset beyond)
COST_TOL = 1e-9


def bits_to_sublayer(bits: Sequence[bool]) -> SublayerMask:
    return SublayerMask(tuple(bits[0::2]), tuple(bits[1::2]))


def sublayer_to_bits(mask: SublayerMask) -> Mask:
    return tuple(b for pair in zip(mask.attn, mask.mlp, strict=True) for b in pair)


@dataclass(frozen=True)
class CostBudget:
    """Sublayer masks whose cost fraction ``fixed + Σ weights[b]·bit_b`` is at most ``max_cost``, running at
    least one attention (a slim verifier needs one cache slot that fills). ``weights``: one per bit, in
    `sublayer_space` order; ``fixed + sum(weights) == 1`` (the full verifier). ``source``: where the weights
    came from (measured or FLOPs), as the study records it."""

    num_layers: int
    max_cost: float
    weights: tuple[float, ...]
    fixed: float
    source: str = ""
    granularity = "sublayer"

    def __post_init__(self) -> None:
        if len(self.weights) != 2 * self.num_layers:
            raise ValueError(f"{len(self.weights)} weights for {self.num_layers} layers; want 2 per layer")

    @property
    def bits(self) -> int:
        return 2 * self.num_layers

    def cost(self, mask: Sequence[bool]) -> float:
        """The cost fraction of a bit mask (1.0: the full verifier)."""
        return self.fixed + sum(w for w, b in zip(self.weights, mask, strict=True) if b)

    def admits(self, mask: Sequence[bool]) -> bool:
        return (len(mask) == self.bits and any(mask[0::2])
                and self.cost(mask) <= self.max_cost + COST_TOL)

    def describe(self) -> str:
        return f"cost at most {self.max_cost:g} of the full verifier ({self.source})"

    def space(self) -> dict[str, CategoricalDistribution]:
        return sublayer_space(self.num_layers)

    def to_params(self, mask: Mask) -> dict[str, int]:
        return sublayer_mask_to_params(bits_to_sublayer(mask))

    def from_params(self, params: dict) -> Mask:
        return sublayer_to_bits(params_to_sublayer_mask(params, self.num_layers))

    def key(self, mask: Mask) -> str:
        return bits_to_sublayer(mask).key

    def from_key(self, key: str) -> Mask:
        return sublayer_to_bits(SublayerMask.from_key(key))

    def routed(self, mask: Mask) -> SublayerMask:
        return bits_to_sublayer(mask)

    def fill(self, bits: list[bool], order: Sequence[int]) -> Mask:
        """Skip the kept bits of ``order`` in turn until the mask fits (never the last running attention)."""
        for b in order:
            if self.cost(bits) <= self.max_cost + COST_TOL:
                break
            if bits[b] and (b % 2 or sum(bits[0::2]) > 1):
                bits[b] = False
        return tuple(bits)

    def random(self, rng: np.random.Generator) -> Mask:
        """Skip bits in a random order until the cost fits: a random mask that just fits the budget (uniform
        draws among all fitting masks would mostly waste budget, as per-bit coin flips would)."""
        return self.fill([True] * self.bits, rng.permutation(self.bits).tolist())

    def project(self, mask: Mask, rng: np.random.Generator) -> Mask:
        """``mask`` with random kept bits skipped until it fits (and one attention run if none does)."""
        bits = list(mask)
        if not any(bits[0::2]):
            bits[2 * int(rng.integers(self.num_layers))] = True
        return self.fill(bits, rng.permutation(self.bits).tolist())

    def neighbour(self, mask: Mask, rng: np.random.Generator) -> Mask:
        """Run one random skipped bit again, then skip random kept bits until the mask fits."""
        bits = list(mask)
        skipped = [i for i, b in enumerate(bits) if not b]
        if skipped:
            bits[int(rng.choice(skipped))] = True
        return self.fill(bits, rng.permutation(self.bits).tolist())

    def moves(self, mask: Mask, rng: np.random.Generator) -> list[Mask]:
        """The neighbourhood the swap proposer searches: run one skipped bit again and skip none, one or (where
        one is not enough) two kept bits, every result within the budget; a random ``MOVES_MAX`` of them if
        more."""
        skipped = [i for i, b in enumerate(mask) if not b]
        kept = [i for i, b in enumerate(mask) if b]
        w, limit, base = self.weights, self.max_cost + COST_TOL, self.cost(mask)
        attentions = sum(mask[0::2])

        def fits(i: int, *off: int) -> bool:  # run bit i, skip bits ``off``: within the cost, some attention left
            left = attentions + (i % 2 == 0) - sum(b % 2 == 0 for b in off)
            return base + w[i] - sum(w[b] for b in off) <= limit and left > 0

        out: list[Mask] = []

        def add(i: int, *off: int) -> None:
            bits = list(mask)
            bits[i] = True
            for b in off:
                bits[b] = False
            out.append(tuple(bits))

        for i in skipped:
            if fits(i):
                add(i)
            short = []  # kept bits whose skip alone does not make up for running i
            for j in kept:
                (add(i, j) if fits(i, j) else short.append(j))
            for a, j in enumerate(short):
                for k in short[a + 1:]:
                    if fits(i, j, k):
                        add(i, j, k)
        if len(out) > MOVES_MAX:
            out = [out[i] for i in sorted(rng.choice(len(out), MOVES_MAX, replace=False).tolist())]
        return out

    def all_masks(self, limit: int) -> list[Mask] | None:
        """Every budget mask, or None if the bits are too many to list (more than ``limit`` masks of all)."""
        if 2 ** self.bits > limit * 16:
            return None
        import itertools

        out = [m for m in itertools.product((False, True), repeat=self.bits) if self.admits(m)]
        return out if len(out) <= limit else None

    def count(self, cap: int = 10 ** 9) -> int:
        """How many masks fit (``cap`` if at least that many): a dynamic programme over bits on the cost saved,
        exact while the distinct partial sums stay few (they do: layers of one kind cost alike)."""
        need = self.fixed + sum(self.weights) - self.max_cost - COST_TOL  # the cost a fitting mask saves
        attn, mlp = self.weights[0::2], self.weights[1::2]
        every = _count_saving(self.weights, need, cap)
        no_attention = _count_saving(mlp, need - sum(attn), cap)  # they fit on cost but run no attention
        return cap if every >= cap else every - no_attention


def _count_saving(weights: Sequence[float], need: float, cap: int) -> int:
    """How many subsets of ``weights`` sum to at least ``need`` (``cap`` if at least that many, or if the
    distinct partial sums grow past 100,000)."""
    sums: dict[float, int] = {0.0: 1}  # saved so far (rounded) -> subsets
    for w in weights:
        nxt: dict[float, int] = {}
        for s, c in sums.items():
            for t in (s, round(s + w, 12)):
                nxt[t] = min(cap, nxt.get(t, 0) + c)
        sums = nxt
        if len(sums) > 100_000:
            return cap
    return min(cap, sum(c for s, c in sums.items() if s >= need))

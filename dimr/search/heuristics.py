"""Cheap masks that seed a study before any search: they cost one evaluation each."""

from __future__ import annotations

from dimr.masks import Budget, CostBudget, Mask, SublayerMask, sublayer_to_bits


def skip_last(budget: Budget) -> Mask:
    """Skip the last k layers (the classic early-exit guess)."""
    return tuple(i < budget.keep for i in range(budget.num_layers))


def least_influential(budget: Budget, influence: list[float]) -> Mask:
    """ShortGPT (Men et al., 2024): skip the k layers with the lowest block influence
    BI_i = 1 − E[cos(h_i, h_{i+1})] on calibration data."""
    order = sorted(range(budget.num_layers), key=lambda i: influence[i])
    skipped = set(order[: budget.skip])
    return tuple(i not in skipped for i in range(budget.num_layers))


def spaced_least_influential(budget: Budget, influence: list[float]) -> Mask:
    """Block influence, but never two adjacent layers while the budget allows it: the least influential
    layer, then the least influential one not next to a skipped layer, and so on. Skipping a run of
    layers compounds the damage (each skipped layer's successor sees an input it was not trained on),
    so spread-out skips are usually cheaper than the same layers' influences suggest."""
    skipped: set[int] = set()
    for i in sorted(range(budget.num_layers), key=lambda i: influence[i]):
        if len(skipped) < budget.skip and i - 1 not in skipped and i + 1 not in skipped:
            skipped.add(i)
    for i in sorted(range(budget.num_layers), key=lambda i: influence[i]):  # too many skips to spread out
        if len(skipped) < budget.skip:
            skipped.add(i)
    return tuple(i not in skipped for i in range(budget.num_layers))


def least_influential_window(budget: Budget, influence: list[float]) -> Mask:
    """The k consecutive layers with the lowest summed block influence, skipped together. On pretrained
    verifiers the cheapest masks often skip one contiguous run of middle layers (the "deeper layers are
    redundant" observation of Gromov et al., 2024), which per-layer rankings miss."""
    k, n = budget.skip, budget.num_layers
    start = min(range(n - k + 1), key=lambda i: (sum(influence[i:i + k]), i))
    return tuple(not start <= i < start + k for i in range(n))


def single_skip_masks(bits: int) -> list[Mask]:
    """The profile's masks: each skips one bit (mask i skips layer i; in a sublayer search, attention or MLP i)."""
    return [tuple(j != i for j in range(bits)) for i in range(bits)]


def profile_seed(budget: Budget | CostBudget, profile: list[float]) -> Mask:
    """The profile's seed: `single_skip_rank`, or under a cost budget the bits skipped in order of single-skip
    cost per unit of cost saved until the mask fits (the greedy answer to that knapsack)."""
    if isinstance(budget, CostBudget):
        return budget.fill([True] * budget.bits, sorted(
            range(budget.bits), key=lambda b: (profile[b] / max(budget.weights[b], 1e-12), b)))
    return single_skip_rank(budget, profile)


def single_skip_rank(budget: Budget, profile: list[float]) -> Mask:
    """Skip the k layers whose single skips cost least (``profile[i]``: the cost of skipping layer i alone).

    Unlike block influence this is measured with the search's own cost, and on pretrained verifiers the cost
    of a k-layer skip is close to the sum of its layers' single-skip costs (on smollm2 at skip 8, 1.14 against
    the sum 1.23), so the k cheapest single skips make a strong seed (docs/search.md). The profile costs L
    evaluations (`dimr.search.driver`)."""
    order = sorted(range(budget.num_layers), key=lambda i: (profile[i], i))
    skipped = set(order[: budget.skip])
    return tuple(i not in skipped for i in range(budget.num_layers))


def seed_masks(budget: Budget, influence: list[float]) -> list[tuple[str, Mask]]:
    """The heuristic seeds, named, without duplicates."""
    out: list[tuple[str, Mask]] = []
    for name, mask in (("skip-last", skip_last(budget)), ("block-influence", least_influential(budget, influence)),
                       ("spaced-influence", spaced_least_influential(budget, influence)),
                       ("influence-window", least_influential_window(budget, influence))):
        if all(mask != m for _, m in out):
            out.append((name, mask))
    return out


def sublayer_seed_masks(budget: CostBudget, influence: list[float],
                        sublayer_influence: list[float]) -> list[tuple[str, Mask]]:
    """The seeds of a sublayer search (bit masks within the cost ``budget``), named, without duplicates:

    - ``layer:NAME``: the whole-layer seeds (`seed_masks`) at the fewest skipped layers that fit the budget,
      as sublayer masks (those that fit);
    - ``sublayer-influence``: skip the least influential sublayers (``sublayer_influence``, one per bit) until
      the cost fits;
    - ``sublayer-influence-per-cost``: the same, ranked by influence per unit of cost saved (cheap-to-lose
      sublayers that also save much first).
    """
    n = budget.num_layers
    out: list[tuple[str, Mask]] = []

    def add(name: str, mask: Mask) -> None:
        if budget.admits(mask) and all(mask != m for _, m in out):
            out.append((name, mask))

    for k in range(1, n):
        fitting = [(name, sublayer_to_bits(SublayerMask.from_layer_mask(m)))
                   for name, m in seed_masks(Budget(n, k), influence)]
        fitting = [(name, m) for name, m in fitting if budget.admits(m)]
        if fitting:
            for name, m in fitting:
                add(f"layer:{name}", m)
            break
    bits = range(budget.bits)
    add("sublayer-influence", budget.fill([True] * budget.bits, sorted(bits, key=lambda b: sublayer_influence[b])))
    add("sublayer-influence-per-cost", budget.fill([True] * budget.bits, sorted(
        bits, key=lambda b: sublayer_influence[b] / max(budget.weights[b], 1e-12))))
    return out

"""Cheap masks that seed a study before any search: they cost one evaluation each."""

from __future__ import annotations

from dimr.masks import Budget, Mask


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


def seed_masks(budget: Budget, influence: list[float]) -> list[tuple[str, Mask]]:
    """The heuristic seeds, named, without duplicates."""
    out: list[tuple[str, Mask]] = []
    for name, mask in (("skip-last", skip_last(budget)), ("block-influence", least_influential(budget, influence)),
                       ("spaced-influence", spaced_least_influential(budget, influence)),
                       ("influence-window", least_influential_window(budget, influence))):
        if all(mask != m for _, m in out):
            out.append((name, mask))
    return out

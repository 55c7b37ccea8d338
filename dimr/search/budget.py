"""The budget of a sublayer search: each attention's and MLP's share of one forward of the verifier.

``--max-cost F`` admits the sublayer masks whose slim verifier costs at most F of a full verifier forward
(`dimr.masks.CostBudget`). The shares come from the cost model where it has a sublayer measurement for the pair
(`dimr bench-forward --sublayers --out costs.json`, then ``--costs costs.json``: the seconds of one attention,
one MLP and the rest of a 1-token forward, `dimr.decoding.costs.measure_sublayers`), else from FLOPs
(`dimr.flops`, at the calibration's context length). The study records which (`StudySettings.cost_model`).
"""

from __future__ import annotations

import math
from pathlib import Path

from dimr.errors import DimrError
from dimr.masks import CostBudget

GRANULARITIES = ("layer", "sublayer")


def parse_max_cost(value: float | str) -> float:
    """``--max-cost``: a fraction of the full verifier's cost, strictly between 0 and 1."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise DimrError(f"--max-cost {value!r} is not a number; give a fraction of the full verifier's cost "
                        "in (0, 1), e.g. 0.8") from None
    if not (math.isfinite(f) and 0 < f < 1):
        raise DimrError(f"--max-cost {value} is outside (0, 1); give the slim's cost as a fraction of a full "
                        "verifier forward, e.g. 0.8")
    return f


def _normalised(num_layers: int, max_cost: float, attn: list[float], mlp: list[float], fixed: float,
                source: str) -> CostBudget:
    total = fixed + sum(attn) + sum(mlp)
    weights = tuple(w / total for pair in zip(attn, mlp, strict=True) for w in pair)
    return CostBudget(num_layers, max_cost, weights, fixed / total, source)


def flops_budget(config, max_cost: float, context: int) -> CostBudget:
    """Shares by matrix-multiply FLOPs per token at ``context`` attended tokens (LM head in the fixed part)."""
    from dimr.flops import layer_flops, mask_flops

    layers = layer_flops(config, context=context)
    head = mask_flops(config, (False,) * len(layers), context=context)  # the LM head alone
    return _normalised(len(layers), max_cost, [f.attention for f in layers], [f.mlp for f in layers], head,
                       f"FLOPs at context {context}")


def measured_budget(costs, pair: str, num_layers: int, max_cost: float, where: str = "the cost table") -> CostBudget:
    """Shares by the measured 1-token forward of `costs.sublayers` (a `dimr.decoding.costs.Costs`)."""
    sub = costs.sublayers
    fix = f"measure them with `dimr bench-forward --pair {pair} --sublayers --out costs.json`"
    if not sub:
        raise DimrError(f"{where} has no attention/MLP measurement; {fix}, or leave out --costs to budget "
                        "by FLOPs")
    if sub.get("pair") != pair or sub.get("layers") != num_layers:
        raise DimrError(f"{where} was measured on pair {sub.get('pair')!r} ({sub.get('layers')} layers), not "
                        f"{pair!r} ({num_layers} layers); {fix}")
    n = min(sub["attention"])
    attn, mlp, fixed = sub["attention"][n], sub["mlp"][n], sub["fixed"][n]
    if not (attn > 0 and mlp > 0 and fixed >= 0):
        raise DimrError(f"{where}'s attention/MLP times ({attn * 1e3:.3f} / {mlp * 1e3:.3f} ms) are not positive: "
                        f"the machine was too noisy; {fix} and more --reps")
    return _normalised(num_layers, max_cost, [attn] * num_layers, [mlp] * num_layers, fixed,
                       f"measured {n}-token forward: attention {attn * 1e3:.3f} ms, MLP {mlp * 1e3:.3f} ms, "
                       f"rest {fixed * 1e3:.3f} ms")


def cost_budget(pair: str, config, max_cost: float | str, costs_path: Path | None, context: int) -> CostBudget:
    """The budget of ``dimr search --granularity sublayer``: measured if ``costs_path`` is given, else FLOPs."""
    f = parse_max_cost(max_cost)
    if costs_path is None:
        return flops_budget(config, f, context)
    from dimr.decoding.costs import Costs

    return measured_budget(Costs.load(Path(costs_path)), pair, config.num_hidden_layers, f,
                           f"cost table {costs_path}")

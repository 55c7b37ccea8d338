"""Static ensemble: π_rej = π_res = w·p_t + (1 − w)·p_d, π_bonus = p_t (DIVERSED's baseline).

Acceptance is 1 − w·TV(p_d, p_t) and the bias TV(π, p_t) = (1 − w)·TV(p_d, p_t): the straight-line trade-off
that DIVERSED proves Pareto-optimal among static ensembles. ``w = 1`` is lossless. Greedy (temperature 0): p_d
and p_t are one-hot, so a mismatched draft token is accepted with probability 1 − w and the output becomes
random; that is the rule applied to the decoder's distributions, not a bug.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from dimr.decoding.verify import Context, Targets
from dimr.relaxed.base import mix


@dataclass(frozen=True)
class StaticEnsemble:
    w: float = 1.0  # weight on the full verifier; 1 = lossless, 0 = accept every draft

    def __call__(self, draft_probs: Tensor, full_probs: Tensor, context: Context | None = None) -> Targets:
        ensemble = mix(self.w, full_probs[:-1], draft_probs)
        return Targets(ensemble, ensemble, full_probs[-1])

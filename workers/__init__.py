"""Mask evaluators. The search driver sees only the `Evaluator` interface (`workers.base`); in-process or Ray is
a choice made at construction time (`make_evaluator`)."""

from workers.base import EvalSpec, Evaluation, Evaluator

__all__ = ["EvalSpec", "Evaluation", "Evaluator", "make_evaluator"]


def make_evaluator(spec: EvalSpec, workers: int = 1, ray_address: str | None = None) -> Evaluator:
    """In-process for one worker and no cluster; a Ray actor pool otherwise."""
    if workers <= 1 and ray_address is None:
        from workers.local import LocalEvaluator

        return LocalEvaluator(spec)
    from workers.ray_pool import RayPool

    return RayPool(spec, workers=workers, address=ray_address)

"""Mask evaluators. The search driver sees only the `Evaluator` interface; in-process or Ray is a choice
made at construction time (`make_evaluator`)."""

from workers.base import EvalSpec, Evaluation, Evaluator, make_evaluator

__all__ = ["EvalSpec", "Evaluation", "Evaluator", "make_evaluator"]

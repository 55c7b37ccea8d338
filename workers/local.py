"""In-process mask scoring: the verifier is loaded once and the full model's reference is kept.

Per calibration batch, the scorer keeps the full verifier's log-probs (the reference every mask is
compared with) and the hidden state entering every layer. A mask's slim forward then starts at its
first skipped layer: the layers before it would compute exactly what is cached.
"""

from __future__ import annotations

import time
from collections import deque

import torch

from dimr import cost as costs
from dimr.pairs import load_model, pick_device
from dimr.slim import forward_from, layer_inputs, num_layers, slim_verifier
from workers.base import EvalSpec, Evaluation


class MaskScorer:
    """Scores masks against the full verifier on a fixed block of calibration tokens."""

    def __init__(self, spec: EvalSpec, name: str = "local"):
        self.spec, self.name = spec, name
        self.device = pick_device(spec.device)
        self.verifier = load_model(spec.pair, "verifier", self.device)
        self.num_layers = num_layers(self.verifier)
        if spec.cost not in costs.COSTS:
            raise ValueError(f"unknown cost {spec.cost!r}")
        draft = load_model(spec.pair, "draft", self.device) if spec.cost in costs.NEEDS_DRAFT else None
        self.batches = []
        with torch.inference_mode():
            for ids in spec.input_ids.split(spec.batch_size):
                ids = ids.to(self.device)
                hidden = layer_inputs(self.verifier, ids)
                full = (True,) * self.num_layers
                full_logp = torch.log_softmax(forward_from(self.verifier, full, hidden).float(), -1)
                draft_logp = torch.log_softmax(draft(ids).logits.float(), -1) if draft is not None else None
                self.batches.append((ids, hidden if spec.prefix_reuse else None, full_logp, draft_logp))
        del draft

    @torch.inference_mode()
    def score(self, mask: tuple[bool, ...]) -> Evaluation:
        t0 = time.perf_counter()
        totals = {"cost": 0.0, "top1_agreement": 0.0, "expected_acceptance": 0.0}
        n = 0
        slim = None if self.spec.prefix_reuse else slim_verifier(self.verifier, mask)
        for ids, hidden, full_logp, draft_logp in self.batches:
            if hidden is not None:
                logits = forward_from(self.verifier, mask, hidden)
            else:
                logits = slim(ids).logits
            slim_logp = torch.log_softmax(logits.float(), -1)
            m = costs.evaluate_logits(full_logp, slim_logp, self.spec.cost, draft_logp=draft_logp)
            k = ids.numel()
            for key in totals:
                totals[key] += m[key] * k
            n += k
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return Evaluation(mask=tuple(mask), tokens=n, seconds=time.perf_counter() - t0, worker=self.name,
                          **{k: v / n for k, v in totals.items()})

    @torch.inference_mode()
    def block_influence(self) -> list[float]:
        sums = torch.zeros(self.num_layers, dtype=torch.float64)
        for ids, hidden, _, _ in self.batches:
            if hidden is None:
                hidden = layer_inputs(self.verifier, ids)
            for i in range(self.num_layers):
                cos = torch.nn.functional.cosine_similarity(hidden[i].float(), hidden[i + 1].float(), dim=-1)
                sums[i] += (1 - cos).sum().item()
        return (sums / self.spec.input_ids.numel()).tolist()


class LocalEvaluator:
    """One in-process scorer, one slot: `wait` scores the oldest submitted mask."""

    slots = 1

    def __init__(self, spec: EvalSpec):
        self.scorer = MaskScorer(spec)
        self.num_layers = self.scorer.num_layers
        self._queue: deque[tuple[int, tuple[bool, ...]]] = deque()

    def submit(self, ticket: int, mask: tuple[bool, ...]) -> None:
        self._queue.append((ticket, mask))

    def wait(self, timeout: float | None = None) -> list[tuple[int, Evaluation | BaseException]]:
        if not self._queue:
            return []
        ticket, mask = self._queue.popleft()
        try:
            return [(ticket, self.scorer.score(mask))]
        except Exception as e:  # noqa: BLE001 - handed to the driver, which fails and retries the trial
            return [(ticket, e)]

    def block_influence(self) -> list[float]:
        return self.scorer.block_influence()

    def close(self) -> None:
        self._queue.clear()

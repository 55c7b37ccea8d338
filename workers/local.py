"""In-process mask scoring: the verifier is loaded once and what the reference needs is cached.

Per calibration batch, the scorer keeps the hidden state entering every layer (prefix reuse; without it,
only the last layer's output). A mask's slim forward then starts at its first skipped layer: the layers before
it would compute exactly what is cached. The reference log-probs are never kept at full vocabulary size: the
full model's final-norm output comes from the cached last-layer output, and both models' heads and the cost
run a few hundred tokens at a time (`dimr.memory`: what one worker needs, checked before any weight loads).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

import torch
from torch import Tensor

from dimr import cost as costs
from dimr import memory
from dimr.masks import SublayerMask
from dimr.pairs import load_model, model_dtype, pick_device, verifier_config
from dimr.slim import final_hidden_from, head_logits, layer_inputs, mid_states, num_layers, slim_verifier
from workers.base import EvalSpec, Evaluation


class _Cached(Sequence):
    """Cached layer inputs by index (all L + 1, or only the last layer's output), on the host or a device;
    indexing moves one tensor to where it is used."""

    def __init__(self, tensors: dict[int, Tensor], size: int, device: torch.device | None):
        self.tensors, self.size, self.device = tensors, size, device

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> Tensor:  # type: ignore[override]
        t = self.tensors[i]
        return t if self.device is None else t.to(self.device, non_blocking=True)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def worker_plan(spec: EvalSpec, device: torch.device, config=None) -> memory.Plan:
    """The memory plan of a worker for ``spec`` on ``device``, fitted to what is free there (DimrError if it
    cannot fit). Reads only configs."""
    from dimr.pairs import draft_config

    config = config or verifier_config(spec.pair)
    n, t = spec.input_ids.shape
    dtype = model_dtype(spec.pair, device)
    plan = memory.estimate(config, n, t, spec.batch_size, dtype, spec.prefix_reuse,
                           draft_config(spec.pair) if spec.cost in costs.NEEDS_DRAFT else None,
                           cache_on_host=bool(spec.cache_on_host))
    if spec.cache_on_host is not None:
        return plan
    return memory.fit(plan, memory.free_device_bytes(device, spec.gpus_per_worker), memory.host_available_bytes(),
                      spec.gpus_per_worker, on_gpu=device.type == "cuda")


class MaskScorer:
    """Scores masks against the full verifier on a fixed block of calibration tokens."""

    def __init__(self, spec: EvalSpec, name: str = "local"):
        self.spec, self.name = spec, name
        if spec.cost not in costs.COSTS:
            raise ValueError(f"unknown cost {spec.cost!r}")
        self.device = pick_device(spec.device)
        self.plan = worker_plan(spec, self.device)  # before any weight loads: refuse what cannot fit
        self.verifier = load_model(spec.pair, "verifier", self.device, gpus=spec.gpus_per_worker,
                                   reserve=self.plan.work + (0 if self.plan.cache_on_host else self.plan.cache))
        self.num_layers = num_layers(self.verifier)
        self.draft = load_model(spec.pair, "draft", self.device) if spec.cost in costs.NEEDS_DRAFT else None
        self.chunk = memory.head_chunk(self.verifier.config.get_text_config().vocab_size)
        host = self.plan.cache_on_host and self.device.type != "cpu"
        keep = range(self.num_layers + 1) if spec.prefix_reuse else (self.num_layers,)
        self.batches: list[tuple[Tensor, _Cached, Tensor | None]] = []
        with torch.inference_mode():
            for ids in spec.input_ids.split(spec.batch_size):
                ids = ids.to(self.device)
                hidden = layer_inputs(self.verifier, ids)
                kept = {i: hidden[i].to("cpu", non_blocking=False).pin_memory() if host else hidden[i] for i in keep}
                del hidden
                draft_out = self.draft.model(input_ids=ids).last_hidden_state if self.draft is not None else None
                self.batches.append((ids, _Cached(kept, self.num_layers + 1, self.device if host else None),
                                     draft_out))

    def cache_bytes(self) -> int:
        """Bytes of the cached hidden states (what `dimr.memory.estimate` calls the cache)."""
        return sum(c.nbytes() + (0 if d is None else d.numel() * d.element_size()) for _, c, d in self.batches)

    @torch.inference_mode()
    def score(self, mask: tuple[bool, ...] | SublayerMask) -> Evaluation:
        t0 = time.perf_counter()
        totals = {"cost": 0.0, "top1_agreement": 0.0, "expected_acceptance": 0.0}
        n = 0
        full = (True,) * self.num_layers
        slim = None if self.spec.prefix_reuse else slim_verifier(self.verifier, mask)
        for ids, cached, draft_out in self.batches:
            ref = final_hidden_from(self.verifier, full, cached)  # the last layer's output through the norm
            if slim is None:
                out = final_hidden_from(self.verifier, mask, cached)
            else:
                out = slim.model(input_ids=ids, use_cache=False).last_hidden_state
            for key, value in self._sums(ref, out, draft_out).items():
                totals[key] += value
            n += ids.numel()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        mask = mask if isinstance(mask, SublayerMask) else tuple(mask)
        return Evaluation(mask=mask, tokens=n, seconds=time.perf_counter() - t0, worker=self.name,
                          **{k: v / n for k, v in totals.items()})

    def _sums(self, ref: Tensor, out: Tensor, draft_out: Tensor | None) -> dict[str, float]:
        """Cost sums over a batch's tokens, the heads run `chunk` tokens at a time (exact: per-token math)."""
        ref, out = ref.reshape(-1, ref.shape[-1]), out.reshape(-1, out.shape[-1])
        drafted = None if draft_out is None else draft_out.reshape(-1, draft_out.shape[-1])
        sums = dict.fromkeys(("cost", "top1_agreement", "expected_acceptance"), 0.0)
        for lo in range(0, ref.shape[0], self.chunk):
            hi = lo + self.chunk
            full_logits, slim_logits = head_logits(self.verifier, ref[lo:hi]), head_logits(self.verifier, out[lo:hi])
            draft_logits = None if drafted is None else head_logits(self.draft, drafted[lo:hi])
            m = costs.evaluate_logits(full_logits, slim_logits, self.spec.cost, draft_logp=draft_logits,
                                      chunk=self.chunk)
            k = min(hi, ref.shape[0]) - lo
            for key in sums:
                sums[key] += m[key] * k
        return sums

    @torch.inference_mode()
    def block_influence(self) -> list[float]:
        sums = torch.zeros(self.num_layers, dtype=torch.float64)
        for ids, cached, _ in self.batches:
            hidden = cached if self.spec.prefix_reuse else layer_inputs(self.verifier, ids)
            for i in range(self.num_layers):
                cos = torch.nn.functional.cosine_similarity(hidden[i].float(), hidden[i + 1].float(), dim=-1)
                sums[i] += (1 - cos).sum().item()
        return (sums / self.spec.input_ids.numel()).tolist()

    @torch.inference_mode()
    def sublayer_influence(self) -> list[float]:
        """Block influence of each sublayer, in `dimr.masks.sublayer_space` order: 1 − cos(input, output) of
        layer i's attention (its input, the mid state) then of its MLP (the mid state, its output)."""
        sums = torch.zeros(2 * self.num_layers, dtype=torch.float64)
        for ids, cached, _ in self.batches:
            hidden = cached if self.spec.prefix_reuse else layer_inputs(self.verifier, ids)
            mids = mid_states(self.verifier, ids)
            for i in range(self.num_layers):
                for b, (x, y) in enumerate(((hidden[i], mids[i]), (mids[i], hidden[i + 1]))):
                    cos = torch.nn.functional.cosine_similarity(x.float(), y.float(), dim=-1)
                    sums[2 * i + b] += (1 - cos).sum().item()
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

    def sublayer_influence(self) -> list[float]:
        return self.scorer.sublayer_influence()

    def close(self) -> None:
        self._queue.clear()

"""One tier of the decoder (draft, slim or full): a model, its own KV cache, and its counters.

The cache holds the keys/values of the first ``length`` tokens of the sequence. A forward appends to it; on
rejection :meth:`Tier.crop` drops the tail, nothing is recomputed.

Two kinds of cache:

- dynamic (default): transformers' ``DynamicCache``, which grows by ``torch.cat`` each forward. Built without
  the model config, so sliding-window layers (Gemma2, Mistral) keep their whole history too (the attention
  mask still applies the window): a crop can roll back any distance, as ``hier`` needs after several
  inner blocks.
- static + compiled (``compiled=True``, the gpt-fast recipe): transformers' ``StaticLayer``s preallocated for
  the whole decode, where a crop only moves the write position, and a ``torch.compile``d forward (CUDA graphs
  on GPU).
  Inputs are padded to a few bucket sizes so that only a handful of shapes compile: the padded tokens come
  after the real ones, so causal attention keeps them out of the real tokens' outputs, and the crop that
  follows forgets their keys/values. Prompts longer than the largest bucket run the same model eagerly.
  Exact only while no token leaves a sliding window, so a decode longer than the model's smallest sliding
  window falls back to the dynamic cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import Cache, StaticLayer

BUCKETS = (1, 2, 4, 8, 16)  # padded input lengths of compiled forwards
CACHE_ROUND = 256  # static caches are sized in these steps, so that a longer prompt rarely recompiles


def _run(model: PreTrainedModel, cache: Cache, input_ids: Tensor, positions: Tensor, hidden: bool,
         keep: int = 0) -> tuple[Tensor, Tensor | None]:
    """One forward at ``positions`` → (logits [n or keep, V], last hidden states after the final norm)."""
    out = model(input_ids=input_ids[None], position_ids=positions[None], cache_position=positions, cache=cache,
                use_cache=True, logits_to_keep=keep, output_hidden_states=hidden or None)
    return out.logits[0], out.hidden_states[-1][0] if hidden else None


def smallest_window(model: PreTrainedModel) -> int | None:
    """The smallest sliding window among the model's layers, or None if every layer attends globally."""
    config = model.config
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if not window or (types is not None and "sliding_attention" not in types):
        return None
    return int(window)


@dataclass
class Tier:
    """A KV-cached model. ``calls`` counts its forwards, ``seconds``/``cpu_seconds`` the wall/CPU time in them
    when ``timed`` (on a GPU timing synchronises the device every forward, so decodes run untimed by default
    there: ``seconds`` then stays 0)."""

    name: str
    model: PreTrainedModel
    compiled: bool = False  # static cache + compiled forward (see the module docstring)
    timed: bool = True
    cache: Cache = field(init=False)
    length: int = field(init=False, default=0)
    calls: int = field(init=False, default=0)
    fed: int = field(init=False, default=0)  # tokens fed in all forwards
    sizes: dict[int, int] = field(init=False, default_factory=dict)  # tokens fed per forward → forwards
    seconds: float = field(init=False, default=0.0)
    cpu_seconds: float = field(init=False, default=0.0)
    keep_hidden: bool = False  # also keep the last hidden states of each forward (relaxed rules)
    log: list[tuple[int, float]] | None = None  # if a list (and timed): (tokens fed, seconds) of every forward
    hidden: Tensor | None = field(init=False, default=None)  # [keep, d] after the final norm, if keep_hidden
    static: bool = field(init=False, default=False)  # whether this decode runs on the static cache
    _static_cache: Cache | None = field(init=False, default=None, repr=False)
    _static_size: int = field(init=False, default=0, repr=False)
    _step: object = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self, capacity: int = 0) -> None:
        """Empty the cache and zero the counters (a new prompt of up to ``capacity`` tokens in all)."""
        window = smallest_window(self.model)
        self.static = self.compiled and capacity > 0 and (window is None or capacity + BUCKETS[-1] <= window)
        if self.static:
            size = -(-(capacity + BUCKETS[-1]) // CACHE_ROUND) * CACHE_ROUND
            if self._static_cache is None or self._static_size < size:
                self._static_cache, self._static_size = self._new_static_cache(size), size
            self._static_cache.reset()
            self.cache = self._static_cache
        else:
            self.cache = DynamicCache()
        self.length = self.calls = self.fed = 0
        self.sizes = {}
        self.seconds = self.cpu_seconds = 0.0

    def _new_static_cache(self, size: int) -> Cache:
        # Plain static layers everywhere, sliding ones included: exact while the decode fits in every window,
        # and it keeps one cache layout (and one compiled graph per bucket) for every family.
        config = self.model.config
        cache = Cache(layers=[StaticLayer(max_cache_len=size) for _ in range(config.num_hidden_layers)])
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        cache.early_initialization(1, kv_heads, head_dim, self.model.dtype, self.model.device)  # not in a graph
        if self._step is None:
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            on_gpu = self.model.device.type == "cuda"
            self._step = torch.compile(_run, mode="reduce-overhead" if on_gpu else None, dynamic=False)
        return cache

    @torch.inference_mode()  # as the decoding modes: grad mode is part of what a compiled graph assumes
    def warm_up(self, capacity: int) -> None:
        """Compile every bucket now (decodes of up to ``capacity`` tokens then never wait for a compile)."""
        self.reset(capacity)
        if self.static:
            for size in BUCKETS:
                self.forward(torch.zeros(size, dtype=torch.long, device=self.model.device), keep=1)
                self.crop(0)
        self.reset(capacity)

    def forward(self, input_ids: Tensor, keep: int) -> Tensor:
        """Feed ``input_ids`` [n] at positions ``length``… and return the last ``keep`` logits [keep, V]."""
        if self.timed:
            t0, c0 = time.perf_counter(), time.process_time()
        n = input_ids.numel()
        if self.static and n <= BUCKETS[-1]:
            padded = next(b for b in BUCKETS if b >= n)
            positions = torch.arange(self.length, self.length + padded, device=input_ids.device)
            if input_ids.device.type == "cuda":
                # Each call starts afresh (its outputs are copied below), so alternating models and buckets
                # replay their own graphs instead of recording a new path of CUDA-graph trees each time.
                torch.compiler.cudagraph_mark_step_begin()
            logits, hidden = self._step(self.model, self.cache, F.pad(input_ids, (0, padded - n)), positions,
                                        self.keep_hidden)
            self.cache.crop(n - padded)  # forget the padding's keys/values
            # Copies: with CUDA graphs the outputs live in buffers that the next call overwrites.
            logits = logits[n - keep:n].clone()
            hidden = None if hidden is None else hidden[n - keep:n].clone()
        else:
            positions = torch.arange(self.length, self.length + n, device=input_ids.device)
            logits, hidden = _run(self.model, self.cache, input_ids, positions, self.keep_hidden, keep)
            hidden = None if hidden is None else hidden[-keep:]
        self.length += n
        self.hidden = hidden
        if self.timed and logits.device.type == "cuda":
            torch.cuda.synchronize(logits.device)
        self.count(n, (t0, c0) if self.timed else None)
        return logits

    def count(self, n: int, started: tuple[float, float] | None) -> None:
        """Count one forward of ``n`` tokens begun at ``started`` (perf_counter, process_time; None: untimed)."""
        self.calls += 1
        self.fed += n
        self.sizes[n] = self.sizes.get(n, 0) + 1
        if started is not None:
            seconds = time.perf_counter() - started[0]
            self.seconds += seconds
            self.cpu_seconds += time.process_time() - started[1]
            if self.log is not None:
                self.log.append((n, seconds))

    def crop(self, length: int) -> None:
        """Keep the cache of the first ``length`` tokens (no-op if it holds fewer)."""
        drop = max(self.length - length, 0)
        self.cache.crop(-drop)
        self.length -= drop

"""How much memory one scoring worker needs, from the verifier's config and the calibration size alone.

A worker (`workers.local.MaskScorer`) holds, besides the weights:

- the *cache*: with prefix reuse, the hidden state entering every layer plus the last layer's output,
  ``(L + 1) · N · T · H`` elements of the model dtype; without it only the last layer's output
  (``N · T · H``), from which the reference is recomputed. With the bridge cost, the draft's weights and its
  final hidden states (``N · T · H_draft``) too. The cache lives on the device, or on the host when the
  device is short (then one layer input per batch crosses over per evaluation).
- the *working set* of one evaluation on ``B = --batch-size`` sequences: one decoder layer's activations
  (``B · T · (4H + (2q + 2kv) · head_dim + 3I)`` elements plus the attention scores ``B · heads · T²``), and
  the logits of one chunk of ``C`` tokens: the reference's and the slim model's in the model dtype plus eight
  float32 temporaries of the cost (``C · V · (2b + 32)`` bytes). ``C`` keeps a float32 ``[C, V]`` near
  `HEAD_CHUNK_BYTES`, so the peak does not grow with the vocabulary or with ``N``.

Nothing is kept at full vocabulary size: the reference log-probs are recomputed per chunk from the cached
final hidden state (exact, the same arithmetic as before).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from dimr.errors import DimrError

HEAD_CHUNK_BYTES = 256 * 2**20  # target size of one float32 [chunk, vocab] tensor of the cost
COST_TEMPORARIES = 8  # float32 [chunk, vocab] tensors alive at once in a cost (log-softmaxes, exp, terms...)
DEVICE_HEADROOM = 0.92  # the share of a device's free memory a plan may use (allocator slack, CUDA context)
GiB = 2**30
CONFIG_DIR = Path(__file__).parent / "hub_configs"


def head_chunk(vocab: int) -> int:
    """Tokens per chunk of the cost's head: a float32 [chunk, vocab] near `HEAD_CHUNK_BYTES`."""
    return max(16, HEAD_CHUNK_BYTES // (4 * vocab))


def hub_config(repo: str):
    """The shipped config of a built-in pair's model (``google/gemma-2-9b-it``), or None if not shipped."""
    from transformers import AutoConfig

    index = json.loads((CONFIG_DIR / "index.json").read_text())
    name = index.get(repo)
    if name is None:
        return None
    data = json.loads((CONFIG_DIR / name).read_text())
    return AutoConfig.for_model(**data)


def _text(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def param_count(config) -> int:
    """Parameters of the model of ``config``, counted on a meta-device build (no memory, tied weights once)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@dataclass(frozen=True)
class Shape:
    """What the estimate reads from a config."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    params: int

    @classmethod
    def of(cls, config) -> Shape:
        c = _text(config)
        heads = c.num_attention_heads
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
        return cls(layers=c.num_hidden_layers, hidden=c.hidden_size, intermediate=c.intermediate_size, heads=heads,
                   kv_heads=getattr(c, "num_key_value_heads", None) or heads, head_dim=head_dim,
                   vocab=c.vocab_size, params=param_count(config))


@dataclass(frozen=True)
class Plan:
    """Bytes one worker needs: weights, the cache and the working set of one evaluation."""

    weights: int
    cache: int
    work: int
    cache_on_host: bool = False

    @property
    def device(self) -> int:
        """Bytes on the worker's device(s)."""
        return self.weights + self.work + (0 if self.cache_on_host else self.cache)

    @property
    def host(self) -> int:
        """Bytes on the host (the cache, when it is kept there)."""
        return self.cache if self.cache_on_host else 0

    def describe(self) -> str:
        where = "host" if self.cache_on_host else "device"
        return (f"{self.device / GiB:.1f} GiB on the device (weights {self.weights / GiB:.1f}, cache "
                f"{self.cache / GiB:.1f} on the {where}, one evaluation {self.work / GiB:.1f})")


def dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def estimate(config, num_sequences: int, seq_len: int, batch_size: int, dtype: torch.dtype,
             prefix_reuse: bool = True, draft_config=None, cache_on_host: bool = False) -> Plan:
    """The memory plan of one worker scoring ``num_sequences`` × ``seq_len`` tokens (module docstring)."""
    s = Shape.of(config)
    b = dtype_bytes(dtype)
    tokens = num_sequences * seq_len
    cache = (s.layers + 1 if prefix_reuse else 1) * tokens * s.hidden * b
    weights = s.params * b
    batch = min(batch_size, num_sequences) * seq_len
    layer = batch * (4 * s.hidden + (2 * s.heads + 2 * s.kv_heads) * s.head_dim + 3 * s.intermediate) * b
    attention = min(batch_size, num_sequences) * s.heads * seq_len * seq_len * b
    chunk = min(head_chunk(s.vocab), batch)
    head = chunk * s.vocab * (2 * b + 4 * COST_TEMPORARIES)
    # Building the cache holds one batch's layer inputs on the device before they move to the host.
    build = (s.layers + 1) * batch * s.hidden * b if cache_on_host and prefix_reuse else 0
    work = 2 * batch * s.hidden * b + max(layer + attention, head, build)
    if draft_config is not None:
        d = Shape.of(draft_config)
        weights += d.params * b
        cache += tokens * d.hidden * b
        work += chunk * d.vocab * b
    return Plan(weights=weights, cache=cache, work=work, cache_on_host=cache_on_host)


def fit(plan: Plan, device_bytes: int | None, host_bytes: int | None, gpus_per_worker: int = 1,
        on_gpu: bool = True) -> Plan:
    """``plan`` as it fits: the cache moves to the host when the device is short; DimrError (one line saying
    what to lower) when it does not fit either way. ``None``: that side is not known (nothing checked)."""
    if device_bytes is None:
        return plan
    room = int(device_bytes * DEVICE_HEADROOM)
    if plan.device <= room:
        return plan
    hosted = Plan(plan.weights, plan.cache, plan.work, cache_on_host=True)
    host_room = None if host_bytes is None else int(host_bytes * DEVICE_HEADROOM)
    if hosted.device <= room and (host_room is None or hosted.host <= host_room):
        return hosted
    what = []
    if plan.weights + plan.work > room:
        if plan.weights <= room / 2:
            what.append("lower --batch-size")
        else:
            what.append(f"use more GPUs per worker (--gpus-per-worker {gpus_per_worker * 2})" if on_gpu
                        else "run it on GPUs (--device cuda, --gpus-per-worker N)")
    elif plan.cache > room - plan.weights - plan.work:
        what.append("lower --num-sequences or --seq-len")
    host = "?" if host_bytes is None else f"{host_bytes / GiB:.1f}"
    raise DimrError(f"a scoring worker needs {plan.describe()}, but its device has {device_bytes / GiB:.1f} GiB "
                    f"free (host {host} GiB); {' and '.join(what) or 'lower --batch-size'}")


def free_device_bytes(device: str | torch.device | None, gpus_per_worker: int = 1) -> int | None:
    """Free bytes on the device(s) a worker would use: CUDA's free memory over ``gpus_per_worker`` devices
    from ``device`` on, the host's available memory for the CPU; None when it cannot be known here."""
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return None
        first = dev.index or 0
        ids = range(first, min(first + gpus_per_worker, torch.cuda.device_count()))
        return sum(torch.cuda.mem_get_info(i)[0] for i in ids)
    if dev.type == "cpu":
        return host_available_bytes()
    return None


def host_available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (Linux), else None."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def plan_device_map(config, gpus: int, gpu_bytes: int, reserve: int, dtype: torch.dtype) -> dict[str, int | str]:
    """accelerate's device map of the verifier over ``gpus`` devices of ``gpu_bytes``, keeping ``reserve`` free
    on each for the cache and the working set; built on the meta device (no memory). DimrError when a module
    would land on the CPU or disk."""
    from accelerate import infer_auto_device_map, init_empty_weights
    from accelerate.utils import get_balanced_memory
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    budget = {i: max(0, gpu_bytes - reserve) for i in range(gpus)}
    no_split = getattr(model, "_no_split_modules", None) or []
    balanced = get_balanced_memory(model, max_memory=budget, no_split_module_classes=no_split, dtype=dtype)
    device_map = infer_auto_device_map(model, max_memory={**balanced, "cpu": 0}, no_split_module_classes=no_split,
                                       dtype=dtype)
    off = sorted({str(v) for v in device_map.values() if not isinstance(v, int)})
    if off:
        raise DimrError(f"the verifier does not fit on {gpus} GPU(s) of {gpu_bytes / GiB:.0f} GiB with "
                        f"{reserve / GiB:.1f} GiB kept free on each (it would spill to {', '.join(off)}); raise "
                        "--gpus-per-worker, or lower --num-sequences / --seq-len / --batch-size")
    return device_map

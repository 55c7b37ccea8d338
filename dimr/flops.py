"""FLOPs per token of a (sublayer) mask, from the verifier's config: a cost budget as a fraction.

Counts matrix multiplies only (2 FLOPs per multiply-add); norms, activations and rotary are left out.
Per decoder layer and token, with ``h`` hidden size, ``d`` head dim, ``q``/``kv`` query/key-value heads,
``I`` the MLP's intermediate size and ``c`` the attended context (capped at the sliding window on sliding
layers):

- attention: ``2·h·d·(2q + 2kv)`` for the q/k/v/o projections, plus ``4·q·d·c`` for scores and values;
- MLP: ``2·3·h·I`` for a gated MLP (gate, up, down: Llama, Gemma, Qwen, Phi-3, OLMo...), ``2·2·h·I`` if not.

The LM head adds ``2·h·V`` per token whatever the mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dimr.masks import SublayerMask, as_sublayer_mask


@dataclass(frozen=True)
class LayerFlops:
    """FLOPs per token of one decoder layer's sublayers."""

    attention: float
    mlp: float


def _per_layer(value, n: int) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value] * n


def layer_flops(config, *, context: int = 0, gated_mlp: bool = True) -> list[LayerFlops]:
    """Per-layer attention and MLP FLOPs per token of a model with ``config``, attending ``context`` tokens."""
    n, h = config.num_hidden_layers, config.hidden_size
    q = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or q
    d = getattr(config, "head_dim", None) or h // q
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    sliding = ([t == "sliding_attention" for t in types] if types is not None else [window is not None] * n)
    inter = _per_layer(config.intermediate_size, n)
    out = []
    for i in range(n):
        ctx = min(context, window) if sliding[i] and window else context
        attention = 2 * h * d * (2 * q + 2 * kv) + 4 * q * d * ctx
        out.append(LayerFlops(float(attention), float(2 * (3 if gated_mlp else 2) * h * inter[i])))
    return out


def mask_flops(config, mask: Sequence[bool] | SublayerMask, *, context: int = 0, gated_mlp: bool = True,
               head: bool = True) -> float:
    """FLOPs per token of the slim verifier ``mask`` (a layer or sublayer mask), LM head included if ``head``."""
    sub = as_sublayer_mask(mask if isinstance(mask, SublayerMask) else tuple(mask))
    layers = layer_flops(config, context=context, gated_mlp=gated_mlp)
    if len(sub) != len(layers):
        raise ValueError(f"mask has {len(sub)} layers, the config {len(layers)}")
    total = sum(f.attention * a + f.mlp * m for f, a, m in zip(layers, sub.attn, sub.mlp, strict=True))
    return total + (2.0 * config.hidden_size * config.vocab_size if head else 0.0)


def cost_fraction(config, mask: Sequence[bool] | SublayerMask, *, context: int = 0, gated_mlp: bool = True,
                  head: bool = True) -> float:
    """FLOPs of ``mask`` as a fraction of the full model's (1.0 keeps everything)."""
    full = (True,) * config.num_hidden_layers
    kw = dict(context=context, gated_mlp=gated_mlp, head=head)
    return mask_flops(config, mask, **kw) / mask_flops(config, full, **kw)

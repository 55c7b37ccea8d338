"""FLOPs of (sublayer) masks from the config, against a hand count and the modules' own weight counts."""

import pytest
import torch
from transformers import Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

from dimr.flops import cost_fraction, layer_flops, mask_flops
from dimr.masks import SublayerMask, mask_from_key

COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0)
# per token, h=64, 4 query and 2 kv heads of 16, I=128:
ATTN_PROJ = 2 * 64 * 16 * (4 + 2 + 2 + 4)  # q, k, v, o = 24576
MLP = 2 * 3 * 64 * 128  # gate, up, down = 49152
HEAD = 2 * 64 * 128


def test_llama_by_hand_and_against_weight_counts():
    config = LlamaConfig(**COMMON)
    flops = layer_flops(config, context=10)
    assert [(f.attention, f.mlp) for f in flops] == [(ATTN_PROJ + 4 * 4 * 16 * 10, MLP)] * 6
    torch.manual_seed(0)
    layer = LlamaForCausalLM(config).model.layers[0]
    weights = {name: sum(m.weight.numel() for m in getattr(layer, name).modules()
                         if isinstance(m, torch.nn.Linear)) for name in ("self_attn", "mlp")}
    assert layer_flops(config)[0].attention == 2 * weights["self_attn"]
    assert layer_flops(config)[0].mlp == 2 * weights["mlp"]
    assert layer_flops(config)[0].mlp * 2 / 3 == layer_flops(config, gated_mlp=False)[0].mlp


def test_mask_flops_and_cost_fraction():
    config = LlamaConfig(**COMMON)
    full = 6 * (ATTN_PROJ + MLP) + HEAD
    assert mask_flops(config, (True,) * 6) == full
    assert mask_flops(config, mask_from_key("011011")) == 4 * (ATTN_PROJ + MLP) + HEAD
    sub = SublayerMask.from_key("1am01m")  # 3 attentions, 4 MLPs
    assert mask_flops(config, sub) == 3 * ATTN_PROJ + 4 * MLP + HEAD
    assert mask_flops(config, sub, head=False) == 3 * ATTN_PROJ + 4 * MLP
    assert cost_fraction(config, sub) == pytest.approx((3 * ATTN_PROJ + 4 * MLP + HEAD) / full)
    assert cost_fraction(config, SublayerMask.from_key("111111")) == 1.0
    with pytest.raises(ValueError):
        mask_flops(config, (True,) * 5)


def test_sliding_layers_cap_the_context():
    config = Gemma3TextConfig(**COMMON, head_dim=16, sliding_window=4)  # layers 0-4 sliding, 5 global
    flops = layer_flops(config, context=100)
    assert [f.attention for f in flops] == [ATTN_PROJ + 4 * 4 * 16 * 4] * 5 + [ATTN_PROJ + 4 * 4 * 16 * 100]

"""A deeper real verifier for search budgets too large to enumerate: ``mini`` split into its sublayers.

    python benchmarks/deepen.py            # writes runs/mini-x2/{verifier,pairs.toml}; checks it equals mini

``mini``'s verifier has 12 layers, so every budget of it can be enumerated (C(12, 6) = 924 masks). A Llama
layer is ``h += attn(norm(h)); h += mlp(norm(h))``, so each layer can be written as two layers, one whose MLP
write-out (``down_proj``) is zero and one whose attention write-out (``o_proj``) is zero: a 24-layer Llama
computing exactly ``mini``'s function (checked: same logits), in which skipping a layer skips one attention
or one MLP sublayer, the granularity SWIFT searches. No training, no randomness. The pair keeps ``mini``'s
draft and calibration; ``benchmarks/search_quality.py --pair mini-x2 --pairs-file runs/mini-x2/pairs.toml``
searches it (C(24, 6) = 134,596 masks, C(24, 8) = 735,471).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def split_layers(model):
    """A Llama with twice the layers: layer ``i`` becomes ``2i`` (its attention only) and ``2i + 1`` (its MLP
    only); the silenced half of each new layer has its residual write-out zeroed."""
    from transformers import LlamaForCausalLM

    from dimr.zoo.train_mini import _renumber  # the layer renumbering train-mini's grow and take_layers use

    config = model.config.__class__.from_dict(model.config.to_dict())
    config.num_hidden_layers = 2 * model.config.num_hidden_layers
    if getattr(config, "layer_types", None):
        config.layer_types = [t for t in model.config.layer_types for _ in range(2)]
    deep = LlamaForCausalLM(config)
    state = deep.state_dict()
    n = model.config.num_hidden_layers
    attn_at, mlp_at = tuple(range(0, 2 * n, 2)), tuple(range(1, 2 * n, 2))
    for key, value in model.state_dict().items():
        state[_renumber(key, attn_at)] = value.clone() * (0.0 if key.endswith("mlp.down_proj.weight") else 1.0)
        if ".layers." in key:
            state[_renumber(key, mlp_at)] = value.clone() * (0.0 if key.endswith("self_attn.o_proj.weight") else 1.0)
    deep.load_state_dict(state)
    return deep.eval()


@torch.no_grad()
def code_nll(model, input_ids: torch.Tensor) -> float:
    logits = model(input_ids=input_ids).logits[:, :-1].float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), input_ids[:, 1:].reshape(-1)).item()


def main(argv: list[str] | None = None) -> Path:
    from transformers import AutoModelForCausalLM

    from dimr.calibration import load_calibration
    from dimr.pairs import get_pair, load_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "mini-x2")
    args = ap.parse_args(argv)
    pair = get_pair("mini")
    mini = AutoModelForCausalLM.from_pretrained(pair.verifier, dtype=torch.float32).eval()
    deep = split_layers(mini)
    deep.save_pretrained(args.out / "verifier")
    load_tokenizer(pair).save_pretrained(args.out / "verifier")
    (args.out / "pairs.toml").write_text(
        f'[pairs.mini-x2]\ndraft = "{pair.draft}"\nverifier = "verifier"\ndtype = "float32"\n'
        f'calibration = "{pair.calibration}"\n'
        f'description = "mini with every verifier layer split into an attention layer and an MLP layer (24)"\n')
    ids = load_calibration(pair.calibration, load_tokenizer(pair), 32, 128).input_ids
    with torch.no_grad():
        gap = (mini(input_ids=ids).logits - deep(input_ids=ids).logits).abs().max().item()
    print(f"held-out code NLL (32 x 128 tokens): mini {code_nll(mini, ids):.4f}, mini-x2 {code_nll(deep, ids):.4f}; "
          f"max |logit difference| {gap:.2e}")
    print(f"wrote {args.out}")
    return args.out


if __name__ == "__main__":
    main()

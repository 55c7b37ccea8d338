"""What one scoring worker keeps, checked against the exact full-vocabulary reference, the estimate made from the
config alone, and measured peak RSS; the refusal of a run that cannot fit, before any weight loads."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_runner import cli
from transformers import Gemma2Config, Gemma2ForCausalLM

from dimr import cost as costs
from dimr import memory
from dimr.errors import DimrError
from dimr.pairs import Pair
from dimr.slim import forward_from, layer_inputs
from workers import EvalSpec
from workers.local import MaskScorer

ROOT = Path(__file__).resolve().parents[1]
MASKS = [(True,) * 5 + (False,), (False, True, True, False, True, True), (True, False) * 3]


@pytest.fixture(scope="module")
def gemma_pair(tmp_path_factory) -> Pair:
    """A tiny Gemma2 (final logit softcapping, sliding window) with Gemma-2's real vocabulary, 256000."""
    torch.manual_seed(0)
    cfg = Gemma2Config(vocab_size=256000, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=8,
                       layer_types=["sliding_attention", "full_attention"] * 3, final_logit_softcapping=30.0,
                       attn_implementation="eager")
    path = tmp_path_factory.mktemp("gemma") / "m"
    Gemma2ForCausalLM(cfg).save_pretrained(path)
    return Pair("tiny-gemma", str(path), str(path), dtype="float32", local=True)


def exact(model, ids: torch.Tensor, mask, cost: str, draft=None) -> float:
    """The former scorer: full-vocabulary float32 log-probs of the reference, kept for the whole batch."""
    hidden = layer_inputs(model, ids)
    full = torch.log_softmax(forward_from(model, (True,) * len(mask), hidden).float(), -1)
    slim = torch.log_softmax(forward_from(model, mask, hidden).float(), -1)
    d = torch.log_softmax(draft(ids).logits.float(), -1) if draft is not None else None
    return costs.evaluate_logits(full, slim, cost, draft_logp=d)["cost"]


@pytest.mark.parametrize("cost,reuse", [("kl", True), ("js", False), ("bridge", True)])
def test_chunked_reference_equals_exact_cost(gemma_pair, cost, reuse, monkeypatch):
    """Heads run a few tokens at a time from the cached final hidden state: the same cost as the exact one."""
    monkeypatch.setattr(memory, "HEAD_CHUNK_BYTES", 256000 * 4 * 16)  # 16-token chunks: several per batch
    ids = torch.randint(0, 256000, (3, 24), generator=torch.Generator().manual_seed(1))
    scorer = MaskScorer(EvalSpec(pair=gemma_pair, input_ids=ids, cost=cost, device="cpu", batch_size=2,
                                 prefix_reuse=reuse))
    assert scorer.chunk == 16
    for mask in MASKS:
        got = scorer.score(mask)
        want = sum(exact(scorer.verifier, b, mask, cost, scorer.draft) * b.numel() for b in ids.split(2)) / ids.numel()
        assert got.cost == pytest.approx(want, rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("reuse", [True, False])
def test_cache_is_what_the_estimate_says(gemma_pair, reuse):
    ids = torch.randint(0, 256000, (5, 16), generator=torch.Generator().manual_seed(2))
    spec = EvalSpec(pair=gemma_pair, input_ids=ids, device="cpu", batch_size=2, prefix_reuse=reuse)
    scorer = MaskScorer(spec)
    plan = memory.estimate(scorer.verifier.config, 5, 16, 2, torch.float32, prefix_reuse=reuse)
    assert scorer.cache_bytes() == plan.cache
    assert plan.weights == sum(p.numel() * 4 for p in scorer.verifier.parameters())
    # nothing of vocabulary size is kept: the former scorer held 5 * 16 * 256000 * 4 bytes of reference
    assert scorer.cache_bytes() < 5 * 16 * 256000 * 4 / 100


def test_batch_size_bounds_the_working_set():
    config = memory.hub_config("google/gemma-2-9b-it")
    small, big = (memory.estimate(config, 128, 512, b, torch.bfloat16) for b in (1, 8))
    assert small.cache == big.cache and small.work < big.work
    assert big.work < 8 * memory.GiB  # no full-vocabulary tensor at 128 x 512


def test_peak_rss_is_within_the_estimate(tmp_path):
    """benchmarks/memory_check.py measures the scorer's peak RSS growth in a fresh process (vocab 256000)."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/memory_check.py"), "--json", "--num-sequences",
                          "16", "--seq-len", "64", "--batch-size", "4"], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["measured"] <= r["estimate"] + 48 * 2**20  # the allocator's slack on top of the formula
    assert r["measured"] < r["former_reference"]  # the former full-vocabulary reference alone was bigger


def test_fit_moves_the_cache_to_the_host_or_refuses():
    config = memory.hub_config("google/gemma-2-9b-it")
    plan = memory.estimate(config, 128, 512, 4, torch.bfloat16)
    assert not memory.fit(plan, 80 * memory.GiB, None).cache_on_host
    hosted = memory.fit(plan, 24 * memory.GiB, 64 * memory.GiB)
    assert hosted.cache_on_host and hosted.host == plan.cache and hosted.device == plan.weights + plan.work
    with pytest.raises(DimrError, match="lower --num-sequences or --seq-len"):
        memory.fit(plan, 24 * memory.GiB, 8 * memory.GiB)
    big = memory.estimate(memory.hub_config("meta-llama/Llama-2-70b-chat-hf"), 16, 128, 4, torch.bfloat16)
    with pytest.raises(DimrError, match=r"--gpus-per-worker 2"):
        memory.fit(big, 80 * memory.GiB, 1000 * memory.GiB)


def test_device_map_plans_on_meta_models():
    """accelerate's device-map inference on the meta device: a 70B verifier needs two 80 GiB GPUs."""
    config = memory.hub_config("meta-llama/Llama-2-70b-chat-hf")
    device_map = memory.plan_device_map(config, 2, 80 * memory.GiB, 4 * memory.GiB, torch.bfloat16)
    assert set(device_map.values()) == {0, 1}
    with pytest.raises(DimrError, match="does not fit on 1 GPU"):
        memory.plan_device_map(config, 1, 80 * memory.GiB, 4 * memory.GiB, torch.bfloat16)


def test_search_refuses_before_loading_weights(tmp_path, capsys, tiny_pair):
    """A pair whose verifier folder holds Llama-2-70b's config and no weights at all: refused from the config."""
    from dimr.pairs import prepare

    prepare(tiny_pair)
    big = tmp_path / "big"
    big.mkdir()
    (big / "config.json").write_text((memory.CONFIG_DIR / "llama-2-70b.json").read_text())
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tiny_pair.verifier) / f, big / f)
    pairs = tmp_path / "pairs.toml"
    pairs.write_text(f'[pairs.big]\ndraft = "{big}"\nverifier = "{big}"\ndtype = "bfloat16"\n'
                     f'calibration = "{tiny_pair.calibration}"\n')
    code, out, err = cli(capsys, "search", "--pair", "big", "--pairs-file", str(pairs), "--device", "cpu",
                         "--num-sequences", "2", "--seq-len", "16", "--storage", f"sqlite:///{tmp_path / 'd.db'}")
    assert code == 2, out + err
    line = err.strip().splitlines()[-1]  # after tiny-random's first build, if this test builds it
    assert line.startswith("error: a scoring worker needs")
    assert line.endswith("run it on GPUs (--device cuda, --gpus-per-worker N)") and "Traceback" not in err
    assert not (tmp_path / "d.db").exists()

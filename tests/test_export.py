"""Slim config: JSON round trip, fingerprint checks, atomic save, bad files."""

import json
import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from dimr.errors import DimrError
from dimr.masks import mask_from_key
from dimr.slim_config import SCHEMA, apply_slim_config, fingerprint, load_slim_config, make_slim_config

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2)


def _llama(**kw):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**{**SMALL, **kw})).eval()


def _cfg(model, key="1011"):
    return make_slim_config(model, mask_from_key(key), pair="p", verifier_id="/m/verifier", cost="kl",
                            metrics={"cost": 0.25, "top1_agreement": 0.5, "expected_acceptance": 0.75},
                            calibration="calib.txt", calibration_hash="ab" * 32, study="s", trial=3)


def test_round_trip_and_apply(tmp_path):
    model = _llama()
    cfg = _cfg(model)
    path = cfg.save(tmp_path / "slim.json")
    raw = json.loads(path.read_text())
    assert raw["schema"] == SCHEMA and list(raw)[0] == "schema"
    assert raw["mask"] == "1011" and raw["kept_layers"] == [0, 2, 3] and raw["num_layers"] == 4
    assert raw["fingerprint"] == fingerprint(model) and raw["trial"] == 3
    assert raw["created_at"].endswith("+00:00") and raw["metrics"]["expected_acceptance"] == 0.75
    back = load_slim_config(path)
    assert back == cfg
    slim = apply_slim_config(back, model)
    ids = torch.arange(6).unsqueeze(0)
    assert slim.config.num_hidden_layers == 3
    assert slim.lm_head.weight.data_ptr() == model.lm_head.weight.data_ptr()
    torch.testing.assert_close(apply_slim_config(path, model)(ids).logits, slim(ids).logits)


def test_non_finite_metrics_stay_strict_json(tmp_path):
    cfg = _cfg(_llama())
    cfg.metrics["cost"] = float("inf")
    path = cfg.save(tmp_path / "slim.json")
    assert "Infinity" not in path.read_text()
    assert load_slim_config(path).metrics["cost"] == float("inf")


def test_fingerprint_is_about_the_architecture():
    a = _llama()
    assert fingerprint(a) == fingerprint(_llama())  # same architecture, other instance
    with torch.device("meta"):
        meta = LlamaForCausalLM(LlamaConfig(**SMALL))
    assert fingerprint(meta) == fingerprint(a.to(torch.bfloat16))  # device and dtype do not count
    assert fingerprint(_llama(num_hidden_layers=5)) != fingerprint(a)
    assert fingerprint(_llama(intermediate_size=96)) != fingerprint(a)
    torch.manual_seed(0)
    assert fingerprint(Qwen2ForCausalLM(Qwen2Config(**SMALL))) != fingerprint(a)


def test_fingerprint_mismatch_refused():
    cfg = _cfg(_llama())
    with pytest.raises(DimrError, match="made for verifier .* but got .*; export a config for this model"):
        apply_slim_config(cfg, _llama(num_hidden_layers=5))
    torch.manual_seed(0)
    with pytest.raises(DimrError, match="was made for verifier"):
        apply_slim_config(cfg, Qwen2ForCausalLM(Qwen2Config(**SMALL)))


def test_atomic_save_leaves_no_partial_file(tmp_path, monkeypatch):
    cfg = _cfg(_llama())
    path = tmp_path / "slim.json"
    path.write_text("previous")

    def boom(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(DimrError, match="cannot write .*disk full"):
        cfg.save(path)
    assert path.read_text() == "previous" and os.listdir(tmp_path) == ["slim.json"]
    monkeypatch.undo()
    cfg.metrics["cost"] = object()  # not serialisable: fails before anything touches the disk
    with pytest.raises(TypeError):
        cfg.save(tmp_path / "other.json")
    assert os.listdir(tmp_path) == ["slim.json"]


def test_bad_files(tmp_path):
    with pytest.raises(DimrError, match="does not exist"):
        load_slim_config(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(DimrError, match="not valid JSON"):
        load_slim_config(bad)
    good = json.loads(_cfg(_llama()).to_json())
    for schema in ("dimr.slim-config/2", None):
        bad.write_text(json.dumps({**good, "schema": schema}))
        with pytest.raises(DimrError, match="schema"):
            load_slim_config(bad)
    bad.write_text(json.dumps([1, 2]))
    with pytest.raises(DimrError, match="schema"):
        load_slim_config(bad)
    bad.write_text(json.dumps({k: v for k, v in good.items() if k != "fingerprint"}))
    with pytest.raises(DimrError, match="lacks fingerprint"):
        load_slim_config(bad)
    for broken in ({"metrics": [1]}, {"mask": "10x1"}, {"metrics": {"cost": "high"}}):
        bad.write_text(json.dumps({**good, **broken}))
        with pytest.raises(DimrError, match="malformed"):
            load_slim_config(bad)
    bad.write_text(json.dumps({**good, "kept_layers": [0, 1]}))
    with pytest.raises(DimrError, match="kept_layers .* do not match"):
        load_slim_config(bad)


def test_saved_mode_follows_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        path = _cfg(_llama()).save(tmp_path / "slim.json")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644

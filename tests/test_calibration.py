"""Calibration specs → packed token ids, and their errors."""

from __future__ import annotations

import json

import pytest
import torch

from dimr.calibration import load_calibration
from dimr.errors import DimrError
from dimr.pairs import load_tokenizer


@pytest.fixture(scope="module")
def tok(tiny_pair):
    return load_tokenizer(tiny_pair)


def test_txt_is_one_packed_stream(tmp_path, tok):
    text = "def f(x):\n    return x + 1\n" * 20
    f = tmp_path / "c.txt"
    f.write_text(text)
    cal = load_calibration(str(f), tok, num_sequences=3, seq_len=16)
    assert cal.input_ids.shape == (3, 16)
    expected = tok(text, add_special_tokens=False).input_ids[:48]
    assert cal.input_ids.flatten().tolist() == expected


def test_jsonl_records_joined_with_eos_and_field_choice(tmp_path, tok):
    f = tmp_path / "c.jsonl"
    f.write_text("\n".join(json.dumps({"text": f"record {i} " * 3, "q": f"question {i}"}) for i in range(20)))
    cal = load_calibration(str(f), tok, num_sequences=2, seq_len=20)
    flat = cal.input_ids.flatten().tolist()
    first = tok("record 0 " * 3, add_special_tokens=False).input_ids
    assert flat[: len(first)] == first and flat[len(first)] == tok.eos_token_id
    by_q = load_calibration(f"{f}#q", tok, num_sequences=2, seq_len=20)
    assert tok.decode(by_q.input_ids[0]).startswith("question 0")
    assert by_q.hash != cal.hash


def test_hash_is_stable_and_token_sensitive(tmp_path, tok):
    f = tmp_path / "c.txt"
    f.write_text("abc def ghi " * 40)
    a = load_calibration(str(f), tok, 2, 16)
    b = load_calibration(str(f), tok, 2, 16)
    assert a.hash == b.hash
    assert torch.equal(a.input_ids, b.input_ids)
    assert load_calibration(str(f), tok, 2, 17).hash != a.hash


def test_mix_shares_rows(tmp_path, tok):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("aaaa " * 100)
    b.write_text("bbbb " * 100)
    cal = load_calibration(f"{a},{b}", tok, num_sequences=3, seq_len=8)
    rows = [tok.decode(r) for r in cal.input_ids]
    assert "a" in rows[0] and "a" in rows[1] and "b" in rows[2] and "a" not in rows[2]


@pytest.mark.parametrize("content,needle", [
    (None, "does not exist"), ("", "empty"), ("   \n", "empty"), ("short", "--seq-len"),
])
def test_bad_files(tmp_path, tok, content, needle):
    f = tmp_path / "c.txt"
    if content is not None:
        f.write_text(content)
    with pytest.raises(DimrError, match=needle):
        load_calibration(str(f), tok, 2, 64)


def test_bad_jsonl(tmp_path, tok):
    f = tmp_path / "c.jsonl"
    f.write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(DimrError, match="line 2 is not JSON"):
        load_calibration(str(f), tok, 1, 4)
    f.write_text('{"body": "ok"}\n')
    with pytest.raises(DimrError, match="no string field 'text'"):
        load_calibration(str(f), tok, 1, 4)


def test_unreachable_dataset_is_a_user_error(tok):
    with pytest.raises(DimrError, match="cannot load dataset"):
        load_calibration("surely_not_a_dataset_xyz:main:test:text", tok, 1, 4)
    with pytest.raises(DimrError, match="neither a local file"):
        load_calibration("just-a-name", tok, 1, 4)

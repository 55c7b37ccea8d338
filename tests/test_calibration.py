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


def _hub_standin(root, spec: str, records: int) -> str:
    """Local folders laid out as the hub sets of ``spec`` (same configs, splits and fields), read by `datasets`'
    own loader: ``spec`` with each hub id replaced by its local folder."""
    import datasets

    out = []
    for source in spec.split(","):
        name, config, split, field = source.split(":")
        folder = root / name
        files = []
        for s in split.split("+"):
            rel = f"{config}/{s}-00000.parquet"
            (folder / config).mkdir(parents=True, exist_ok=True)
            rows = {f: [f"{s} {f} {i}: " + "lorem ipsum " * 3 for i in range(records)] for f in field.split("+")}
            datasets.Dataset.from_dict(rows).to_parquet(str(folder / rel))
            files.append(f"  - split: {s}\n    path: {rel}")
        (folder / "README.md").write_text(f"---\nconfigs:\n- config_name: \"{config}\"\n  data_files:\n"
                                          + "\n".join(files) + "\n---\n")
        out.append(f"{folder}:{config}:{split}:{field}")
    return ",".join(out)


def test_hub_mix_is_namespaced_and_loads_through_datasets(tmp_path, monkeypatch):
    """The default mix names namespaced sets; the same configs/splits/fields load from local stand-ins."""
    import datasets

    from dimr.pairs import HUB_CALIBRATION, get_pair

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    names = [s.split(":")[0] for s in HUB_CALIBRATION.split(",")]
    assert names == ["abisee/cnn_dailymail", "openai/gsm8k", "google-research-datasets/mbpp"]
    tok = load_tokenizer(get_pair("mini"))
    cal = load_calibration(_hub_standin(tmp_path, HUB_CALIBRATION, 30), tok, 6, 48)
    rows = [tok.decode(r[1:]) for r in cal.input_ids]
    assert rows[0].startswith("validation article 0") and rows[2].startswith("test question 0")
    code = " ".join(rows[4:])
    assert "train text 0" in code and "train code 0" in code  # task + solution, splits joined


def test_rows_start_as_the_decoder_starts_a_prompt(tmp_path, tok):
    """Every packed row begins with the tokens the decoder's tokenizer puts before a prompt (BOS for mini)."""
    from dimr.decoding.decoder import Decoder
    from dimr.pairs import get_pair

    f = tmp_path / "c.txt"
    f.write_text("abc def ghi " * 60)
    mini_tok = load_tokenizer(get_pair("mini"))
    start = Decoder(None, None, tokenizer=mini_tok).tokenizer("x").input_ids[0]
    assert start == mini_tok.bos_token_id
    cal = load_calibration(str(f), mini_tok, 3, 16)
    assert cal.input_ids.shape == (3, 16) and cal.input_ids[:, 0].tolist() == [start] * 3
    assert (cal.input_ids[:, 1:] != start).all()
    plain = load_calibration(str(f), tok, 3, 16)  # tiny-random's tokenizer adds nothing: rows are all text
    assert plain.input_ids.flatten().tolist() == tok("abc def ghi " * 60, add_special_tokens=False).input_ids[:48]


def test_dataset_error_is_whole(tmp_path, tok):
    name = str(tmp_path / ("not-there-" + "x" * 200))
    with pytest.raises(DimrError) as e:
        load_calibration(f"{name}:main:test:text", tok, 1, 4)
    msg = str(e.value)
    assert f"Couldn't find any data file at {name}." in msg  # datasets' own words, whole
    assert "\n" not in msg and msg.endswith("pass a local .txt/.jsonl file to --calibration")

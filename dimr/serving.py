"""Standalone checkpoints of a slim verifier, for serving stacks that load Hugging Face models.

`export_hf` writes the slim verifier of a slim config as an ordinary checkpoint: only the kept layers, renumbered
``0..k-1``, with a config whose ``num_hidden_layers`` (and ``layer_types``) are the slim model's, the verifier's
tokenizer and generation config, and the slim config itself (``dimr_slim.json``; also ``dimr_slim`` in
``config.json``). Plain ``AutoModelForCausalLM.from_pretrained(dir)`` loads it, with no dimr code, and gives the
slim verifier's logits. It is a copy of the kept weights: in a serving stack it is a separate draft model, not
a view of the verifier's memory (see docs/deploy.md).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from dimr.errors import DimrError
from dimr.slim_config import SlimConfig

SLIM_FILE = "dimr_slim.json"


def check_output_dir(output: str | Path) -> Path:
    """``output`` as a directory to create: refused if it exists with files in it, or its parent is missing."""
    output = Path(output)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise DimrError(f"cannot export to {output}: it exists and is not an empty directory; "
                        "pick a new directory or remove it")
    if not output.parent.resolve().is_dir():
        raise DimrError(f"cannot export to {output}: directory {output.parent} does not exist; create it")
    return output


def export_hf(cfg: SlimConfig, output: str | Path, *, pairs_file: Path | None = None, device: str = "cpu",
              on_step: Callable[[str], None] | None = None) -> Path:
    """Write the slim verifier of ``cfg`` to the new directory ``output`` as a standalone HF checkpoint.

    The verifier is loaded (its fingerprint checked against ``cfg``), the slim model saved with safetensors,
    then the tokenizer; everything is written to a temporary directory beside ``output`` and renamed into
    place, so a failure leaves nothing behind. ``on_step`` hears what is being done (for progress)."""
    from dimr.pairs import get_pair, load_model, load_tokenizer
    from dimr.slim_config import apply_slim_config

    if cfg.is_sublayer:
        raise DimrError(f"--format hf writes whole-layer slims only, and mask {cfg.mask} runs some layer's attention "
                        "or MLP alone, which a plain transformers checkpoint cannot express; export --format slim "
                        "and decode with `dimr decode --slim`")
    output = check_output_dir(output)
    step = on_step or (lambda _msg: None)
    pair = get_pair(cfg.pair, pairs_file)
    step(f"loading verifier {pair.verifier}")
    verifier = load_model(pair, "verifier", device)
    slim = apply_slim_config(cfg, verifier)
    slim.config.dimr_slim = cfg.to_dict()  # the slim model's own config copy: the verifier's is untouched
    tmp = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.", suffix=".tmp"))
    try:
        step(f"writing {len(cfg.kept_layers)} of {cfg.num_layers} layers")
        slim.save_pretrained(tmp, safe_serialization=True)
        step("writing tokenizer")
        load_tokenizer(pair).save_pretrained(tmp)
        (tmp / SLIM_FILE).write_text(cfg.to_json())
        if output.exists():
            output.rmdir()  # empty (checked above)
        os.replace(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return output

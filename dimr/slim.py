"""The slim verifier: the verifier run with only the layers a mask keeps.

A *layer mask* has one bool per verifier decoder layer (True = the layer runs). A *slim verifier* is the
verifier run with only its kept layers. It is a second model object that shares every tensor with the full
model (embeddings, kept layers, final norm, LM head): only the module containers, the config and the
attention modules' ``layer_idx`` are copied, never a parameter.

Why the copies: on transformers 5.x the KV cache is indexed by ``layer_idx`` and sized from
``config.num_hidden_layers`` / ``config.layer_types``, and ``cache.get_seq_length()`` reads slot 0. Merely
cutting layers out of ``model.model.layers`` leaves holes in the cache (and wrong positions when layer 0 is
skipped) and misaligns Gemma2's alternating sliding/global masks. So the slim model gets a config with
``num_hidden_layers = len(kept)`` and ``layer_types = [orig[i] for i in kept]``, and kept layer ``i`` becomes
slot ``j`` of its own cache; each attention keeps its own ``sliding_window``.

Prefix reuse: layers before the first skipped layer compute
exactly what the full model computes, so :func:`layer_inputs` records the hidden state entering every layer
once per calibration batch and :func:`forward_from` starts a mask's forward at its first skipped layer.
"""

from __future__ import annotations

import copy
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from dimr.errors import DimrError
from dimr.masks import Mask, first_skipped, kept_layers, mask_key

# Families whose decoder is `model.model.layers` and whose layers only use `layer_idx` to address the cache.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2")


# --- models --------------------------------------------------------------------------------------------

def check_family(config, what: str = "", layout_ok: bool = True) -> None:
    """DimrError unless routing supports the model type of ``config`` (a model's config; no weights needed)
    and, for a loaded model, its layout (``layout_ok``: the decoder layers are ``model.model.layers``)."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES or not layout_ok:
        raise DimrError(
            f"layer routing does not support model type {model_type!r}{what}; "
            f"use a verifier of a supported family: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )


def _inner(model: nn.Module) -> nn.Module:
    inner = getattr(model, "model", None)
    check_family(getattr(model, "config", None), f" ({type(model).__name__})",
                 layout_ok=isinstance(getattr(inner, "layers", None), nn.ModuleList))
    if getattr(model.config, "is_heterogeneous", False):
        raise DimrError(f"{type(model).__name__} has per-layer (heterogeneous) configs, which routing "
                        "does not support; use a homogeneous verifier")
    return inner


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a causal LM (``model.model.layers``); DimrError for unsupported families."""
    return _inner(model).layers


def num_layers(model: nn.Module) -> int:
    """Number of decoder layers of ``model`` (a full or a slim verifier)."""
    return len(decoder_layers(model))


def _shallow(module: nn.Module) -> nn.Module:
    """A copy of ``module`` that shares its parameters, buffers and children but owns its containers.

    The module's dicts/sets (``_modules``, ``_parameters``, hook registries...) are copied so that replacing
    a child or registering a hook on the copy never touches the original.
    """
    new = copy.copy(module)
    for name, value in module.__dict__.items():
        if isinstance(value, (dict, set)):
            new.__dict__[name] = copy.copy(value)
    return new


def _check_mask(model: nn.Module, mask: Sequence[bool]) -> Mask:
    n = num_layers(model)
    mask = tuple(bool(m) for m in mask)
    if len(mask) != n:
        raise DimrError(f"layer mask has {len(mask)} entries but the verifier has {n} layers; "
                        "use a mask made for this verifier")
    return mask


def _build_slim(model: nn.Module, mask: Mask) -> nn.Module:
    """The slim model for a validated ``mask`` (may keep no layer: used by :func:`forward_from`)."""
    inner = _inner(model)
    kept = kept_layers(mask)
    cfg = copy.deepcopy(model.config)
    cfg.num_hidden_layers = len(kept)
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = [model.config.layer_types[i] for i in kept]
    cfg.dimr_mask = mask_key(mask) if not getattr(model.config, "dimr_mask", None) else _compose(
        model.config.dimr_mask, mask)

    layers = []
    for j, i in enumerate(kept):
        layer = _shallow(inner.layers[i])
        attn = _shallow(layer.self_attn)
        # Slot j in the slim model's cache; sliding_window/is_sliding stay those of original layer i.
        attn.layer_idx = j
        for mod in (layer, attn):
            if hasattr(mod, "layer_idx"):
                mod.layer_idx = j
            if hasattr(mod, "config"):
                mod.config = cfg
        layer.self_attn = attn
        layers.append(layer)

    slim_inner = _shallow(inner)
    slim_inner.config = cfg
    slim_inner.layers = nn.ModuleList(layers)
    slim = _shallow(model)
    slim.config = cfg
    slim.model = slim_inner
    if getattr(model, "generation_config", None) is not None:
        slim.generation_config = copy.deepcopy(model.generation_config)
    return slim


def _compose(outer_key: str, inner_mask: Mask) -> str:
    """Mask key, relative to the original model, of ``inner_mask`` applied to a slim model ``outer_key``."""
    it = iter(inner_mask)
    return "".join(("1" if next(it) else "0") if c == "1" else "0" for c in outer_key)


def slim_verifier(model: nn.Module, mask: Sequence[bool]) -> nn.Module:
    """``model`` run with only the layers kept by ``mask``; shares every weight with ``model``.

    The result is a model of the same class: ``forward``, KV caches (``DynamicCache``) and ``generate()``
    work as usual, and ``model`` itself stays unchanged and usable. ``slim.config.dimr_mask`` holds the
    mask key relative to the original model. Build caches from ``slim.config`` (one slot per kept layer).

    Move or cast the full model (``.to()``, ``.half()``) *before* making slim verifiers, never the slim one:
    the parameters are the same objects, so casting the slim model would cast only the kept layers.
    """
    mask = _check_mask(model, mask)
    if not any(mask):
        raise DimrError("layer mask keeps no layer; keep at least one")
    return _build_slim(model, mask)


# --- prefix reuse --------------------------------------------------------------------------------------

@torch.no_grad()
def layer_inputs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    position_ids: Tensor | None = None,
) -> list[Tensor]:
    """Hidden states entering each decoder layer, from one full forward (no cache).

    Returns ``L + 1`` tensors ``[batch, seq, hidden]``: index ``i < L`` is the input of layer ``i`` (index 0
    the scaled embeddings), index ``L`` the last layer's output before the final norm. Memory is
    ``(L + 1) * batch * seq * hidden`` elements of the model dtype.
    """
    layers = decoder_layers(model)
    n = len(layers)
    captured: list[Tensor | None] = [None] * (n + 1)

    def grab(i: int):
        def hook(_mod, args, kwargs):
            captured[i] = args[0] if args else kwargs["hidden_states"]
        return hook

    targets = [*layers, _inner(model).norm]
    handles = [m.register_forward_pre_hook(grab(i), with_kwargs=True) for i, m in enumerate(targets)]
    try:
        _inner(model)(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                      use_cache=False)
    finally:
        for h in handles:
            h.remove()
    assert all(t is not None for t in captured), "a decoder layer did not run"
    return captured  # type: ignore[return-value]


# Tail models per (model, mask) so that a worker evaluating one mask on many batches builds it once.
_TAILS: weakref.WeakKeyDictionary[nn.Module, OrderedDict[str, nn.Module]] = weakref.WeakKeyDictionary()
_TAILS_MAX = 64
_TAILS_LOCK = threading.Lock()


def _tail_model(model: nn.Module, tail: Mask) -> nn.Module:
    key = mask_key(tail)
    with _TAILS_LOCK:
        cache = _TAILS.setdefault(model, OrderedDict())
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
    runner = _build_slim(model, tail)
    with _TAILS_LOCK:
        cache[key] = runner
        if len(cache) > _TAILS_MAX:
            cache.popitem(last=False)
    return runner


@torch.no_grad()
def forward_from(
    model: nn.Module,
    mask: Sequence[bool],
    hidden_in: Sequence[Tensor],
    *,
    start: int | None = None,
    attention_mask: Tensor | None = None,
    position_ids: Tensor | None = None,
) -> Tensor:
    """Logits of the slim verifier ``mask`` computed from the full model's cached layer inputs.

    ``hidden_in`` is :func:`layer_inputs` of ``model`` on the same batch (pass the same ``attention_mask``
    / ``position_ids``). The forward starts at layer ``start`` (default: the first skipped layer, where the
    slim and full models first differ) from ``hidden_in[start]``, runs the kept layers ``>= start``, then the
    model's own final norm and LM head (with e.g. Gemma2's logit softcapping): the model's own ``forward``
    does the work, fed ``inputs_embeds=hidden_in[start]``, so rotary embeddings and causal/sliding-window
    masks are built exactly as usual. With a mask that skips nothing this costs only the norm and the head,
    and returns the full model's logits (the cost reference). Returns ``[batch, seq, vocab]``.
    """
    mask = _check_mask(model, mask)
    n = len(mask)
    if len(hidden_in) != n + 1:
        raise ValueError(f"hidden_in has {len(hidden_in)} entries; expected {n + 1} from layer_inputs()")
    first = first_skipped(mask)
    start = first if start is None else start
    if not 0 <= start <= first:
        raise ValueError(f"start={start} must lie in [0, first skipped layer {first}]")
    tail = tuple(m and i >= start for i, m in enumerate(mask))
    runner = _tail_model(model, tail)
    out = runner(inputs_embeds=hidden_in[start], attention_mask=attention_mask, position_ids=position_ids,
                 use_cache=False)
    return out.logits

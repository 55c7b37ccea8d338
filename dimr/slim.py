"""The slim verifier: the verifier run with only the layers (or sublayers) a mask keeps.

A *layer mask* has one bool per verifier decoder layer (True = the layer runs); a *sublayer mask*
(:class:`dimr.masks.SublayerMask`) decides each layer's attention and MLP on their own. A *slim verifier* is
the verifier run with only what its mask keeps. It is a second model object that shares every tensor with
the full model (embeddings, kept layers, final norm, LM head): only the module containers, the config and
the attention modules' ``layer_idx`` are copied, never a parameter.

Why the copies: on transformers 5.x the KV cache is indexed by ``layer_idx`` and sized from
``config.num_hidden_layers`` / ``config.layer_types``, and ``cache.get_seq_length()`` reads slot 0. Merely
cutting layers out of ``model.model.layers`` leaves holes in the cache (and wrong positions when layer 0 is
skipped) and misaligns sliding/global patterns (Gemma 2's alternation, Gemma 3's 5:1 with its local and
global rotary bases, both picked per layer from ``config.layer_types``). So the slim model gets a config
with ``num_hidden_layers = len(kept)`` and every per-layer config list (``layer_types``, SmolLM3's
``no_rope_layers``...) re-indexed to the kept layers, and kept layer ``i`` becomes slot ``j`` of its own
cache; each attention keeps its own ``sliding_window`` and rotary settings.

Families are not listed: any decoder-only model whose layers are ``model.model.layers``, each with a
``self_attn`` whose ``layer_idx`` is its position, is routed; anything else is refused with one line naming
what is missing (:func:`decoder_layers`).

Sublayer masks: the cache slots are the layers whose *attention* runs (a layer whose attention is skipped
keeps no cache entry). Slot ``j`` is one decoder-layer module of the slim model: attention ``j`` with the
MLP sublayers that follow it before the next kept attention (the MLPs before the first kept attention run
first in slot 0). A fully kept layer with nothing attached is the original layer (as for layer masks);
others are built from the original submodules (norms, ``self_attn``, ``mlp``), one residual sublayer each
(``h + post(f(pre(h)))``), so a skipped sublayer leaves the residual stream unchanged. How a family's layer
splits (pre-norm like Llama, Gemma 2/3's pre/post feed-forward norms, OLMo 2's post-norms) is read from its
norm modules and checked once per model against the layer's own forward.

Prefix reuse: layers before the first skipped layer compute
exactly what the full model computes, so :func:`layer_inputs` records the hidden state entering every layer
once per calibration batch and :func:`forward_from` starts a mask's forward at its first skipped layer (for
a sublayer mask, the first layer not run in full).
"""

from __future__ import annotations

import copy
import inspect
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dimr.errors import DimrError
from dimr.masks import SublayerMask, as_sublayer_mask

MaskLike = Sequence[bool] | SublayerMask


# --- routing: what a model must offer ------------------------------------------------------------------

def _refusal(model: nn.Module, why: str, what: str | None = None) -> DimrError:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    what = f" ({type(model).__name__})" if what is None else what
    return DimrError(
        f"layer routing does not support model type {model_type!r}{what}: {why}; use a decoder-only verifier "
        "whose decoder layers are model.model.layers, each with a self_attn.layer_idx"
    )


def _inner(model: nn.Module, what: str | None = None) -> nn.Module:
    """``model.model`` after checking everything routing relies on (DimrError naming what is missing)."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        raise _refusal(model, "it has no config", what)
    if getattr(cfg, "is_encoder_decoder", False):
        raise _refusal(model, "it is an encoder-decoder model", what)
    if getattr(cfg, "is_heterogeneous", False):
        raise _refusal(model, "it has per-layer (heterogeneous) configs", what)
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise _refusal(model, "it has no decoder layer list model.model.layers", what)
    n = getattr(cfg, "num_hidden_layers", None)
    if n != len(layers):
        raise _refusal(model, f"config.num_hidden_layers is {n!r} but model.model.layers has {len(layers)}",
                       what)
    for i, layer in enumerate(layers):
        if getattr(layer, "_dimr_unit", False):
            continue  # a sublayer slim's slot: checked when it was built
        attn = getattr(layer, "self_attn", None)
        if not isinstance(attn, nn.Module):
            raise _refusal(model, f"decoder layer {i} ({type(layer).__name__}) has no self_attn", what)
        if getattr(attn, "layer_idx", None) != i:
            raise _refusal(model, f"layer {i}'s self_attn.layer_idx is {getattr(attn, 'layer_idx', None)!r}, "
                                  f"not {i} (the KV cache is addressed through it)", what)
    types = getattr(cfg, "layer_types", None)
    if types is not None and len(types) != n:
        raise _refusal(model, f"config.layer_types has {len(types)} entries for {n} layers", what)
    return inner


def check_family(config, what: str = "") -> None:
    """DimrError unless routing can route a causal LM of ``config`` (no weights needed: the checks run on
    its skeleton built on the meta device). ``what`` names the model in the message, e.g. " (verifier of
    pair 'x')"."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
    except (ValueError, KeyError, TypeError, ImportError) as e:
        raise DimrError(f"layer routing does not support model type {getattr(config, 'model_type', None)!r}"
                        f"{what}: transformers builds no causal LM from its config ({e}); use a decoder-only "
                        "verifier") from None
    _inner(skeleton, what)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a causal LM (``model.model.layers``); DimrError if the model cannot be routed."""
    return _inner(model).layers


def num_layers(model: nn.Module) -> int:
    """Number of decoder layers of ``model`` (a full or a slim verifier; a sublayer slim: its cache slots)."""
    return len(decoder_layers(model))


def _per_layer_fields(cfg, n: int) -> list[str]:
    """Config lists with one entry per layer (``layer_types``, ``no_rope_layers``...), re-indexed by slims.

    Any public list of length ``n`` counts, except token ids and ``architectures``.
    """
    return [k for k, v in vars(cfg).items()
            if not k.startswith("_") and isinstance(v, (list, tuple)) and len(v) == n
            and k != "architectures" and not k.endswith(("token_id", "token_ids"))]


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


def _check_mask(model: nn.Module, mask: MaskLike) -> SublayerMask:
    n = num_layers(model)
    if set(getattr(model.config, "dimr_mask", None) or "") - {"0", "1"}:
        raise DimrError("this model is a sublayer slim verifier; build slim verifiers from the full model")
    sub = as_sublayer_mask(mask if isinstance(mask, SublayerMask) else tuple(bool(m) for m in mask))
    if len(sub) != n:
        kind = "layer" if not isinstance(mask, SublayerMask) else "sublayer"
        raise DimrError(f"{kind} mask has {len(sub)} entries but the verifier has {n} layers; "
                        "use a mask made for this verifier")
    return sub


# --- sublayers -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SublayerForm:
    """Names of the modules around a layer's attention and MLP (None: absent)."""

    attn_pre: str | None
    attn_post: str | None
    attn_drop: str | None
    mlp_pre: str | None
    mlp_post: str | None
    mlp_drop: str | None


def _detect_form(layer: nn.Module) -> SublayerForm | str:
    """How ``layer`` splits into residual sublayers, read from its children; a reason string if it cannot."""
    names = {name for name, _ in layer.named_children()}
    missing = [name for name in ("self_attn", "mlp") if name not in names]
    if missing:
        return f"it has no {' or '.join(missing)}"

    def has(name: str) -> str | None:
        return name if name in names else None

    drops = has("resid_attn_dropout"), has("resid_mlp_dropout")
    if has("pre_feedforward_layernorm") or has("post_feedforward_layernorm"):
        # Gemma 2/3 (norms before and after both) and OLMo 2 (norms after both): the attention output is
        # normed, the MLP's input by pre_feedforward_layernorm if any.
        return SublayerForm(has("input_layernorm"), has("post_attention_layernorm"), drops[0],
                     has("pre_feedforward_layernorm"), has("post_feedforward_layernorm"), drops[1])
    # Pre-norm (Llama and most): post_attention_layernorm is the MLP's input norm.
    return SublayerForm(has("input_layernorm"), None, drops[0], has("post_attention_layernorm"), None, drops[1])


class _Sublayer(nn.Module):
    """One residual sublayer of a decoder layer, ``h + drop(post(f(pre(h))))``, from the layer's modules."""

    def __init__(self, layer: nn.Module, form: SublayerForm, attention: nn.Module | None = None):
        super().__init__()
        self.attention = attention is not None
        pre, post, drop = ((form.attn_pre, form.attn_post, form.attn_drop) if self.attention
                           else (form.mlp_pre, form.mlp_post, form.mlp_drop))
        self.fn = attention if self.attention else layer.mlp
        self.pre = getattr(layer, pre) if pre else None
        self.post = getattr(layer, post) if post else None
        self.drop = getattr(layer, drop) if drop else None

    def forward(self, hidden_states: Tensor, **kwargs) -> Tensor:
        x = hidden_states if self.pre is None else self.pre(hidden_states)
        if self.attention:
            x = self.fn(hidden_states=x, **kwargs)[0]
        else:
            x = self.fn(x)
            x = x[0] if isinstance(x, tuple) else x
        if self.post is not None:
            x = self.post(x)
        if self.drop is not None:
            x = self.drop(x)
        return hidden_states + x


def _layer_kwargs(layer_cls: type, args: tuple, kwargs: dict) -> dict:
    """Name the positional arguments (after ``hidden_states``) a decoder layer was called with."""
    if not args:
        return kwargs
    params = list(inspect.signature(layer_cls.forward).parameters.values())[2:]
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(args) > len(names):
        raise TypeError(f"{layer_cls.__name__} called with {len(args) + 1} positional arguments")
    return {**dict(zip(names, args, strict=False)), **kwargs}


def _unit_forward(self, hidden_states: Tensor, *args, **kwargs) -> Tensor:
    kwargs = _layer_kwargs(type(self).__mro__[1], args, kwargs)
    for part in self.dimr_parts:
        hidden_states = part(hidden_states, **kwargs)
    return hidden_states


def _unit_attention(self) -> nn.Module | None:
    return next((p.fn for p in self.dimr_parts if p.attention), None)


# A slot of a sublayer slim is an instance of a subclass of the family's own layer class, so that what
# transformers finds by class (hidden-state recording for output_hidden_states) still finds it.
_UNIT_CLASSES: dict[type, type] = {}


def _unit_class(cls: type) -> type:
    if cls not in _UNIT_CLASSES:
        _UNIT_CLASSES.setdefault(cls, type(f"Sublayers{cls.__name__}", (cls,), {
            "forward": _unit_forward, "self_attn": property(_unit_attention), "_dimr_unit": True,
            "__module__": __name__}))
    return _UNIT_CLASSES[cls]


_FORMS: weakref.WeakKeyDictionary[nn.Module, list[SublayerForm]] = weakref.WeakKeyDictionary()
_FORMS_LOCK = threading.Lock()


@torch.no_grad()
def sublayer_forms(model: nn.Module) -> list[SublayerForm]:
    """Each layer's split into attention and MLP sublayers, checked against the layer's own forward.

    The check runs once per model (one forward on 6 tokens): every layer's output must equal its attention
    sublayer then its MLP sublayer applied to its input. DimrError if a layer does not split that way
    (e.g. Cohere's parallel attention and MLP): such models take whole-layer masks only.
    """
    with _FORMS_LOCK:
        if model in _FORMS:
            return _FORMS[model]
        layers = decoder_layers(model)

        def refuse(layer: nn.Module, why: str) -> DimrError:
            return DimrError(
                f"sublayer masks cannot route {type(model).__name__} (model type {model.config.model_type!r}): "
                f"its {type(layer).__name__} does not split into an attention and an MLP residual sublayer "
                f"({why}); use a whole-layer mask")

        forms = []
        for layer in layers:
            form = _detect_form(layer)
            if isinstance(form, str):
                raise refuse(layer, form)
            forms.append(form)
        calls: dict[int, tuple] = {}

        def grab(i: int):
            def hook(_mod, args, kwargs, out):
                calls[i] = (args, kwargs, out)
            return hook

        handles = [layer.register_forward_hook(grab(i), with_kwargs=True) for i, layer in enumerate(layers)]
        try:
            device = next(model.parameters()).device
            ids = torch.arange(6, device=device).unsqueeze(0) % model.config.vocab_size
            _inner(model)(input_ids=ids, use_cache=False)
        finally:
            for h in handles:
                h.remove()
        for i, layer in enumerate(layers):
            args, kwargs, out = calls[i]
            kwargs = dict(kwargs)
            hidden = args[0] if args else kwargs.pop("hidden_states")
            kwargs = _layer_kwargs(type(layer), args[1:], kwargs)
            got = hidden
            for part in (_Sublayer(layer, forms[i], layer.self_attn), _Sublayer(layer, forms[i])):
                got = part(got, **kwargs)
            out = out[0] if isinstance(out, tuple) else out
            if not torch.allclose(got, out, rtol=1e-3, atol=1e-4 * (1.0 + float(out.abs().max()))):
                raise refuse(layer, "its forward is not attention then MLP, each added to the residual stream")
        _FORMS[model] = forms
        return forms


# --- building slims ------------------------------------------------------------------------------------

def _attention_for_slot(layer: nn.Module, slot: int, cfg) -> nn.Module:
    attn = _shallow(layer.self_attn)
    # Slot `slot` in the slim model's cache; sliding_window/is_sliding/rotary stay those of the original.
    attn.layer_idx = slot
    if hasattr(attn, "config"):
        attn.config = cfg
    return attn


def _retarget(module: nn.Module, slot: int, cfg) -> None:
    if hasattr(module, "layer_idx"):
        module.layer_idx = slot
    if hasattr(module, "config"):
        module.config = cfg


def _whole_layer(layer: nn.Module, slot: int, cfg) -> nn.Module:
    new = _shallow(layer)
    new.self_attn = _attention_for_slot(layer, slot, cfg)
    _retarget(new, slot, cfg)
    return new


def _unit(layers: nn.ModuleList, forms: list[SublayerForm], anchor: int, parts: list[tuple[str, int]], slot: int,
          cfg) -> nn.Module:
    """Slot ``slot``: the sublayers ``parts`` ((kind, layer) in order) as one module of ``anchor``'s class."""
    modules = [_Sublayer(layers[i], forms[i], _attention_for_slot(layers[i], slot, cfg) if kind == "attn"
                         else None) for kind, i in parts]
    unit = _shallow(layers[anchor])
    unit.__class__ = _unit_class(type(layers[anchor]))
    unit.__dict__["_modules"] = {"dimr_parts": nn.ModuleList(modules)}
    _retarget(unit, slot, cfg)
    return unit


def _slots(mask: SublayerMask) -> tuple[list[int], list[list[tuple[str, int]]]]:
    """The layers whose attention runs (one cache slot each) and the sublayers each slot runs, in order.

    MLPs before the first kept attention join slot 0; with no attention at all, one slot (anchored at the
    first kept MLP) runs every kept MLP and its cache entry stays empty.
    """
    slots = [i for i, a in enumerate(mask.attn) if a] or [i for i, m in enumerate(mask.mlp) if m][:1]
    parts: list[list[tuple[str, int]]] = [[] for _ in slots]
    g = -1
    for i in range(len(mask)):
        if mask.attn[i]:
            g += 1
            parts[g].append(("attn", i))
        if mask.mlp[i]:
            parts[max(g, 0)].append(("mlp", i))
    return slots, parts


def _build_slim(model: nn.Module, mask: SublayerMask) -> nn.Module:
    """The slim model for a validated ``mask`` (may keep nothing: used by :func:`forward_from`)."""
    inner = _inner(model)
    n = len(inner.layers)
    slots, parts = _slots(mask)
    cfg = copy.deepcopy(model.config)
    cfg.num_hidden_layers = len(slots)
    for name in _per_layer_fields(model.config, n):
        values = getattr(model.config, name)
        setattr(cfg, name, type(values)(values[i] for i in slots))
    outer = getattr(model.config, "dimr_mask", None)
    cfg.dimr_mask = _compose(outer, mask.key) if outer else mask.key

    whole = [p == [("attn", i), ("mlp", i)] for i, p in zip(slots, parts, strict=True)]
    forms = sublayer_forms(model) if not all(whole) else []
    layers = [_whole_layer(inner.layers[i], j, cfg) if w else _unit(inner.layers, forms, i, p, j, cfg)
              for j, (i, p, w) in enumerate(zip(slots, parts, whole, strict=True))]

    slim_inner = _shallow(inner)
    slim_inner.config = cfg
    slim_inner.layers = nn.ModuleList(layers)
    slim = _shallow(model)
    slim.config = cfg
    slim.model = slim_inner
    if getattr(model, "generation_config", None) is not None:
        slim.generation_config = copy.deepcopy(model.generation_config)
    return slim


def _compose(outer_key: str, inner_key: str) -> str:
    """Mask key, relative to the original model, of ``inner_key`` applied to a slim model ``outer_key``."""
    it = iter(inner_key)
    return "".join(next(it) if c == "1" else "0" for c in outer_key)


def slim_verifier(model: nn.Module, mask: MaskLike) -> nn.Module:
    """``model`` run with only what ``mask`` keeps; shares every weight with ``model``.

    ``mask`` is a layer mask (one bool per layer) or a :class:`~dimr.masks.SublayerMask`. The result is a
    model of the same class: ``forward``, KV caches (``DynamicCache``) and ``generate()`` work as usual, and
    ``model`` itself stays unchanged and usable. ``slim.config.dimr_mask`` holds the mask key relative to
    the original model. Build caches from ``slim.config`` (one slot per kept layer; for a sublayer mask, per
    layer whose attention runs).

    Move or cast the full model (``.to()``, ``.half()``) *before* making slim verifiers, never the slim one:
    the parameters are the same objects, so casting the slim model would cast only the kept layers.
    """
    sub = _check_mask(model, mask)
    if sub.runs_nothing():
        raise DimrError(f"{'sublayer' if isinstance(mask, SublayerMask) else 'layer'} mask keeps no layer; "
                        "keep at least one")
    if not any(sub.attn):
        # Its one cache slot would never fill, so cache.get_seq_length() (positions, generate) would stay 0.
        raise DimrError(f"sublayer mask {sub.key} runs no attention; keep at least one layer's attention")
    return _build_slim(model, sub)


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
    the embeddings), index ``L`` the last layer's output before the final norm. Memory is
    ``(L + 1) * batch * seq * hidden`` elements of the model dtype. DimrError if the model has no
    ``model.model.norm`` or changes its embeddings before layer 0 (e.g. Granite's embedding multiplier):
    :func:`forward_from` feeds layer inputs back as ``inputs_embeds`` and needs them to pass unchanged.
    """
    inner = _inner(model)
    layers = inner.layers
    n = len(layers)
    norm, embed = getattr(inner, "norm", None), getattr(inner, "embed_tokens", None)
    if not isinstance(norm, nn.Module) or not isinstance(embed, nn.Module):
        raise _refusal(model, "prefix reuse needs model.model.norm and model.model.embed_tokens")
    captured: list[Tensor | None] = [None] * (n + 1)

    def grab(i: int):
        def hook(_mod, args, kwargs):
            captured[i] = args[0] if args else kwargs["hidden_states"]
        return hook

    handles = [m.register_forward_pre_hook(grab(i), with_kwargs=True) for i, m in enumerate([*layers, norm])]
    try:
        inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    assert all(t is not None for t in captured), "a decoder layer did not run"
    if not torch.equal(captured[0], embed(input_ids)):
        raise _refusal(model, "prefix reuse needs layer 0's input to be model.model.embed_tokens' output, and "
                              "this model transforms it first; evaluate masks without prefix reuse")
    return captured  # type: ignore[return-value]


@torch.no_grad()
def mid_states(model: nn.Module, input_ids: Tensor) -> list[Tensor]:
    """The residual stream between each layer's attention and MLP sublayers (what the MLP sublayer adds to),
    from one full forward: ``L`` tensors ``[batch, seq, hidden]``. With :func:`layer_inputs` this gives each
    sublayer's input and output (sublayer block influence, `dimr.search.heuristics`)."""
    inner = _inner(model)
    forms = sublayer_forms(model)
    captured: list[Tensor | None] = [None] * len(inner.layers)

    def grab(i: int):
        def hook(_mod, args, kwargs):
            captured[i] = args[0] if args else next(iter(kwargs.values()))
        return hook

    points = [getattr(layer, f.mlp_pre) if f.mlp_pre else layer.mlp
              for layer, f in zip(inner.layers, forms, strict=True)]
    handles = [m.register_forward_pre_hook(grab(i), with_kwargs=True) for i, m in enumerate(points)]
    try:
        inner(input_ids=input_ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    assert all(t is not None for t in captured), "a decoder layer's MLP did not run"
    return captured  # type: ignore[return-value]


# Tail models per (model, mask) so that a worker evaluating one mask on many batches builds it once.
_TAILS: weakref.WeakKeyDictionary[nn.Module, OrderedDict[str, nn.Module]] = weakref.WeakKeyDictionary()
_TAILS_MAX = 64
_TAILS_LOCK = threading.Lock()


def _tail_model(model: nn.Module, tail: SublayerMask) -> nn.Module:
    key = tail.key
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
    mask: MaskLike,
    hidden_in: Sequence[Tensor],
    *,
    start: int | None = None,
    attention_mask: Tensor | None = None,
    position_ids: Tensor | None = None,
) -> Tensor:
    """Logits of the slim verifier ``mask`` computed from the full model's cached layer inputs.

    ``hidden_in`` is :func:`layer_inputs` of ``model`` on the same batch (pass the same ``attention_mask``
    / ``position_ids``). The forward starts at layer ``start`` (default: the first layer the mask does not
    run in full, where the slim and full models first differ) from ``hidden_in[start]``, runs what the mask
    keeps of layers ``>= start``, then the model's own final norm and LM head (with e.g. Gemma2's logit
    softcapping): the model's own ``forward`` does the work, fed ``inputs_embeds=hidden_in[start]``, so
    rotary embeddings and causal/sliding-window masks are built exactly as usual. With a mask that skips
    nothing this costs only the norm and the head, and returns the full model's logits (the cost
    reference). ``mask`` is a layer mask or a :class:`~dimr.masks.SublayerMask`. Returns
    ``[batch, seq, vocab]``.
    """
    runner, start = _runner(model, mask, hidden_in, start)
    out = runner(inputs_embeds=hidden_in[start], attention_mask=attention_mask, position_ids=position_ids,
                 use_cache=False)
    return out.logits


def _runner(model: nn.Module, mask: MaskLike, hidden_in: Sequence[Tensor],
            start: int | None) -> tuple[nn.Module, int]:
    sub = _check_mask(model, mask)
    n = len(sub)
    if len(hidden_in) != n + 1:
        raise ValueError(f"hidden_in has {len(hidden_in)} entries; expected {n + 1} from layer_inputs()")
    first = sub.first_partial()
    start = first if start is None else start
    if not 0 <= start <= first:
        raise ValueError(f"start={start} must lie in [0, first skipped layer {first}]")
    tail = SublayerMask(tuple(a and i >= start for i, a in enumerate(sub.attn)),
                        tuple(m and i >= start for i, m in enumerate(sub.mlp)))
    return _tail_model(model, tail), start


@torch.no_grad()
def final_hidden_from(model: nn.Module, mask: MaskLike, hidden_in: Sequence[Tensor], *,
                      start: int | None = None) -> Tensor:
    """As :func:`forward_from`, but the final-norm output ``[batch, seq, hidden]`` instead of the logits, so the
    head can run on a few tokens at a time (:func:`head_logits`). ``hidden_in`` is only indexed at ``start``."""
    runner, start = _runner(model, mask, hidden_in, start)
    return runner.model(inputs_embeds=hidden_in[start], use_cache=False).last_hidden_state


def head_logits(model: nn.Module, final_hidden: Tensor) -> Tensor:
    """The model's LM head on final-norm outputs, with Gemma2's final logit softcapping where configured: what
    the causal LM's own ``forward`` computes from them."""
    head = model.get_output_embeddings()
    logits = head(final_hidden.to(head.weight.device))
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits

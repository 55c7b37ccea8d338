"""A ready decoder: a pair's models, its tokenizer and (optionally) a slim verifier from a slim config.

This is the Python API behind ``dimr decode``::

    dec = Decoder.load("mini", slim="slim.json")
    text, result = dec.generate("def fib(n):", mode="via", config=DecodeConfig(max_new_tokens=64))
    print(text, *result.stats.lines(), sep="\\n")
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch import Tensor
from transformers import PreTrainedModel

from dimr.decoding import modes, verify
from dimr.decoding.auto import Chooser, arms, auto, calibration_worth
from dimr.decoding.costs import Costs, measure
from dimr.decoding.modes import Escalate
from dimr.decoding.proposer import ModelProposer, NgramProposer
from dimr.decoding.sequence import DecodeConfig, DecodeResult
from dimr.decoding.shared import SharedPrefix, first_skipped_of
from dimr.decoding.tiers import Tier
from dimr.errors import DimrError
from dimr.userfiles import read_text, write_atomic

MODES = ("ar", "sd", "self", "via", "lookup", "hier", "auto")
NEEDS_SLIM = ("self", "via", "hier")
LOSSLESS_ONLY = ("hier", "auto")  # modes that take no relaxed verification rule
# forward lengths `auto` prices: every γ + 1 up to 9, and Γ + 1 up to 17. Each measured, not interpolated: on a CPU
# a row is not smooth in n (smollm2's verifier at one thread: 112 ms for 3 tokens, 85 for 4, 97 for 5, where
# interpolating 3 and 5 had priced 4 at 104); and 33, for a tier's catch-up after it sat out (a prompt is 30-60
# tokens): smollm2's slim took 217 ms for 53 tokens, which the chord from 17 to 33 prices at 215
COST_LENGTHS = (*range(1, 10), 13, 17, 33)
WORTH_SUFFIX = "_worth"  # a calibrated metric's companion: the tested tokens it is worth as auto's prior
CHOOSER_FORMAT = "dimr-auto-chooser/1"  # the file `Decoder.save_choosers` writes
STEP_PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"  # measure_steps' text


def _describe(identity: object) -> str:
    if not isinstance(identity, dict) or not identity:
        return "a decoder of unknown models"
    parts = [f"pair {identity.get('pair')}"]
    parts += [f"{k.replace('_', ' ')} {identity[k]}" for k in ("slim", "draft_slim") if identity.get(k)]
    return ", ".join(parts)


def check_ladder(draft, slim) -> None:
    """A ladder's draft slim must be the cheaper rung: fewer kept layers than the slim verifier it drafts for
    (both SlimConfigs, ``slim`` may be None)."""
    if slim is None:
        raise DimrError("a draft slim is the lower rung of a ladder; pass the upper one with --slim")
    if len(draft.kept_layers) >= len(slim.kept_layers):
        raise DimrError(f"the draft slim keeps {len(draft.kept_layers)} layers, the slim {len(slim.kept_layers)}: "
                        "the draft must be the more heavily skipped one; swap --draft-slim and --slim")


@dataclass
class Decoder:
    """The three tiers (``slim`` may be None: then only ``ar`` and ``sd`` run) and the tokenizer."""

    full: Tier
    draft: Tier
    slim: Tier | None = None
    tokenizer: object | None = None
    costs: Costs | None = None  # the cost table `auto` prices arms with; measured on first use if None
    # auto's running acceptance estimates, one chooser per temperature: acceptance depends on it
    choosers: dict[float, Chooser] = field(default_factory=dict, repr=False)
    shared: SharedPrefix | None = field(default=None, repr=False)  # hier's shared-prefix escalation
    # (proposer, target) → the slim config's calibration metrics (top1_agreement, expected_acceptance)
    calibrated: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    calibration: str | None = None  # the pair's calibration text (a spec for load_calibration); None: unknown
    # what a saved chooser state must have been learned on: the pair and its slim masks (`Decoder.load`)
    identity: dict[str, str | None] = field(default_factory=dict)
    # temperature → a loaded chooser state (`load_choosers`), made into that temperature's chooser on first use
    chooser_states: dict[float, dict] = field(default_factory=dict, repr=False)

    def escalate(self, config: DecodeConfig) -> Escalate | None:
        """The full forward hier escalates with: shared-prefix if the config asks for it and it applies."""
        if not config.share_prefix or self.slim is None or first_skipped_of(self.slim) == 0:
            return None
        if self.shared is None:
            self.shared = SharedPrefix(self.full, self.slim)
        return self.shared.forward

    @classmethod
    def from_models(cls, verifier: PreTrainedModel, draft: PreTrainedModel, slim: PreTrainedModel | None = None,
                    tokenizer: object | None = None, compiled: bool = False, timed: bool = True) -> Decoder:
        """``compiled``: static KV caches and compiled forwards (see :mod:`dimr.decoding.tiers`); ``timed``:
        per-tier timings (a device sync per forward on a GPU)."""
        slim_tier = Tier("slim", slim, compiled, timed) if slim is not None else None
        return cls(Tier("full", verifier, compiled, timed), Tier("draft", draft, compiled, timed), slim_tier,
                   tokenizer)

    @classmethod
    def load(cls, pair: str, slim: str | Path | None = None, device: str | None = None,
             pairs_file: Path | None = None, mask: Sequence[bool] | None = None, compiled: bool | None = False,
             timed: bool | None = True, draft_slim: str | Path | None = None) -> Decoder:
        """Load ``pair``'s models on ``device``; the slim verifier from a slim config (or a raw ``mask``).
        ``timed``: time every forward (``auto`` prices its arms by those times); None: timed unless on a GPU, where
        timing synchronises the device at every forward.
        ``draft_slim``: the ladder: the draft tier is this (more heavily skipped) slim verifier instead of the
        pair's draft model, which then does not load; both slims share every weight with the verifier.
        ``compiled=None``: compiled on a GPU (exact: a decode longer than a sliding window runs eagerly), eager on
        the CPU. On a GPU the models load in bfloat16 unless the pair names float16 (`dimr.pairs.model_dtype`)."""
        from dimr.pairs import get_pair, load_model, load_tokenizer, pick_device
        from dimr.slim_config import apply_slim_config, check_pair, load_slim_config

        p = get_pair(pair, pairs_file)
        dev = pick_device(device)
        cfg = draft_cfg = None
        if slim is not None:  # checked before any weights load
            cfg = load_slim_config(Path(slim))
            check_pair(cfg, p)
        if draft_slim is not None:
            draft_cfg = load_slim_config(Path(draft_slim))
            check_pair(draft_cfg, p)
            check_ladder(draft_cfg, cfg)
        verifier = load_model(p, "verifier", dev)
        slim_model = None
        if cfg is not None:
            slim_model = apply_slim_config(cfg, verifier)
        elif mask is not None:
            from dimr.slim import slim_verifier

            slim_model = slim_verifier(verifier, mask)
        if compiled is None:
            compiled = dev.type == "cuda"
        if timed is None:
            timed = dev.type != "cuda"
        draft = apply_slim_config(draft_cfg, verifier) if draft_cfg is not None else load_model(p, "draft", dev)
        out = cls.from_models(verifier, draft, slim_model, load_tokenizer(p), compiled, timed)
        out.calibrated = {pair: c.metrics for pair, c in ((("slim", "full"), cfg), (("draft", "full"), draft_cfg))
                          if c is not None}
        out.calibration = p.calibration
        raw = "".join("1" if keep else "0" for keep in mask) if mask is not None else None
        out.identity = {"pair": p.name, "slim": cfg.mask if cfg is not None else raw,
                        "draft_slim": draft_cfg.mask if draft_cfg is not None else None}
        return out

    def ladder(self, draft_slim: str | Path) -> Decoder:
        """This decoder's verifier and slim with the slim verifier of ``draft_slim`` as the draft tier: the
        nested ladder, sharing every weight with the verifier (``hier`` on it is draft-slim → slim → full)."""
        from dimr.slim import num_layers
        from dimr.slim_config import apply_slim_config, load_slim_config

        if self.slim is None:
            raise DimrError("a draft slim is the lower rung of a ladder; pass the upper one with --slim")
        cfg = load_slim_config(Path(draft_slim))
        if len(cfg.kept_layers) >= num_layers(self.slim.model):
            raise DimrError(f"the draft slim keeps {len(cfg.kept_layers)} layers, the slim "
                            f"{num_layers(self.slim.model)}: the draft must be the more heavily skipped one")
        out = Decoder.from_models(self.full.model, apply_slim_config(cfg, self.full.model), self.slim.model,
                                  self.tokenizer, self.full.compiled, self.full.timed)
        out.calibrated = {**self.calibrated, ("draft", "full"): cfg.metrics}
        out.calibration = self.calibration
        return out

    def warm_up(self, capacity: int = 240, modes: Sequence[str] = MODES) -> None:
        """Compile the forwards of the compiled tiers that ``modes`` use, for decodes of up to ``capacity``
        tokens in all, so that no decode waits for a compile."""
        used = {"full"} | ({"draft"} if {"sd", "via", "hier", "auto"} & set(modes) else set()) | (
            {"slim"} if {"self", "via", "hier", "auto"} & set(modes) else set())
        for tier in (self.full, self.draft, self.slim):
            if tier is not None and tier.name in used:
                tier.warm_up(capacity)

    def tiers(self) -> dict[str, Tier]:
        return {t.name: t for t in (self.draft, self.slim, self.full) if t is not None}

    def measure_costs(self, lengths: Sequence[int] = COST_LENGTHS, reps: int = 5,
                      steps: Sequence[str] = (), temperature: float = 0.0) -> Costs:
        """Time every tier on this machine (a few seconds) and keep the table for ``auto``; with ``steps`` (modes),
        also each mode's work per block outside the forwards at ``temperature`` (:meth:`measure_steps`)."""
        self.costs = measure(self.tiers(), lengths, reps)  # auto's calibration decode prices by it
        if steps:
            self.costs = replace(self.costs, steps=self.measure_steps(steps, temperature=temperature))
        self.choosers = {}
        return self.costs

    @torch.inference_mode()
    def measure_steps(self, modes: Sequence[str], tokens: int = 16, gamma: int = 2, reps: int = 2,
                      temperature: float = 0.0) -> dict[str, float]:
        """Seconds per block each mode spends outside its forwards (sampling, acceptance, the n-gram search,
        cache bookkeeping; for ``auto`` also its choice), from decodes of ``tokens`` tokens of a fixed
        calibration text at ``temperature`` (sampling costs more than an argmax), the fastest of ``reps``. The
        forwards' own time is the tiers' timing, so it needs timed tiers (on a GPU they are untimed by default:
        then nothing is measured)."""
        prompt = (self.encode(STEP_PROMPT) if self.tokenizer is not None  # a bare model: tokens as measure() uses
                  else torch.arange(16, device=self.device) % 50 + 3)
        config = DecodeConfig(max_new_tokens=tokens, gamma=gamma, temperature=temperature, eos_token_ids=())
        out = {}
        for mode in dict.fromkeys(m.partition("@")[0] for m in modes):
            if (mode not in MODES or not all(t.timed for t in self.tiers().values())
                    or (self.slim is None and mode in NEEDS_SLIM)):
                continue
            best = math.inf
            for _ in range(reps):
                s = self.run(prompt, mode, config).stats
                best = min(best, max(s.wall_seconds - sum(s.seconds.values()), 0.0) / max(s.blocks, 1))
            out[mode] = best
        self.choosers = {}  # the calibration decodes of auto must not warm the chooser a measurement then uses
        return out

    def auto_chooser(self, temperature: float = 0.0) -> Chooser:
        """``auto``'s chooser at ``temperature``, made on its first use: a slim config's calibrated acceptance (top-1
        agreement when greedy, the expected acceptance when sampling) is its tier pair's prior. One per temperature:
        a draft accepted 0.9 of the time greedy may be accepted 0.6 at T = 0.7, so requests at one temperature
        must not price the arms of another (the tables of measured times are shared through :attr:`costs` only)."""
        temperature = float(temperature)
        if temperature not in self.choosers:
            costs = self.costs or self.measure_costs()
            own = arms(draft=True, slim=self.slim is not None)
            if temperature in self.chooser_states:  # it carries its calibrations: no calibration decodes
                self.choosers[temperature] = Chooser.from_state(costs, own, self.chooser_states.pop(temperature))
            else:
                self.calibrate_pairs()
                key = "top1_agreement" if temperature == 0 else "expected_acceptance"
                measured = {pair: m for pair, m in self.calibrated.items() if math.isfinite(m.get(key, math.nan))}
                self.choosers[temperature] = Chooser(
                    costs, own, calibrated={pair: m[key] for pair, m in measured.items()},
                    worth={pair: m[key + WORTH_SUFFIX] for pair, m in measured.items() if key + WORTH_SUFFIX in m})
        return self.choosers[temperature]

    def save_choosers(self, path: str | Path) -> Path:
        """Write what ``auto`` has learned (each temperature's chooser, :meth:`Chooser.state`) to ``path``, so a
        later process (a restarted server) starts from it with :meth:`load_choosers`. Written to a temporary file
        beside ``path`` and renamed into place: an interrupted write leaves the old file."""
        states = {**self.chooser_states, **{t: c.state() for t, c in self.choosers.items()}}
        data = {"format": CHOOSER_FORMAT, "identity": self.identity,
                "choosers": {repr(t): s for t, s in sorted(states.items())}}
        return write_atomic(Path(path), json.dumps(data, indent=1) + "\n")

    def load_choosers(self, path: str | Path) -> None:
        """Start ``auto`` from the state :meth:`save_choosers` wrote to ``path``; refused (``DimrError``) if it is
        not such a file or was learned on another pair or slim verifier."""
        path = Path(path)
        fix = "pass a file that `dimr decode --mode auto --chooser-state` wrote, or a new path"
        text = read_text(path, "chooser state", fix)
        try:
            data = json.loads(text)
            if data.get("format") != CHOOSER_FORMAT:
                raise ValueError(f"format is {data.get('format')!r}, not {CHOOSER_FORMAT!r}")
            states = {float(t): s for t, s in data["choosers"].items()}
            for s in states.values():  # parsed now, so a bad file fails here and not mid-decode
                Chooser.from_state(Costs({}, "check"), [], s)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise DimrError(f"chooser state {path} is not one dimr wrote ({e}); {fix}") from None
        if data.get("identity") != self.identity:
            raise DimrError(f"chooser state {path} was learned on {_describe(data.get('identity'))}, not on "
                            f"{_describe(self.identity)}; pass that pair and slim, or another --chooser-state path")
        self.chooser_states = states
        self.choosers = {}

    @torch.inference_mode()
    def calibrate_pairs(self, num_sequences: int = 8, prompt_len: int = 32,
                        new_tokens: int = 48) -> dict[tuple[str, str], dict[str, float]]:
        """``auto``'s priors for the model-drafted tier pairs no slim config calibrated (the draft model against
        the full verifier and against the slim): each pair's top-1 agreement and expected acceptance on the full
        verifier's own greedy continuations of ``num_sequences`` calibration prompts, the text a decode drafts
        for (on the calibration text itself mini's draft agrees with the verifier on 0.38 of tokens, on
        its continuations of HumanEval prompts 0.74), and what that mean is worth as a prior
        (:func:`~dimr.decoding.auto.calibration_worth` of the sequences' spread, under ``<metric>_worth``). A pair
        with a prior is tested by its first blocks only where its mode could win and its prior says it loses. Once
        per decoder; nothing without a calibration text at hand (a decoder built by :meth:`from_models`, a hub
        dataset offline): those pairs start from no prior (a failed measurement is kept as NaN, the mark of a metric
        not measured, so it is not tried again)."""
        from dimr.calibration import load_calibration
        from dimr.cost import evaluate_logits

        pairs = [("draft", "full"), ("draft", "slim")] if self.slim is not None else [("draft", "full")]
        pairs = [pair for pair in pairs if pair not in self.calibrated]
        if self.calibration is None or not pairs:
            return self.calibrated
        unmeasured = {"top1_agreement": math.nan, "expected_acceptance": math.nan}
        try:
            prompts = load_calibration(self.calibration, self.tokenizer, num_sequences, prompt_len).input_ids
        except DimrError:
            self.calibrated.update(dict.fromkeys(pairs, unmeasured))
            return self.calibrated
        tiers = {t.name: t for t in (self.full, self.draft, self.slim) if t is not None}
        rows: dict[tuple[str, str], list[dict[str, float]]] = {pair: [] for pair in pairs}
        lengths = []
        for prompt in prompts.to(self.device):
            new = self.run(prompt, "ar", DecodeConfig(max_new_tokens=new_tokens)).tokens
            if not new:  # the verifier ended at once
                continue
            lengths.append(len(new))
            ids = torch.cat([prompt, torch.tensor(new, device=self.device, dtype=prompt.dtype)])[None]
            logits = {name: tiers[name].model(input_ids=ids, use_cache=False).logits[0, prompt.numel() - 1:-1]
                      for name in {name for pair in pairs for name in pair}}
            vocab = min(v.shape[-1] for v in logits.values())  # a draft's embedding may be padded further
            for pair in pairs:
                rows[pair].append(evaluate_logits(logits[pair[1]][:, :vocab], logits[pair[0]][:, :vocab]))
        tokens = sum(lengths) / max(len(lengths), 1)
        for pair, measured in rows.items():
            rates = {key: [m[key] for m in measured] for key in unmeasured}
            self.calibrated[pair] = {key: sum(r) / len(r) if r else math.nan for key, r in rates.items()}
            self.calibrated[pair].update({key + WORTH_SUFFIX: calibration_worth(r, tokens) for key, r in rates.items()})
        return self.calibrated

    @property
    def vocab_size(self) -> int:
        return self.full.model.get_output_embeddings().weight.shape[0]

    @property
    def device(self) -> torch.device:
        return self.full.model.device

    def eos_token_ids(self) -> tuple[int, ...]:
        eos = getattr(self.full.model.generation_config, "eos_token_id", None)
        if eos is None and self.tokenizer is not None:
            eos = self.tokenizer.eos_token_id
        return tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (int(eos),))

    def encode(self, prompt: str) -> Tensor:
        ids = self.tokenizer(prompt, return_tensors="pt").input_ids[0]
        if ids.numel() == 0:
            bos = self.tokenizer.bos_token_id
            if bos is None:
                raise DimrError("the prompt is empty and the tokenizer has no BOS token; pass a prompt")
            ids = torch.tensor([bos])
        return ids.to(self.device)

    def run(self, prompt: Tensor, mode: str, config: DecodeConfig,
            targets: verify.TargetsFn = verify.lossless) -> DecodeResult:
        """Decode token ids [L] with ``mode`` (one of :data:`MODES`); ``targets``: the verification rule."""
        if mode not in MODES:
            raise DimrError(f"unknown decoding mode {mode!r}; use one of {', '.join(MODES)}")
        if mode in NEEDS_SLIM and self.slim is None:
            raise DimrError(f"mode {mode!r} needs a slim verifier; pass --slim with an exported slim config")
        if mode == "ar" and targets is not verify.lossless:
            raise DimrError("mode 'ar' has no draft to verify; use a relaxed rule with sd, self or via")
        if mode in LOSSLESS_ONLY and targets is not verify.lossless:
            raise DimrError(f"mode {mode!r} is lossless only; use a relaxed rule with sd, self, lookup or via")
        if mode == "lookup" and (getattr(targets, "needs_hidden", False) or getattr(targets, "needs_draft_model",
                                                                                    False)):
            raise DimrError("this relaxed rule reads a draft model (its hidden states or its distribution), which "
                            "the n-gram proposer does not have; use it with --mode sd or via")
        needs_hidden = bool(getattr(targets, "needs_hidden", False))
        for tier in (self.full, self.draft, self.slim):
            if tier is not None:
                tier.keep_hidden = needs_hidden
        if mode == "ar":
            return modes.ar(self.full, prompt, config)
        if mode == "sd":
            return modes.sd(ModelProposer(self.draft), self.full, prompt, config, targets=targets)
        if mode == "self":
            return modes.sd(ModelProposer(self.slim), self.full, prompt, config, mode="self", targets=targets)
        if mode == "lookup":
            return modes.sd(NgramProposer(self.vocab_size), self.full, prompt, config, mode="lookup", targets=targets)
        if mode in ("hier", "auto"):
            escalate = self.escalate(config)
            with self.shared.recording() if escalate else nullcontext():
                if mode == "hier":
                    return modes.hier(ModelProposer(self.draft), self.slim, self.full, prompt, config,
                                      escalate=escalate)
                return auto(self.auto_chooser(config.temperature), self.full, self.draft, self.slim, prompt, config,
                            self.vocab_size, escalate=escalate)
        return modes.via(ModelProposer(self.draft), self.slim, self.full, prompt, config, targets=targets)

    def generate(self, prompt: str, mode: str = "via", config: DecodeConfig | None = None,
                 stop_at_eos: bool = True, targets: verify.TargetsFn = verify.lossless) -> tuple[str, DecodeResult]:
        """Text in, text out (the continuation only)."""
        config = config or DecodeConfig()
        if stop_at_eos and not config.eos_token_ids:
            config = replace(config, eos_token_ids=self.eos_token_ids())
        result = self.run(self.encode(prompt), mode, config, targets)
        return self.tokenizer.decode(result.tokens, skip_special_tokens=True), result

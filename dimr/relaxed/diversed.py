"""DIVERSED (arXiv 2604.07622): a learned, context-dependent ensemble of draft and target.

ν_t = w_t·p_t + (1 − w_t)·p_d with w_t = f(h_draft,t, h_target,t): :class:`EnsembleHead` is one linear layer on
[h_draft; h_target] (the last hidden states after the final norm) to 2 logits and a softmax, initialised at
0.5/0.5 (zero weights), as in the authors' code. π_rej = π_res = ν, π_bonus = p_t. Only the head trains.

We mix **probabilities** (the paper's formula), not logits (the released training code mixes logits): with
probabilities the acceptance is exactly 1 − w·TV(p_d, p_t) and the static ensemble is the special case w_t = w,
so the learned head and the static curve are compared on one scale.

Training (:func:`train_head`) is REINFORCE: roll out y_t ~ ν_t token by token, a batch of prompts at once with
both models KV-cached (ν is the distribution relaxed speculative decoding produces), score each sequence with a
reward R, then minimise −(R − b)·Σ_t log ν_t(y_t) − λ·Σ_t (1 − TV(p_d,t, ν_t)), b a moving average of R; AdamW.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from dimr.decoding.sampling import Sampler
from dimr.decoding.verify import Context, Targets, lossless
from dimr.divergence import tv
from dimr.errors import DimrError
from dimr.relaxed.base import mix, require_context

HEAD_SCHEMA = 1


class EnsembleHead(nn.Module):
    """w = softmax(Linear([h_draft; h_target]))[0], the weight on the target; starts at exactly ``init_w``
    (zero weights, the bias at logit(init_w); the authors' start is 0.5)."""

    def __init__(self, d_draft: int, d_full: int, init_w: float = 0.5) -> None:
        super().__init__()
        if not 0.0 < init_w < 1.0:
            raise DimrError(f"the head's starting weight {init_w} must lie strictly between 0 and 1")
        self.d_draft, self.d_full = d_draft, d_full
        self.linear = nn.Linear(d_draft + d_full, 2)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        with torch.no_grad():
            self.linear.bias[0] = math.log(init_w / (1 - init_w))

    def logits(self, h_draft: Tensor, h_full: Tensor) -> Tensor:
        return self.linear(torch.cat([h_draft.float(), h_full.float()], -1))

    def forward(self, h_draft: Tensor, h_full: Tensor, shift: float = 0.0) -> Tensor:
        """w [n] for hidden states [n, d_draft], [n, d_full]; ``shift`` is added to the target's logit."""
        z = self.logits(h_draft, h_full)
        if math.isinf(shift):
            return torch.full_like(z[..., 0], 1.0 if shift > 0 else 0.0)
        return torch.softmax(z + torch.tensor([shift, 0.0], device=z.device), -1)[..., 0]


@dataclass(frozen=True)
class Diversed:
    """The relaxed rule with a trained head. ``shift`` moves every w_t along the head's logit (+inf = lossless),
    which sweeps a speed–quality curve for one head the way ``w`` does for the static ensemble."""

    head: EnsembleHead
    shift: float = 0.0
    needs_hidden = True

    def weights(self, context: Context) -> Tensor:
        if context.h_draft is None or context.h_full is None:
            raise ValueError("the diversed rule needs hidden states; run it through Decoder.run (needs_hidden)")
        with torch.no_grad():
            return self.head(context.h_draft, context.h_full[:-1], self.shift)

    def __call__(self, draft_probs: Tensor, full_probs: Tensor, context: Context | None = None) -> Targets:
        if math.isinf(self.shift) and self.shift > 0:
            return lossless(draft_probs, full_probs)
        w = self.weights(require_context(context, "diversed")).to(full_probs.dtype)
        ensemble = mix(w, full_probs[:-1], draft_probs)
        return Targets(ensemble, ensemble, full_probs[-1])


# ---------------------------------------------------------------------------------------------- training


@dataclass
class TrainConfig:
    """Every number that shapes a DIVERSED training run (defaults: the authors', scaled to a CPU)."""

    steps: int = 30
    batch: int = 8
    lr: float = 5e-4
    weight_decay: float = 0.01
    lam: float = 0.05  # λ on Σ(1 − TV(p_d, ν)), per token
    init_w: float = 0.5  # the head's starting w (the authors': 0.5; near 1 starts at the verifier)
    baseline_momentum: float = 0.9
    max_new_tokens: int = 64
    temperature: float = 0.0  # the decoder's sampler the head is trained for
    top_p: float = 1.0
    seed: int = 0


@dataclass
class TrainLog:
    rewards: list[float] = field(default_factory=list)  # mean reward per step
    mean_w: list[float] = field(default_factory=list)  # mean w_t over rolled-out tokens per step
    acceptance: list[float] = field(default_factory=list)  # mean 1 − TV(p_d, ν) per step
    seconds: float = 0.0


@torch.no_grad()
def rollout(head: EnsembleHead, draft: PreTrainedModel, full: PreTrainedModel, prompts: Sequence[Tensor],
            sampler: Sampler, max_new_tokens: int, generator: torch.Generator, eos: Sequence[int] = (),
            pad_id: int = 0) -> list[Tensor]:
    """Sample y_t ~ ν_t for a batch of prompts at once (left-padded, both models KV-cached); new tokens each."""
    from transformers import DynamicCache

    device = full.device
    width = max(p.numel() for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, width - p.numel():], mask[b, width - p.numel():] = p, 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    caches = [DynamicCache(config=m.config) for m in (draft, full)]
    eos_ids = torch.tensor(list(eos) or [-1], device=device)
    done = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    steps: list[Tensor] = []
    for _ in range(max_new_tokens):
        d, f = (m(input_ids=ids, attention_mask=mask, position_ids=positions, cache=c, use_cache=True,
                  output_hidden_states=True, logits_to_keep=1) for m, c in zip((draft, full), caches, strict=True))
        w = head(d.hidden_states[-1][:, -1], f.hidden_states[-1][:, -1])
        nu = mix(w, sampler.probs(f.logits[:, -1]), sampler.probs(d.logits[:, -1]))
        y = torch.multinomial(nu, 1, generator=generator)[:, 0]
        steps.append(torch.where(done, -1, y))
        done |= torch.isin(y, eos_ids)
        if bool(done.all()):
            break
        ids, mask = y[:, None], torch.cat([mask, torch.ones_like(mask[:, :1])], -1)
        positions = positions[:, -1:] + 1
    out = torch.stack(steps, 1) if steps else torch.zeros(len(prompts), 0, dtype=torch.long, device=device)
    return [row[row >= 0] for row in out]


@torch.no_grad()
def teacher_forced(draft: PreTrainedModel, full: PreTrainedModel, prompt: Tensor, tokens: Tensor,
                   sampler: Sampler) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(p_d, p_t [T, V], h_draft [T, d_d], h_full [T, d_f]) at the positions that predict ``tokens``."""
    ids = torch.cat([prompt, tokens])[None]
    t = tokens.numel()
    outs = [m(input_ids=ids, output_hidden_states=True, logits_to_keep=t + 1) for m in (draft, full)]
    (d, f) = outs
    return (sampler.probs(d.logits[0, :-1]), sampler.probs(f.logits[0, :-1]),
            d.hidden_states[-1][0, -t - 1:-1], f.hidden_states[-1][0, -t - 1:-1])


RewardFn = Callable[[int, Tensor], float]
"""(index of the prompt, generated tokens [T]) → reward."""


def train_head(draft: PreTrainedModel, full: PreTrainedModel, prompts: Sequence[Tensor], reward: RewardFn,
               config: TrainConfig = TrainConfig(), eos: Sequence[int] = (),
               head: EnsembleHead | None = None, progress: Callable[[int, TrainLog], None] | None = None,
               ) -> tuple[EnsembleHead, TrainLog]:
    """REINFORCE on the head only; both models stay frozen. ``prompts``: token ids [L] each."""
    t0 = time.perf_counter()
    torch.manual_seed(config.seed)
    head = head or EnsembleHead(draft.config.hidden_size, full.config.hidden_size, config.init_w)
    head.to(full.device)
    opt = torch.optim.AdamW(head.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    sampler = Sampler(config.temperature, config.top_p)
    generator = torch.Generator(device=full.device).manual_seed(config.seed)
    order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(config.seed)).tolist()
    log, baseline = TrainLog(), None
    for step in range(config.steps):
        picked = [order[(step * config.batch + k) % len(order)] for k in range(config.batch)]
        pad = full.config.pad_token_id if full.config.pad_token_id is not None else 0
        rolls = rollout(head, draft, full, [prompts[i] for i in picked], sampler, config.max_new_tokens, generator,
                        eos, pad)
        rewards = torch.tensor([reward(i, y) for i, y in zip(picked, rolls, strict=True)])
        mean_r = float(rewards.mean())
        baseline = mean_r if baseline is None else config.baseline_momentum * baseline + (
            1 - config.baseline_momentum) * mean_r
        loss, ws, accs = torch.zeros(()), [], []
        for i, y, r in zip(picked, rolls, rewards.tolist(), strict=True):
            if y.numel() == 0:
                continue
            p_d, p_t, h_d, h_f = teacher_forced(draft, full, prompts[i], y, sampler)
            w = head(h_d, h_f)
            nu = mix(w, p_t, p_d)
            log_nu = nu[torch.arange(y.numel()), y].clamp_min(1e-30).log()
            agreement = 1 - tv(p_d, nu)
            loss = loss - ((r - baseline) * log_nu.sum() + config.lam * agreement.sum()) / config.batch
            ws.append(w.detach())
            accs.append(agreement.detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
        log.rewards.append(mean_r)
        log.mean_w.append(float(torch.cat(ws).mean()) if ws else math.nan)
        log.acceptance.append(float(torch.cat(accs).mean()) if accs else math.nan)
        if progress is not None:
            progress(step, log)
    log.seconds = time.perf_counter() - t0
    return head.eval(), log


TOKEN_TYPES = ("digits", "punctuation", "words", "space", "other", "special")


def token_type(text: str, special: bool = False) -> str:
    """The kind of one token's text: digits, punctuation (no letter or digit), words (letters), space, other."""
    if special:
        return "special"
    t = text.strip()
    if not t:
        return "space"
    if t.isdigit():
        return "digits"
    if not any(c.isalnum() for c in t):
        return "punctuation"
    return "words" if t.isalpha() else "other"


@torch.no_grad()
def w_by_token_type(head: EnsembleHead, draft: PreTrainedModel, full: PreTrainedModel, prompts: Sequence[Tensor],
                    outputs: Sequence[Tensor], tokenizer, sampler: Sampler) -> dict[str, dict[str, float]]:
    """The head's w_t along each output, grouped by the type of the token y_t it weighs (:func:`token_type`):
    count, mean and the 10/50/90% quantiles per type."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    groups: dict[str, list[float]] = {t: [] for t in TOKEN_TYPES}
    for prompt, y in zip(prompts, outputs, strict=True):
        if y.numel() == 0:
            continue
        _, _, h_d, h_f = teacher_forced(draft, full, prompt, y, sampler)
        for tok, w in zip(y.tolist(), head(h_d, h_f).tolist(), strict=True):
            groups[token_type(tokenizer.decode([tok]), tok in special)].append(w)
    out = {}
    for kind, ws in groups.items():
        if ws:
            q = torch.tensor(ws, dtype=torch.float64).quantile(torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64))
            out[kind] = {"n": len(ws), "mean": sum(ws) / len(ws), "q10": float(q[0]), "q50": float(q[1]),
                         "q90": float(q[2])}
    return out


# ---------------------------------------------------------------------------------------------- files


def head_config_path(path: Path) -> Path:
    return Path(path).with_suffix(".json")


def save_head(head: EnsembleHead, path: Path, *, pair: str, draft: PreTrainedModel, full: PreTrainedModel,
              task: str, config: TrainConfig, log: TrainLog, extra: dict | None = None) -> Path:
    """``path`` (safetensors) and a JSON config beside it, fingerprinted against the verifier and the draft."""
    from safetensors.torch import save_file

    from dimr import __version__
    from dimr.slim_config import fingerprint

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}, str(path))
    meta = {
        "schema": HEAD_SCHEMA, "method": "diversed", "mixing": "probabilities", "pair": pair, "task": task,
        "verifier_fingerprint": fingerprint(full), "draft_fingerprint": fingerprint(draft),
        "d_draft": head.d_draft, "d_full": head.d_full, "train": asdict(config),
        "log": {"rewards": log.rewards, "mean_w": log.mean_w, "acceptance": log.acceptance,
                "seconds": log.seconds},
        "dimr_version": __version__, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **(extra or {}),
    }
    head_config_path(path).write_text(json.dumps(meta, indent=2) + "\n")
    return path


def load_head(path: Path, draft: PreTrainedModel | None = None, full: PreTrainedModel | None = None,
              ) -> tuple[EnsembleHead, dict]:
    """Load a head; with the models given, refuse one trained for other architectures (fingerprints)."""
    from safetensors.torch import load_file

    from dimr.slim_config import fingerprint

    path = Path(path)
    meta_path = head_config_path(path)
    if not path.is_file() or not meta_path.is_file():
        raise DimrError(f"no DIVERSED head at {path} (+ {meta_path.name}); train one with `dimr diversed train`")
    try:
        meta = json.loads(meta_path.read_text())
        d_draft, d_full = int(meta["d_draft"]), int(meta["d_full"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        raise DimrError(f"{meta_path} is not a DIVERSED head config; retrain the head") from None
    if meta.get("schema") != HEAD_SCHEMA:
        raise DimrError(f"{meta_path} has schema {meta.get('schema')}, this dimr reads {HEAD_SCHEMA}; retrain")
    for which, model in (("verifier", full), ("draft", draft)):
        if model is not None and fingerprint(model) != meta.get(f"{which}_fingerprint"):
            raise DimrError(f"the head {path.name} was trained for another {which} (fingerprint mismatch); "
                            f"use a head trained on pair {meta.get('pair')!r} or retrain")
    head = EnsembleHead(d_draft, d_full)
    head.load_state_dict(load_file(str(path)))
    if full is not None:
        head.to(full.device)
    return head.eval(), meta

"""The cost model: what one forward of each tier costs, and the tokens/s each mode and γ then deliver.

- :class:`Costs` holds c(tier, n), the seconds of one forward of ``n`` tokens on a warm KV cache, per tier
  (``draft``, ``slim``, ``full``; ``lookup`` — the n-gram proposer — costs nothing). Between measured
  lengths it interpolates linearly; beyond the last one it goes on along the chord from the measured length
  nearest half the last, never falling.
- :func:`measure` times the tiers of a :class:`~dimr.decoding.Decoder` on the machine at hand
  (``dimr bench-forward``); :func:`roofline` predicts them for a named GPU from parameter counts alone:
  weight bytes / memory bandwidth, flat in n up to the compute knee (2·params·n FLOPs / peak), plus a fixed
  per-layer launch overhead.
- :func:`predict` is the pure speed model of one mode and γ from per-token acceptance rates (i.i.d.
  acceptance, the standard analysis of speculative decoding); :func:`predict_from_counts` the one that
  replays a decode's actual call counts on a cost table.

A block of ``sd`` costs γ·c(draft, 1) + c(full, γ+1) and yields (1 − α^(γ+1))/(1 − α) tokens; ``hier``
(draft → slim → full) fills a window of Γ slim-accepted tokens with inner blocks of γ against the slim
verifier, then checks the window with one full forward of Γ + 1 tokens.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dimr.errors import DimrError

FREE = "lookup"  # the n-gram proposer: a table look-up, no forward
# the key suffix of a draft's acceptance, as (first, rest) of Sure, when it stops drafting after a token it is unsure of
STOP_SUFFIX = "~stop"


@dataclass(frozen=True)
class Costs:
    """c(tier, n) in seconds. ``table[tier][n]``; ``source`` says where the numbers came from. ``sublayers``, if
    measured (:func:`measure_sublayers`): the verifier's per-layer attention and MLP seconds and the rest, by n,
    for the pair it names (the budget of a sublayer search, `dimr.search.budget`)."""

    table: Mapping[str, Mapping[int, float]]
    source: str = "measured"
    sublayers: Mapping | None = None
    steps: Mapping[str, float] | None = None  # mode → seconds per block outside the forwards (the step's own work)

    def step(self, mode: str) -> float:
        """Seconds one block of ``mode`` (``sd@2`` → ``sd``) spends outside its forwards; 0 when not measured."""
        return (self.steps or {}).get(mode.partition("@")[0], 0.0)

    def __call__(self, tier: str, n: float) -> float:
        if tier == FREE:
            return 0.0
        if tier not in self.table:
            raise DimrError(f"the cost table ({self.source}) has no tier {tier!r}; measure it with "
                            "`dimr bench-forward` (with --slim for the slim tier)")
        points = sorted(self.table[tier].items())
        if len(points) == 1 or n <= points[0][0]:
            return points[0][1]
        for (n0, c0), (n1, c1) in zip(points, points[1:], strict=False):
            if n <= n1:
                return c0 + (c1 - c0) * (n - n0) / (n1 - n0)
        # the chord from the middle of the row, not the last segment: a kernel that is fast at one size tilts a short
        # one (smollm2's slim, one run: 163 ms at 13 tokens, 128 at 17; extended from those two, a 53-token catch-up
        # was priced at -190 ms, and `auto` ran its slim on every prompt of the task, 2.6 s of 18.5)
        n1, c1 = points[-1]
        n0, c0 = min(points[:-1], key=lambda p: abs(p[0] - n1 / 2))
        return c1 + max(c1 - c0, 0.0) * (n - n1) / (n1 - n0)

    def relative(self, tier: str, n: int) -> float:
        """c(tier, n) / c(full, 1): multiples of one autoregressive step."""
        return self(tier, n) / self("full", 1)

    def scaled(self, factors: Mapping[str, float]) -> Costs:
        """Every tier's row times its factor (1 where none is given)."""
        return Costs({t: {n: c * factors.get(t, 1.0) for n, c in row.items()} for t, row in self.table.items()},
                     self.source)

    def to_dict(self) -> dict:
        out = {"source": self.source, "table": {t: {str(n): c for n, c in row.items()}
                                                for t, row in self.table.items()}}
        if self.steps:
            out["steps"] = dict(self.steps)
        if self.sublayers:
            out["sublayers"] = {k: ({str(n): c for n, c in v.items()} if isinstance(v, Mapping) else v)
                                for k, v in self.sublayers.items()}
        return out

    @classmethod
    def from_dict(cls, data: dict) -> Costs:
        sub = data.get("sublayers")
        if sub is not None:
            sub = {k: ({int(n): float(c) for n, c in v.items()} if k in SUBLAYER_PARTS else v) for k, v in sub.items()}
        steps = {str(m): float(v) for m, v in data["steps"].items()} if data.get("steps") else None
        return cls({t: {int(n): float(c) for n, c in row.items()} for t, row in data["table"].items()},
                   data.get("source", "file"), sub, steps)

    @classmethod
    def load(cls, path: Path) -> Costs:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise DimrError(f"cannot read the cost table {path} ({e}); write it with "
                            "`dimr bench-forward --json > costs.json`") from None


# --- measuring ------------------------------------------------------------------------------------------

@torch.inference_mode()
def measure(tiers: Mapping[str, object], lengths: Iterable[int] = range(1, 17), reps: int = 5,
            prefix: int = 64) -> Costs:
    """Time every tier (name → :class:`~dimr.decoding.tiers.Tier`) at every length: a measured table.

    Each tier gets a ``prefix``-token warm cache; then ``reps`` rounds each time every tier at every length
    once (after one untimed round that warms every shape), and a cell keeps its fastest round. The minimum, not
    the median: on a shared machine every disturbance only adds time, so the fastest run is the forward's own
    cost. Rounds, not a cell's reps back to back: a slow spell (other load, or the first seconds after loading)
    then spoils one round of every cell instead of every rep of a few cells. Each tier's round starts with an
    untimed forward: its first cell would otherwise pay for reloading weights the other tiers evicted from the CPU
    caches (mini's draft: 1.37 ms for one token in that position, 0.98 after a warm forward). A row may fall with
    more tokens, and is kept so: CPU matrix kernels are faster for some sizes than for smaller ones (smollm2's
    verifier at one thread: 92 ms for 2 tokens, 112 for 3, 85 for 4, fastest and median alike; mini's draft 1.26,
    1.22, 0.90), and a non-decreasing envelope had priced smollm2's 2-token forward a tenth below what it took,
    letting ``auto`` test and run γ = 1 arms that lost."""
    lengths = sorted(set(lengths))
    for tier in tiers.values():
        tier.reset(prefix + lengths[-1] + 1)
        tier.forward(torch.arange(prefix, device=tier.model.device) % 50 + 3, keep=1)
    best = {name: dict.fromkeys(lengths, math.inf) for name in tiers}
    for r in range(reps + 1):
        for name, tier in tiers.items():
            tier.forward(torch.arange(lengths[0], device=tier.model.device) % 50 + 7, keep=lengths[0])
            tier.crop(prefix)  # untimed: the round's first timed cell must not pay for another tier's evictions
            for n in lengths:
                x = torch.arange(n, device=tier.model.device) % 50 + 7
                t0 = time.perf_counter()
                tier.forward(x, keep=n)
                seconds = time.perf_counter() - t0
                tier.crop(prefix)
                if r:  # round 0 warms allocations
                    best[name][n] = min(best[name][n], seconds)
    return Costs(best)


SUBLAYER_PARTS = ("attention", "mlp", "fixed")


def measure_sublayers(verifier: torch.nn.Module, pair: str, lengths: Iterable[int] = (1,), reps: int = 5,
                      prefix: int = 64) -> dict:
    """Seconds of one attention sublayer, one MLP sublayer and the rest of the verifier's ``n``-token forward.

    Three forwards are timed: the full verifier (L attentions, L MLPs), its sublayer slim without MLPs (``a`` ×
    L) and the one that keeps only layer 0's attention (``1m…m``); c = rest + attentions·A + MLPs·M then has one
    solution. Layers of one kind are taken to cost alike (true of the uniform stacks dimr routes; sliding-window
    layers differ only at long contexts)."""
    from dimr.decoding.tiers import Tier
    from dimr.masks import SublayerMask
    from dimr.slim import num_layers, slim_verifier

    n_layers = num_layers(verifier)
    if n_layers < 2:
        raise DimrError("measuring attention and MLP apart needs a verifier of at least 2 layers")
    masks = {"full": None, "no_mlp": "a" * n_layers, "one_attention": "1" + "m" * (n_layers - 1)}
    tiers = {name: Tier("slim", verifier if key is None else slim_verifier(verifier, SublayerMask.from_key(key)))
             for name, key in masks.items()}
    t = measure(tiers, lengths, reps, prefix).table
    out: dict = {"pair": pair, "layers": n_layers, **{k: {} for k in SUBLAYER_PARTS}}
    for n in t["full"]:
        mlp = (t["full"][n] - t["no_mlp"][n]) / n_layers
        attention = (t["full"][n] - t["one_attention"][n]) / (n_layers - 1)
        out["mlp"][n], out["attention"][n] = mlp, attention
        out["fixed"][n] = t["full"][n] - n_layers * (attention + mlp)
    return out


def fit_per_layer(points: Mapping[int, float]) -> tuple[float, float]:
    """Least-squares c = fixed + per_layer · kept over (kept layers → seconds) → (fixed, per_layer)."""
    xs, ys = list(points), list(points.values())
    if len(xs) < 2:
        return float(ys[0]) if ys else float("nan"), float("nan")
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


# --- roofline -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Gpu:
    name: str
    bandwidth: float  # bytes/s of HBM
    flops: float  # dense bf16 FLOP/s
    launch: float = 8e-6  # seconds of fixed overhead per decoder layer (kernel launches, without CUDA graphs)


GPUS = {g.name: g for g in (
    Gpu("H200", 4.8e12, 989e12), Gpu("H100", 3.35e12, 989e12), Gpu("A100", 2.0e12, 312e12),
    Gpu("L4", 0.3e12, 121e12), Gpu("RTX4090", 1.0e12, 165e12),
)}


def get_gpu(name: str) -> Gpu:
    for key, gpu in GPUS.items():
        if key.lower() == name.lower():
            return gpu
    raise DimrError(f"unknown GPU {name!r}; choose one of {', '.join(GPUS)}")


def roofline_seconds(gpu: Gpu, params: float, layers: int, n: int, bytes_per_param: float = 2.0) -> float:
    """One forward of ``n`` tokens: max(weights / bandwidth, 2·params·n / peak) + per-layer launch overhead."""
    return max(params * bytes_per_param / gpu.bandwidth, 2 * params * n / gpu.flops) + layers * gpu.launch


def roofline(gpu: Gpu, tiers: Mapping[str, tuple[float, int]], lengths: Iterable[int] = range(1, 17),
             bytes_per_param: float = 2.0) -> Costs:
    """A predicted table from (parameters, decoder layers) per tier."""
    lengths = list(lengths)
    return Costs({name: {n: roofline_seconds(gpu, p, layers, n, bytes_per_param) for n in lengths}
                  for name, (p, layers) in tiers.items()}, f"roofline {gpu.name}")


def tier_size(model: torch.nn.Module) -> tuple[float, int]:
    """(parameters, decoder layers) of a model; a slim verifier counts only its kept layers."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    return float(sum(p.numel() for p in model.parameters())), len(layers) if layers is not None else 0


# --- predicting -----------------------------------------------------------------------------------------

def expected_tokens(alpha: float | tuple[float, float], gamma: int) -> float:
    """Tokens per verification of γ drafts with i.i.d. per-token acceptance α: (1 − α^(γ+1)) / (1 − α). ``alpha``
    may be (first, rest): the first draft accepted at one rate and each later one, once those before it were, at
    another (an n-gram draft, whose first token is the guess and the rest follow the matched text): 1 + first ·
    (1 − rest^γ) / (1 − rest)."""
    if isinstance(alpha, tuple):
        first, rest = alpha
        return 1.0 + first * expected_tokens(rest, gamma - 1) if gamma > 0 else 1.0
    if alpha >= 1.0:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def accepted_law(alpha: float | tuple[float, float], gamma: int) -> list[float]:
    """P(k of γ drafted tokens accepted), k = 0..γ, with :func:`expected_tokens`'s acceptance (i.i.d. α, or (first,
    rest)): the test stops at the first rejection."""
    first, rest = alpha if isinstance(alpha, tuple) else (alpha, alpha)
    out, reach = [], 1.0  # reach: P(the first k drafts accepted)
    for k in range(gamma):
        rate = first if k == 0 else rest
        out.append(reach * (1.0 - rate))
        reach *= rate
    return out + [reach]


def fill(window: int, gamma: int, alpha: float | tuple[float, float], costs: Callable[[str, int], float],
         proposer: str = "draft") -> float:
    """Expected seconds of the inner rounds of a ``hier`` block that fill a window of Γ slim tokens: each round
    drafts g = min(γ, room left) tokens (g draft forwards) and one slim forward of g + 1 checks them, yielding the
    accepted ones and one more. Exact over the round lengths (f[r]: seconds to fill r more tokens): Γ / E[tokens a
    round] misses that the last round overshoots or is cut short, and counted a fifth too few slim forwards for a
    short window (γ = 2, Γ = 4, α = 0.69: 2.26 rounds a block, against 1.85; mini measured 2.24 at T = 0.7)."""
    return fills(window, gamma, alpha, costs, proposer)[window]


def fills(window: int, gamma: int, alpha: float | tuple[float, float], costs: Callable[[str, int], float],
          proposer: str = "draft") -> list[float]:
    """:func:`fill` of every window 0..``window`` at once: f[r] depends on γ and the room left r, not on Γ, so one
    table serves every window of a γ (``auto`` prices three windows of γ = 4 at every choice)."""
    # per drafted count g: a round's seconds and (tokens it yields, probability); f[r] = 0 once r ≤ 0
    rounds = {g: (g * costs(proposer, 1) + costs("slim", g + 1), [(k + 1, p) for k, p in enumerate(accepted_law(
        alpha, g))]) for g in range(1, min(gamma, window) + 1)}
    f = [0.0] * (window + 1)
    for r in range(1, window + 1):  # plain loops: auto prices six hier arms at every choice
        seconds, law = rounds[gamma if r > gamma else r]
        for tokens, p in law:
            if r > tokens:
                seconds += p * f[r - tokens]
        f[r] = seconds
    return f


@dataclass(frozen=True)
class Sure:
    """One drafted position's rates under a draft that stops after a token it is unsure of (its own probability of
    it below a threshold; SpecDec++ and HF's assisted generation stop on the draft's confidence): ``accepted``, of a
    tested draft; ``kept``, of an accepted one, that it was sure (drafting went on after it); ``sure``, of a drafted
    one. Without the stop both of the last two are 1."""

    accepted: float
    kept: float = 1.0
    sure: float = 1.0


def stopped(first: Sure, rest: Sure, gamma: int, draft: float, verify: Callable[[int], float]) -> tuple[float, float]:
    """(expected tokens, seconds) of one block of at most γ drafts that stops after an unsure one: token k is drafted
    when the k − 1 before it were sure, and yields one when, besides, those were accepted and it is. ``draft``:
    seconds of one draft forward; ``verify(n)``: of a verification of n tokens. With both extra rates at 1 it is
    :func:`expected_tokens` of (first, rest) and γ·draft + verify(γ + 1)."""
    return reaches(first, rest, gamma, draft, verify)[gamma]


def reaches(first: Sure, rest: Sure, top: int, draft: float,
            verify: Callable[[int], float]) -> list[tuple[float, float]]:
    """:func:`stopped` of every γ = 0..``top`` in one pass: a block of γ drafts is one of γ − 1 whose blocks that
    reached draft γ draft once more (``auto`` prices six γ of each draft at every choice)."""
    out = [(1.0, verify(1))]
    tokens, going, reach, spent = 1.0, 1.0, 1.0, 0.0  # going: P(1..k-1 accepted and sure); reach: P(k drafted)
    for k in range(1, top + 1):
        rate = first if k == 1 else rest
        tokens += going * rate.accepted
        going *= rate.accepted * rate.kept
        here = k * draft + verify(k + 1)
        out.append((tokens, spent + reach * here))  # at γ = k every block that drafted k stops there
        further = reach * rate.sure
        spent += (reach - further) * here  # blocks that stop after draft k at a larger γ
        reach = further
    return out


def expected_drafts(first: Sure, rest: Sure, top: int) -> list[float]:
    """Drafts one block of at most γ makes when it stops after an unsure one, for every γ = 0..``top``:
    :func:`reaches`' seconds with a draft forward costing 1 and verification nothing."""
    return [seconds for _, seconds in reaches(first, rest, top, 1.0, lambda n: 0.0)]


@dataclass(frozen=True)
class Acceptance:
    """Per-token acceptance rates: proposer → target, e.g. ``{("draft", "full"): 0.6}``; a rate may be (first,
    rest) (:func:`expected_tokens`), or a (first, rest) of :class:`Sure` for a draft that stops when unsure (sd)."""

    rates: Mapping[tuple[str, str], float | tuple[float, float] | tuple[Sure, Sure]] = field(default_factory=dict)

    def __call__(self, proposer: str, target: str) -> float | tuple[float, float] | tuple[Sure, Sure]:
        if (proposer, target) not in self.rates:
            raise DimrError(f"no acceptance rate of {proposer} against {target}; decode with a mode that "
                            "runs that pair of tiers first")
        return self.rates[(proposer, target)]


def block(mode: str, gamma: int, acceptance: Acceptance, costs: Callable[[str, int], float], window: int = 0,
          proposer: str = "draft") -> tuple[float, float]:
    """(expected tokens, seconds) of one block of ``mode`` (ar | sd | self | lookup | hier) at γ (and Γ).

    ``costs``: c(tier, n), a :class:`Costs` or any such pricing (``auto``'s measured one). ``proposer``: the
    draft tier of ``sd`` and ``hier`` (``draft`` or ``lookup``). i.i.d. acceptance.
    """
    return blocks([(mode, gamma, window)], acceptance, costs, proposer)[0]


def blocks(specs: Sequence[tuple[str, int, int]], acceptance: Acceptance, costs: Callable[[str, int], float],
           proposer: str = "draft") -> list[tuple[float, float]]:
    """:func:`block` of each (mode, γ, Γ) in ``specs``; the hier windows of one γ share one :func:`fills` table, and
    the γ of one mode one :func:`reaches` pass. Mode ``sd~`` is sd drafting until a token the draft is unsure of,
    priced with the (first, rest) of :class:`Sure` under (``proposer`` + :data:`STOP_SUFFIX`, ``full``)."""
    top: dict[int, int] = {}
    for mode, gamma, window in specs:
        if mode == "hier":
            if window < 1:
                raise DimrError("hier needs a window of at least one token")
            top[gamma] = max(top.get(gamma, 0), window)
    inner = acceptance(proposer, "slim") if top else 0.0
    tables = {gamma: fills(window, gamma, inner, costs, proposer) for gamma, window in top.items()}
    # mode → (its drafting tier, the key of its acceptance against the full verifier); ``sd~``: sd stopping when unsure
    drafters = {"sd": (proposer, proposer), "sd~": (proposer, proposer + STOP_SUFFIX), "self": ("slim", "slim"),
                "lookup": (FREE, FREE)}
    longest: dict[str, int] = {}  # per mode, the longest γ: one pass of reaches() serves every shorter one
    for mode, gamma, _ in specs:
        if mode in drafters:
            longest[mode] = max(longest.get(mode, 0), gamma)
    chains = {mode: reaches(*_sure(acceptance(drafters[mode][1], "full")), gamma, costs(drafters[mode][0], 1),
                            lambda n: costs("full", n)) for mode, gamma in longest.items()}
    out = []
    for mode, gamma, window in specs:
        if mode == "ar":
            out.append((1.0, costs("full", 1)))
        elif mode in drafters:
            out.append(chains[mode][gamma])
        elif mode == "hier":
            tokens = expected_tokens(acceptance("slim", "full"), window)
            out.append((tokens, tables[gamma][window] + costs("full", window + 1)))
        else:
            raise DimrError(f"no speed model for mode {mode!r}; use ar, sd, self, lookup or hier")
    return out


def _sure(rate: float | tuple[float, float] | tuple[Sure, Sure]) -> tuple[Sure, Sure]:
    """An acceptance (pooled, (first, rest), or already of :class:`Sure`) as (first, rest) of :class:`Sure`."""
    if isinstance(rate, tuple):
        return rate if isinstance(rate[0], Sure) else (Sure(rate[0]), Sure(rate[1]))
    return Sure(rate), Sure(rate)


def predict(mode: str, gamma: int, acceptance: Acceptance, costs: Costs, window: int = 0,
            proposer: str = "draft") -> float:
    """Predicted tokens/s of ``mode`` at γ (and window Γ for hier): :func:`block`'s tokens / seconds."""
    tokens, seconds = block(mode, gamma, acceptance, costs, window, proposer)
    return tokens / seconds


def predict_from_counts(tokens: int, calls: Mapping[str, int], fed: Mapping[str, int], costs: Costs,
                        forwards: Mapping[str, Mapping[int, int]] | None = None, blocks: int = 0,
                        mode: str = "") -> float:
    """Tokens/s of a decode that made ``calls[tier]`` forwards feeding ``fed[tier]`` tokens in all (and ``blocks``
    blocks of ``mode``, each priced at ``costs.step(mode)`` for the work outside its forwards).

    With ``forwards`` (per tier: tokens fed in one forward → how many forwards, `DecodeStats.forwards`) each
    forward is priced at c(tier, its own tokens); without, at c(tier, mean tokens per forward). The mean
    misprices a decode whose prefill of a long prompt sits beside one-token steps: on smollm2 it priced `ar`'s
    steps at c(3.4) and predicted 0.64× the measured speed."""
    seconds = blocks * costs.step(mode) if mode else 0.0
    for t in calls:
        if forwards and forwards.get(t):
            seconds += sum(k * costs(t, n) for n, k in forwards[t].items())
        elif calls[t]:
            seconds += calls[t] * costs(t, fed[t] / calls[t])
    return tokens / seconds if seconds > 0 else math.nan


# --- the bench-forward table ----------------------------------------------------------------------------

def spread_mask(layers: int, kept: int) -> tuple[bool, ...]:
    """Keep ``kept`` of ``layers`` layers spread evenly, the first and the last always among them."""
    if not 1 <= kept <= layers:
        raise DimrError(f"cannot keep {kept} of {layers} layers; pass --kept between 1 and {layers}")
    chosen = {round(i * (layers - 1) / max(kept - 1, 1)) for i in range(kept)} if kept > 1 else {0}
    return tuple(i in chosen for i in range(layers))


def slim_tiers(verifier: torch.nn.Module, configs: Iterable[Path], kept: Iterable[int]) -> dict[str, object]:
    """Slim tiers named ``slim:<kept layers>`` from slim configs and from evenly spread masks; a sublayer slim
    is named ``slim:<its mask key>`` (its layer count says little of its cost)."""
    from dimr.decoding.tiers import Tier
    from dimr.slim import num_layers, slim_verifier
    from dimr.slim_config import apply_slim_config, load_slim_config

    models = [apply_slim_config(load_slim_config(Path(c)), verifier) for c in configs]
    models += [slim_verifier(verifier, spread_mask(num_layers(verifier), k)) for k in kept]
    out: dict[str, object] = {}
    for m in models:
        key = m.config.dimr_mask
        name = f"slim:{key}" if set(key) & {"a", "m"} else f"slim:{num_layers(m)}"
        while name in out:  # two configs keeping as many layers
            name += "'"
        out[name] = Tier("slim", m)
    return out


def format_costs(costs: Costs, layers: Mapping[str, int], predicted: Costs | None = None) -> str:
    """Markdown: ms per forward by tier and length, each length's multiple of that tier's 1-token forward,
    the fit fixed + per-layer cost over the verifier's slims, and the roofline table if given."""
    lines = []
    for table in (costs, predicted) if predicted else (costs,):
        lengths = sorted(next(iter(table.table.values())))
        lines += [f"\n{table.source}: ms per forward (multiple of the tier's 1-token forward)",
                  "| tier | layers | " + " | ".join(f"{n} tok" for n in lengths) + " |",
                  "|---|---|" + "---|" * len(lengths)]
        for name, row in table.table.items():
            cells = [f"{row[n] * 1e3:.2f} ({row[n] / row[lengths[0]]:.2f})" for n in lengths]
            lines.append(f"| {name} | {layers.get(name, '')} | " + " | ".join(cells) + " |")
    one = {layers[n]: row[min(row)] for n, row in costs.table.items()  # whole-layer slims only
           if n != "draft" and not set(n.partition(":")[2]) & {"a", "m"}}
    fixed, per_layer = fit_per_layer(one)
    if len(one) > 1:
        lines.append(f"\n1-token forward of the verifier and its slims ≈ {fixed * 1e3:.2f} ms + "
                     f"{per_layer * 1e3:.3f} ms per kept layer")
    if costs.sublayers:
        sub = costs.sublayers
        lines.append(f"\nper layer of {sub['pair']}'s verifier ({sub['layers']} layers), ms: "
                     + "; ".join(f"{n} tok: attention {sub['attention'][n] * 1e3:.3f}, MLP {sub['mlp'][n] * 1e3:.3f}, "
                                 f"rest {sub['fixed'][n] * 1e3:.3f}" for n in sorted(sub["attention"])))
    return "\n".join(lines).lstrip("\n")

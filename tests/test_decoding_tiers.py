"""The lossless modes beyond sd: n-gram drafts (``lookup``), staged three-tier speculation (``hier``) and
``auto``; and the cost model that prices them. Tiny models of every routed family (tests/test_decoding.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_decoding import FAMILIES, NEW_TOKENS, PROMPT, build_pair, check_counters
from test_decoding_dist import P_PASS, broken_accept, chi_square_p, exact_two_tokens

from dimr.decoding import DecodeConfig, modes
from dimr.decoding.auto import GAMMAS, MIN_TESTED, PRIOR, STOP, Arm, Chooser, arms, auto
from dimr.decoding.costs import GPUS, Acceptance, Costs, fill, predict, predict_from_counts, roofline
from dimr.decoding.decoder import Decoder
from dimr.decoding.proposer import ModelProposer, NgramIndex, NgramProposer, lookup, lookup_match
from dimr.decoding.sampling import Sampler
from dimr.decoding.sequence import Output
from dimr.decoding.shared import SharedPrefix, first_skipped_of
from dimr.decoding.stats import DecodeStats
from dimr.decoding.tiers import Tier
from dimr.masks import SublayerMask
from dimr.slim import decoder_layers, slim_verifier


def draft_blocks(rate: float, n: int, gamma: int = 4, pair: tuple[str, str] = ("draft", "full"),
                 seed: int = 0) -> list[modes.Observation]:
    """``n`` blocks of ``gamma`` drafts of a model-drafted ``pair``, each draft accepted i.i.d. at ``rate`` (seeded
    draws): one observation a block, as ``auto`` files them (each block's first draft apart from the rest)."""
    import random

    rng, out = random.Random(seed), []
    for _ in range(n):
        k = 0
        while k < gamma and rng.random() < rate:
            k += 1
        out.append((*pair, k, min(k + 1, gamma)))
    return out


def lookup_blocks(first: float, rest: float, n: int, ngram: int = 0) -> list[modes.Observation]:
    """``n`` n-gram draft blocks of two drafted tokens, as ``auto`` files them after a match of ``ngram`` tokens
    (0: the pooled key): the first token accepted in a share ``first`` of them, the second in ``rest`` of those,
    spread evenly (old evidence fades: a run of rejections first would count for less)."""
    from dimr.decoding.auto import _by_match

    blocks, firsts = [], 0  # firsts: blocks whose first token was accepted so far
    for i in range(n):
        if math.floor((i + 1) * first) == math.floor(i * first):
            blocks.append(("lookup", "full", 0, 1))
            continue
        firsts += 1
        both = math.floor(firsts * rest) > math.floor((firsts - 1) * rest)
        blocks.append(("lookup", "full", 2 if both else 1, 2))
    return _by_match(blocks, ngram)


@pytest.fixture(scope="module", params=FAMILIES)
def decoder(request) -> Decoder:
    verifier, draft = build_pair(request.param)
    return Decoder.from_models(verifier, draft, slim_verifier(verifier, (True, False, True, True)))


# --- n-gram proposer ------------------------------------------------------------------------------------

def test_lookup_proposes_what_the_prompt_contains():
    ids = torch.tensor([10, 2, 3, 4, 11, 3, 5, 2, 3])
    assert lookup(ids, 3).tolist() == [4, 11, 3]  # the longest suffix n-gram that occurred: (2, 3)
    assert lookup(ids, 3, max_ngram=1).tolist() == [5, 2, 3]  # (3,): its latest earlier occurrence
    assert lookup(ids, 8).tolist() == [4, 11, 3, 5, 2, 3]  # as much as there is
    assert lookup(torch.tensor([1, 2, 3, 4]), 3).numel() == 0  # nothing repeats
    assert lookup_match(ids, 3)[1] == 2 and lookup_match(ids, 3, max_ngram=1)[1] == 1
    assert lookup_match(torch.tensor([1, 2, 3, 4]), 3)[1] == 0
    tokens, probs, _ = NgramProposer(12).propose(ids, 2, Sampler(), None)
    assert tokens.tolist() == [4, 11] and probs.argmax(-1).tolist() == [4, 11] and probs.sum().item() == 2


def test_ngram_index_matches_the_search_as_the_sequence_grows_or_changes():
    generator = torch.Generator().manual_seed(0)
    index, mismatches, matched = NgramIndex(), 0, 0
    for vocab in (4, 30):  # a new sequence (not an extension of the last): indexed afresh
        ids = torch.randint(0, vocab, (120,), generator=generator)
        for length in [*range(1, 121, 3), 50, 120]:  # grown by several tokens at once, then cut back
            for gamma in (1, 8):
                want, got = lookup_match(ids[:length], gamma), index.match(ids[:length], gamma)
                mismatches += want[1] != got[1] or want[0].tolist() != got[0].tolist()
                matched += want[1] > 0
    assert mismatches == 0 and matched > 50
    assert NgramIndex(max_ngram=1).match(torch.tensor([10, 2, 3, 4, 11, 3, 5, 2, 3]), 3)[0].tolist() == [5, 2, 3]


# --- greedy: every lossless mode reproduces ar -----------------------------------------------------------

@pytest.mark.parametrize("gamma,window", [(2, 3), (3, 6)])
def test_greedy_lookup_hier_auto_equal_ar(decoder: Decoder, gamma: int, window: int):
    config = DecodeConfig(max_new_tokens=NEW_TOKENS, gamma=gamma, window=window)
    ar = decoder.run(PROMPT, "ar", config)
    decoder.costs = Costs({t: {1: 1.0, 17: 1.0 + 0.05 * 16} for t in ("draft", "slim", "full")}, "test")
    decoder.choosers = {}
    for mode in ("lookup", "hier", "auto"):
        result = decoder.run(PROMPT, mode, config)
        assert result.tokens == ar.tokens, mode
        check_counters(result.stats)
    hier = decoder.run(PROMPT, "hier", config).stats
    assert hier.calls["full"] == hier.blocks < NEW_TOKENS and hier.calls["slim"] > hier.blocks
    assert hier.accepted > 0 and hier.rejected > 0  # the window is sometimes kept, sometimes cut


# --- sampled: n-gram blocks draw the verifier's own token at each position: ar's text --------------------

REPEATS = torch.cat([PROMPT, PROMPT, PROMPT[:3]])  # matches of every length: drafts accepted and rejected


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (2.0, 0.9)])
def test_sampled_lookup_and_auto_of_ar_and_lookup_emit_ar_text(decoder: Decoder, temperature: float, top_p: float,
                                                                monkeypatch):
    """With one seed, sampled ``lookup`` emits ``ar``'s tokens one for one (the verifier draws each position's token
    at that position's own uniform, whichever block it is in), and so does ``auto`` choosing among ar and n-gram
    arms. Checked by rejection sampling on the decode's sequential stream instead, the n-gram drafts give another
    sample of the same law."""
    costs = Costs({t: {1: 1.0, 9: 1.1} for t in ("draft", "slim", "full")}, "test")
    accepted, rejected, ran = 0, 0, set()
    for seed in range(4):
        config = DecodeConfig(max_new_tokens=NEW_TOKENS, gamma=3, temperature=temperature, top_p=top_p, seed=seed)
        ar = decoder.run(REPEATS, "ar", config).tokens
        look = decoder.run(REPEATS, "lookup", config)
        assert look.tokens == ar, seed
        accepted, rejected = accepted + look.stats.accepted, rejected + look.stats.rejected
        chooser = Chooser(costs, [Arm("ar"), Arm("lookup", 1), Arm("lookup", 4)], adapt=False)
        trace: list = []
        mixed = auto(chooser, decoder.full, decoder.draft, decoder.slim, REPEATS, config, decoder.vocab_size, trace)
        assert mixed.tokens == ar, seed
        ran |= {a.mode for a, *_ in trace}
    assert accepted > 0 and rejected > 0 and ran == {"ar", "lookup"}
    # the same n-gram drafts checked by rejection sampling on the decode's sequential stream: another sample
    monkeypatch.setattr(NgramProposer, "one_hot", False)
    assert any(decoder.run(REPEATS, "lookup", DecodeConfig(max_new_tokens=NEW_TOKENS, gamma=3, temperature=temperature,
                                                           top_p=top_p, seed=seed)).tokens
               != decoder.run(REPEATS, "ar", DecodeConfig(max_new_tokens=NEW_TOKENS, temperature=temperature,
                                                          top_p=top_p, seed=seed)).tokens for seed in range(4))


# --- sampled hier: the verifier's law; a broken acceptance rule is caught ---------------------------------

DIST_PROMPT = torch.tensor([3, 7, 5, 4])
RUNS = 800


@pytest.fixture(scope="module")
def three_tiers():
    """8-token vocabulary; a 3-layer verifier, its slim (layer 1 skipped), and a draft with a rolled head."""
    verifier, draft = build_pair("llama", layers=3, vocab=8, head_scale=1.0, seed=3)
    with torch.no_grad():
        draft.lm_head.weight.copy_(torch.roll(verifier.lm_head.weight, 1, 0))
    return verifier, slim_verifier(verifier, (True, False, True)), draft


def sampled_two_tokens_hier(verifier, slim, draft, config: DecodeConfig, accept) -> np.ndarray:
    full, slim_tier, proposer = Tier("full", verifier), Tier("slim", slim), ModelProposer(Tier("draft", draft))
    counts = np.zeros((8, 8))
    for seed in range(RUNS):  # windows of 1 and 2 with γ of 1: every stage accepts, rejects and bonuses
        cfg = DecodeConfig(**{**config.__dict__, "seed": seed, "gamma": 1, "window": 1 + seed % 2,
                              "max_new_tokens": 2})
        t1, t2 = modes.hier(proposer, slim_tier, full, DIST_PROMPT, cfg, accept=accept).tokens
        counts[t1, t2] += 1
    return counts


def test_sampled_hier_reproduces_verifier(three_tiers, monkeypatch):
    import test_decoding_dist

    verifier, slim, draft = three_tiers
    config = DecodeConfig(temperature=1.0)
    monkeypatch.setattr(test_decoding_dist, "PROMPT", DIST_PROMPT)
    exact = exact_two_tokens(verifier, config.sampler)
    counts = sampled_two_tokens_hier(verifier, slim, draft, config, modes.verify.accept)
    assert chi_square_p(counts, exact) > P_PASS, 0.5 * np.abs(counts / RUNS - exact).sum()
    broken = sampled_two_tokens_hier(verifier, slim, draft, config, broken_accept)
    assert chi_square_p(broken, exact) < P_PASS


# --- auto ------------------------------------------------------------------------------------------------

def test_auto_with_one_arm_is_that_mode(decoder: Decoder):
    """auto runs the chosen mode's own blocks on the same random stream: with one arm it is that mode (a stop arm
    is sd with the draft's stop when unsure that auto sets, ``--draft-stop``)."""
    config = DecodeConfig(max_new_tokens=NEW_TOKENS, gamma=3, window=5, temperature=0.8, top_p=0.9, seed=5)
    costs = Costs({t: {1: 1.0} for t in ("draft", "slim", "full")}, "test")
    for arm, mode in ((Arm("sd", 3), "sd"), (Arm("sd", 3, stop=True), "sd"), (Arm("hier", 3, 5), "hier"),
                      (Arm("lookup", 3), "lookup"), (Arm("ar"), "ar")):
        result = auto(Chooser(costs, [arm]), decoder.full, decoder.draft, decoder.slim, PROMPT, config,
                      decoder.vocab_size)
        fixed = DecodeConfig(**{**config.__dict__, "draft_stop": STOP if arm.stop else 0.0})
        assert result.tokens == decoder.run(PROMPT, mode, fixed).tokens, mode


@torch.inference_mode()
def test_auto_emits_what_the_chosen_mode_emits(decoder: Decoder):
    """Every block of a mixed sampled auto decode, replayed from its sequence and random state with the
    block function of the mode it chose (a stop arm's: sd's with the draft's stop when unsure), emits the same
    tokens."""
    config = DecodeConfig(max_new_tokens=NEW_TOKENS, gamma=3, temperature=0.8, seed=2)
    costs = Costs({"full": {1: 1.0, 9: 1.2}, "draft": {1: 0.3}, "slim": {1: 0.6, 9: 0.8}}, "test")
    # γ = 1 arms: open before any acceptance
    arms = [Arm("ar"), Arm("sd", 1), Arm("sd", 2), Arm("sd", 2, stop=True), Arm("self", 1), Arm("self", 3),
            Arm("lookup", 1), Arm("lookup", 4), Arm("hier", 1, 1), Arm("hier", 2, 4)]
    chooser = Chooser(costs, arms, adapt=False)  # the made-up table alone decides, so that the modes mix
    trace: list = []
    auto(chooser, decoder.full, decoder.draft, decoder.slim, PROMPT, config, decoder.vocab_size, trace)
    assert len({arm.mode for arm, *_ in trace}) >= 2  # the decode really mixed modes
    fresh = Decoder.from_models(decoder.full.model, decoder.draft.model, decoder.slim.model)
    for arm, ids, state, emitted in trace:
        left = config.max_new_tokens - (ids.numel() - PROMPT.numel())
        out = Output(ids, DecodeConfig(**{**config.__dict__, "max_new_tokens": left}), DecodeStats("replay"),
                     [fresh.full, fresh.draft, fresh.slim])
        generator = torch.Generator().set_state(state)
        if arm.mode == "ar":
            modes.ar_block(fresh.full, out, generator)
        elif arm.mode == "hier":
            modes.hier_block(ModelProposer(fresh.draft), fresh.slim, fresh.full, out, arm.gamma, arm.window,
                             generator)
        else:
            proposer = {"sd": ModelProposer(fresh.draft), "self": ModelProposer(fresh.slim),
                        "lookup": NgramProposer(decoder.vocab_size)}[arm.mode]
            modes.sd_block(proposer, fresh.full, out, arm.gamma, generator, stop=chooser.stop * arm.stop)
        assert out.new == emitted, arm


def test_auto_keeps_one_chooser_per_temperature(decoder: Decoder):
    """A decoder serving greedy and sampled requests keeps each temperature's acceptance counts apart: a
    sampled decode leaves the greedy chooser's counts as they were, and a new temperature starts from none."""
    decoder.costs = Costs({t: {1: 1.0, 17: 1.8} for t in ("draft", "slim", "full")}, "test")
    decoder.choosers = {}
    greedy = DecodeConfig(max_new_tokens=NEW_TOKENS)
    decoder.run(PROMPT, "auto", greedy)
    learned = {pair: list(c) for pair, c in decoder.auto_chooser(0.0).counts.items()}
    assert sum(map(sum, learned.values())) > 0
    assert not decoder.auto_chooser(0.7).counts  # not what the greedy decode saw
    decoder.run(PROMPT, "auto", DecodeConfig(max_new_tokens=NEW_TOKENS, temperature=0.7, seed=1))
    assert sum(map(sum, decoder.auto_chooser(0.7).counts.values())) > 0
    assert decoder.auto_chooser(0.0).counts == learned and set(decoder.choosers) == {0.0, 0.7}
    assert decoder.run(PROMPT, "auto", greedy).tokens == decoder.run(PROMPT, "ar", greedy).tokens


def test_auto_prefers_the_arm_the_costs_favour():
    costs = Costs({"full": {1: 1.0, 17: 1.0}, "draft": {1: 0.01}, "slim": {1: 0.5}}, "test")
    chooser = Chooser(costs, [Arm("ar"), Arm("sd", 8)])
    import random

    rng = random.Random(0)
    chooser.observe([("draft", "full", 900, 1000)])  # α = 0.9 with free verification: sd wins
    assert {chooser.choose(rng, {"draft": 0, "slim": 0}).mode for _ in range(20)} == {"sd"}
    chooser.counts = {}
    chooser.observe([("draft", "full", 0, 1000)])  # α = 0: ar wins
    assert {chooser.choose(rng, {"draft": 0, "slim": 0}).mode for _ in range(20)} == {"ar"}


def test_auto_runs_the_arm_of_highest_speed_at_its_draws():
    """Each choice is the arm of most tokens/s by :func:`block` at the drawn acceptance (the draws redone here with
    a copy of the chooser's generator, in its order): the chooser prices all arms in one pass, hier's windows of
    one γ from one fill table, and must pick what pricing each arm alone picks."""
    import random

    from dimr.decoding.auto import INNER, PAIRS, SURE_PRIOR, part, sure_key, within_band
    from dimr.decoding.costs import Sure, block, blocks

    costs = Costs({"full": {1: 1.0, 5: 1.3, 17: 2.5}, "draft": {1: 0.08}, "slim": {1: 0.3, 5: 0.45, 17: 1.0}},
                  "test")
    chooser = Chooser(costs, arms(True, True), nap=0)  # every mode priced at every choice (napping: below)
    chooser.counts = {("draft", "full"): [20.0, 12.0], ("slim", "full"): [40.0, 3.0], INNER: [24.0, 4.0],
                      part(("draft", "full"), False): [6.0, 6.0], part(("draft", "full"), True): [14.0, 6.0],
                      part(("slim", "full"), False): [10.0, 1.0], part(("slim", "full"), True): [30.0, 2.0],
                      part(INNER, False): [8.0, 2.0], part(INNER, True): [16.0, 2.0],
                      ("lookup", "full"): [5.0, 30.0], ("lookup+", "full"): [5.0, 5.0]}
    sd = ("draft", "full")
    for key, first, rest in ((sure_key(sd, True), [3.0, 3.0], [10.0, 4.0]),
                             (sure_key(sd, False), [4.0, 8.0], [12.0, 6.0])):
        chooser.counts[part(key, False)], chooser.counts[part(key, True)] = first, rest
    rng, picked = random.Random(3), set()
    for _ in range(60):
        twin = random.Random()
        twin.setstate(rng.getstate())
        rates = {pair: chooser.lookup_means(0) if pair == ("lookup", "full") else tuple(twin.betavariate(
            chooser.counts[key][0] + PRIOR[0], chooser.counts[key][1] + PRIOR[1])
            for key in (part(pair, False), part(pair, True))) for pair in PAIRS}
        rates[INNER] = within_band(rates[INNER], rates[("draft", "full")], rates[("slim", "full")])
        # the stop arms' draft stops when unsure (Chooser.stop): its rates of sure drafts, of the accepted and of all
        kept, sure = ([twin.betavariate(chooser.counts[part(sure_key(sd, k), r)][0] + SURE_PRIOR[0],
                                        chooser.counts[part(sure_key(sd, k), r)][1] + SURE_PRIOR[1])
                       for r in (False, True)] for k in (True, False))
        stopping = {**rates, sd: (Sure(rates[sd][0], kept[0], sure[0]), Sure(rates[sd][1], kept[1], sure[1]))}
        speed = {a: (lambda tokens, seconds: tokens / seconds)(*block(
            a.mode, a.gamma, Acceptance(stopping if a.stop else rates), costs, a.window)) for a in chooser.arms}
        arm = chooser.choose(rng, {"draft": 0, "slim": 0})
        assert not chooser.probing and speed[arm] == max(speed.values())
        picked.add(arm.label)
    assert {label.partition("/")[0] for label in picked} >= {"sd", "self", "hier"}  # the draws move the best arm
    assert any(label.endswith("~") for label in picked)
    specs = [(a.mode, a.gamma, a.window) for a in chooser.arms]  # windows of one γ: 2/4 with 2/8, 4/8 with 4/12, 4/16
    assert blocks(specs, Acceptance(rates), costs) == [block(m, g, Acceptance(rates), costs, w) for m, g, w in specs]


def test_auto_naps_modes_its_draws_price_far_below_the_best():
    """A model-drafted mode whose best arm the draws price below DORMANT × the best arm's sits out the next NAP
    choices unpriced, then is priced again: the slim's modes lose by far while the slim costs 10× its table; made
    nearly free, they win the first choice with every mode priced, and the NAP + 1-th with napping."""
    import random

    from dimr.decoding.auto import NAP

    costs = Costs({"full": {1: 1.0, 5: 1.3, 17: 2.5}, "draft": {1: 0.08}, "slim": {1: 0.3, 5: 0.45, 17: 1.0}},
                  "test")
    for nap in (NAP, 0):
        chooser = Chooser(costs, arms(True, True), adapt=False, nap=nap)
        chooser.observe(draft_blocks(0.7, 300) + draft_blocks(0.95, 300, pair=("slim", "full"))
                        + draft_blocks(0.9, 300, pair=("draft", "slim")))
        chooser.scale["slim"], rng = 10.0, random.Random(0)
        assert chooser.choose(rng, {"draft": 0, "slim": 0}).mode == "sd"
        chooser.scale["slim"] = 0.01
        modes = [chooser.choose(rng, {"draft": 0, "slim": 0}).mode for _ in range(NAP + 1)]
        slim = [i for i, mode in enumerate(modes) if mode in ("self", "hier")]
        assert slim and slim[0] == (NAP if nap else 0)


def test_auto_prices_by_measured_time():
    """A tier that runs slower than its table entry is priced at what it measured: the table says sd wins,
    the measured draft (here 5× its entry at every forward) makes ar win."""
    import random

    costs = Costs({"full": {1: 1.0, 5: 1.2}, "draft": {1: 0.1}}, "test")
    chooser = Chooser(costs, [Arm("ar"), Arm("sd", 4)], stop=0.0)  # every block drafts γ
    chooser.observe(draft_blocks(0.7, 300))
    rng = random.Random(0)
    assert {chooser.choose(rng, {"draft": 0}).mode for _ in range(20)} == {"sd"}
    for _ in range(40):  # per block 4 draft forwards of 1 token, each taking 5 × its 0.1 s
        chooser.observe_forwards("draft", [(1, 0.5)] * 4)
    chooser.observe_forwards("draft", [(1, 100.0)])  # clipped: one stall moves the ratio by at most RATE·(5 − r)
    assert 4.9 < chooser.scale["draft"] <= 5.0
    chooser.observe_forwards("full", [(5, 1.2)])  # exactly the table: the full tier's factor stays 1
    assert chooser.scale["full"] == chooser.scale[("full", 5)] == 1.0
    # sd/4 now: 4 · 0.5 + 1.2 = 3.2 s for (1 − 0.7⁵)/0.3 ≈ 2.77 tokens < ar's 1 token/s
    assert {chooser.choose(rng, {"draft": 0}).mode for _ in range(20)} == {"ar"}
    off = Chooser(costs, [Arm("ar"), Arm("sd", 4)], adapt=False)
    off.observe_forwards("draft", [(1, 0.5)] * 4)
    assert off.scale == {}


def test_auto_times_steps_not_prefills_and_one_stall_moves_little():
    """A forward longer than any block's (the prompt's prefill) is not timed; one forward 100× its entry (a cold
    cache) moves a ratio by RATE at most; a tier that keeps running 3× its entry still gets there."""
    from dimr.decoding.auto import OBSERVED, RATE

    chooser = Chooser(Costs({"full": {1: 1.0, 64: 2.0}}, "test"), [Arm("ar")])
    chooser.observe_forwards("full", [(OBSERVED + 1, 50.0)])
    assert chooser.scale == {}
    chooser.observe_forwards("full", [(1, 100.0)])
    assert chooser.scale["full"] == chooser.scale[("full", 1)] == pytest.approx(1 + RATE)
    chooser.observe_forwards("full", [(1, 3.0)] * 60)
    assert chooser.scale[("full", 1)] == pytest.approx(3.0, rel=0.02)


def test_auto_prices_each_forward_size_by_its_own_measurements():
    """A table right about one-token steps but 2× too cheap for a 5-token verification: sd/4 looks best by the
    table, and after the measured forwards of both sizes ar wins, where a single per-tier factor would not
    see it (one-token forwards dominate the count)."""
    import random

    costs = Costs({"full": {1: 1.0, 5: 1.2}, "draft": {1: 0.1}}, "test")
    chooser = Chooser(costs, [Arm("ar"), Arm("sd", 4)], stop=0.0)  # every block drafts γ
    chooser.observe(draft_blocks(0.5, 300))  # α = 0.5: sd/4 ≈ 1.94 tokens in 1.6 s by the table
    rng = random.Random(0)
    assert {chooser.choose(rng, {"draft": 0}).mode for _ in range(20)} == {"sd"}
    for _ in range(100):
        chooser.observe_forwards("full", [(1, 1.0)] * 9 + [(5, 2.4)])
        chooser.observe_forwards("draft", [(1, 0.1)])
    assert chooser.price("full", 5) == pytest.approx(2.4, rel=1e-3) and chooser.price("full", 1) == 1.0
    assert chooser.price("full", 3) == pytest.approx(costs("full", 3) * chooser.scale["full"])  # unseen size
    assert {chooser.choose(rng, {"draft": 0}).mode for _ in range(20)} == {"ar"}  # 1.94 tokens in 2.8 s


def test_auto_prices_a_forward_size_it_stopped_running_as_its_tier_runs_now():
    """sd/4's 5-token verification was last timed in a slow spell (2× the table), so sd/2 runs; while sd/2's 3-token
    forwards run at the table's price the 5-token ratio fades toward the tier's, and sd/4, the faster at equal
    prices, wins again. Kept as last timed (FADE = 0, the rule before), sd/2 runs on."""
    import random

    from dimr.decoding import auto

    costs = Costs({"full": {1: 1.0, 3: 1.0, 5: 1.0}, "draft": {1: 0.05}}, "test")
    rng = random.Random(0)
    for fade, after in ((auto.FADE, "sd/4"), (0.0, "sd/2")):
        chooser = Chooser(costs, [Arm("sd", 2), Arm("sd", 4)], scale={"full": 1.0, ("full", 3): 1.0, ("full", 5): 2.0})
        chooser.observe([("draft", "full", 8000, 10000)])  # α = 0.8: sd/4 3.36 tokens, sd/2 2.44
        assert chooser.choose(rng, {"draft": 0}).label == "sd/2"  # 2.44 tokens in 1.1 s; sd/4's in 2.2 s
        auto.FADE, saved = fade, auto.FADE
        try:
            for _ in range(300):
                chooser.observe_forwards("full", [(3, 1.0)])
        finally:
            auto.FADE = saved
        assert chooser.price("full", 3) == pytest.approx(1.0)
        assert chooser.price("full", 5) == (pytest.approx(1.0, rel=0.01) if fade else 2.0)
        assert chooser.choose(rng, {"draft": 0}).label == after  # sd/4: 3.36 tokens in 1.2 s


def test_auto_prices_the_work_outside_forwards(decoder: Decoder):
    """Free verification makes lookup/4 at α = 0.5 (1.94 tokens a block) beat ar (1 token) by the table; a
    measured 2 s per lookup block of 5 verified tokens outside its forwards (1.94 tokens in 3 s) makes ar win;
    that time is priced per verified token, so a shorter γ can still win. A decode records that time per mode it ran."""
    import random

    costs = Costs({"full": {1: 1.0, 17: 1.0}}, "test")
    chooser = Chooser(costs, [Arm("ar"), Arm("lookup", 4)])
    chooser.observe(lookup_blocks(0.5, 0.5, 1000, ngram=2))
    rng = random.Random(0)
    assert {chooser.choose(rng, {}, 4, ngram=2).mode for _ in range(20)} == {"lookup"}
    chooser.observe_overhead("lookup", 2.0, verified=5)  # 0.4 s per verified token: 2 s for a block of 4 + 1
    chooser.observe_overhead("ar", -1.0)  # a clock's jitter: never a negative cost
    assert chooser.overhead == {"lookup": pytest.approx(0.4), "ar": 0.0}
    assert {chooser.choose(rng, {}, 4, ngram=2).mode for _ in range(20)} == {"ar"}
    # Priced per verified token (0.2 s): lookup/1 (1.5 tokens in 1 + 0.4 s) beats ar (1 token in 1 s), which
    # beats lookup/4 (1.94 tokens in 1 + 1 s); priced per block (1 s, as measured on blocks of 5) ar would win.
    short = Chooser(costs, [Arm("ar"), Arm("lookup", 1), Arm("lookup", 4)], counts=dict(chooser.counts),
                    overhead={"lookup": 0.2, "ar": 0.0}, local={k: list(v) for k, v in chooser.local.items()})
    assert {short.choose(rng, {}, 4, ngram=2).label for _ in range(20)} == {"lookup/1"}
    off = Chooser(costs, [Arm("ar")], adapt=False)
    off.observe_overhead("ar", 1.0)
    assert off.overhead == {}
    live = Chooser(Costs({t: {1: 1.0, 17: 1.0} for t in ("draft", "slim", "full")}, "test"), arms(True, True))
    auto(live, decoder.full, decoder.draft, decoder.slim, PROMPT, DecodeConfig(max_new_tokens=NEW_TOKENS),
         decoder.vocab_size)
    assert {label.partition("/")[0] for label in live.chosen} <= set(live.overhead)
    assert all(v >= 0 for v in live.overhead.values())


def test_auto_keeps_the_choice_out_of_the_modes_step_work(decoder: Decoder, monkeypatch):
    """Every arm pays the choice alike: a choice that takes 0.2 s must not enter the mode's step work, which
    prices each verified token (it had made every longer γ dearer by the choosing time of a short one)."""
    import time

    real = Chooser.choose

    def slow(self, *a, **k):
        time.sleep(0.2)
        return real(self, *a, **k)

    monkeypatch.setattr(Chooser, "choose", slow)
    chooser = Chooser(Costs({t: {1: 1.0, 17: 1.0} for t in ("draft", "slim", "full")}, "test"), [Arm("sd", 2)])
    auto(chooser, decoder.full, decoder.draft, decoder.slim, PROMPT, DecodeConfig(max_new_tokens=8),
         decoder.vocab_size)
    assert 0 < chooser.overhead["sd"] < 0.2 / 3 / 4  # a quarter of what the sleep alone would add per token


def test_auto_drafts_no_longer_than_its_evidence_allows():
    """With free drafting and verification every sd arm beats ar, and the longest the most: a cold chooser
    still only drafts 1 token (nothing accepted yet), and γ grows with the tokens seen accepted."""
    import random

    costs = Costs({"full": {1: 1.0, 17: 1.0}, "draft": {1: 0.0}}, "test")
    chooser = Chooser(costs, [Arm("ar")] + [Arm("sd", g) for g in (1, 2, 4, 8)])
    rng = random.Random(0)
    assert {chooser.choose(rng, {"draft": 0}).label for _ in range(20)} == {"sd/1"}
    chooser.observe([("draft", "full", 3, 8)])
    assert {chooser.choose(rng, {"draft": 0}).label for _ in range(20)} == {"sd/4"}
    chooser.observe([("draft", "full", 5, 5)])
    assert {chooser.choose(rng, {"draft": 0}).label for _ in range(20)} == {"sd/8"}


def test_auto_tries_a_mode_that_only_pays_at_a_long_gamma():
    """Verifying 2 tokens costs 1.9 single steps and 5 tokens no more: sd/1 never beats ar (2 tokens in 1.9 s at
    best), sd/4 beats it whenever α > 0.5. A chooser that saw 2 of 8 drafted tokens accepted still tries sd, at
    the γ its evidence allows."""
    import random

    costs = Costs({"full": {1: 1.0, 2: 1.9, 17: 1.9}, "draft": {1: 0.0}}, "test")
    chooser = Chooser(costs, [Arm("ar"), Arm("sd", 1), Arm("sd", 4)], stop=0.0)  # every block drafts γ
    rng = random.Random(0)
    chooser.observe([("draft", "full", 2, MIN_TESTED)])
    labels = [chooser.choose(rng, {"draft": 0}).label for _ in range(200)]
    assert "sd/1" in labels and "sd/4" not in labels and labels.count("ar") > labels.count("sd/1")
    chooser.observe(draft_blocks(0.75, 150))  # α = 0.75 seen: sd/4 runs
    assert {chooser.choose(rng, {"draft": 0}).label for _ in range(20)} == {"sd/4"}


def test_auto_tests_each_model_draft_before_the_draws_decide():
    """mini's draft on greedy code (accepted 0.74 of the time) was rejected on its first three tokens; its draws
    then stayed below the n-gram arm's and sd never ran again. Each model-drafted pair now runs at γ = 1 until
    it has been tested on MIN_TESTED tokens, if its mode could win at all; the n-gram proposer, seen after every
    block, is not probed."""
    import random

    costs = Costs({"full": {1: 1.0, 17: 1.0}, "draft": {1: 0.1}, "slim": {1: 0.05}}, "test")
    chooser = Chooser(costs, arms(draft=True, slim=True))
    chooser.observe([("lookup", "full", 60, 80), ("draft", "full", 0, 3)])
    rng = random.Random(0)
    assert {chooser.choose(rng, {"draft": 0, "slim": 0}, 8).label for _ in range(20)} == {"sd/1"}
    assert chooser.probing
    chooser.observe([("draft", "full", 0, MIN_TESTED - 3)])
    assert {chooser.choose(rng, {"draft": 0, "slim": 0}, 8).label for _ in range(20)} == {"self/1"}
    chooser.observe([("slim", "full", 0, MIN_TESTED)])  # both tested: the draws decide, and they favour lookup
    assert {chooser.choose(rng, {"draft": 0, "slim": 0}, 8).mode for _ in range(20)} == {"lookup"}
    assert not chooser.probing
    two = Chooser(costs, [Arm("ar"), Arm("sd", 4)])  # no γ = 1 arm to probe with: the draws decide from the start
    two.observe([("draft", "full", 0, 3)])
    assert {two.choose(rng, {"draft": 0}).label for _ in range(20)} == {"ar"}
    # A slim as dear as the full verifier cannot beat ar even if always accepted (9 tokens in 8 + 1 s at γ = 8):
    # never probed, and with no evidence its draws (mean 1/3) leave it to ar.
    dear = Chooser(Costs({"full": {1: 1.0, 17: 1.0}, "slim": {1: 1.0}}, "test"), [Arm("ar")] + [
        Arm("self", g) for g in (1, 2, 4, 8)])
    assert {dear.choose(rng, {"slim": 0}).label for _ in range(20)} == {"ar"} and not dear.probing


def test_auto_tests_a_pair_at_the_gamma_its_accepted_drafts_allow():
    """A test of a model draft starts at γ = 1 and grows as an adaptive draft length does: to 1 + the drafts seen
    accepted, and never past the tokens the test still needs; a rejected start keeps it at γ = 1. (At γ = 1 a test
    of eight accepted drafts took eight blocks.)"""
    import random

    costs = Costs({"full": {1: 1.0, 17: 1.0}, "draft": {1: 0.1}}, "test")
    chooser = Chooser(costs, [Arm("ar")] + [Arm("lookup", 8)] + [Arm("sd", g) for g in GAMMAS])
    chooser.observe([("lookup", "full", 60, 80)])  # the n-gram arm wins at the means: sd is tested
    rng = random.Random(0)
    assert chooser.choose(rng, {"draft": 0}, 8).label == "sd/1" and chooser.probing
    chooser.observe([("draft", "full", 1, 1)])
    assert chooser.choose(rng, {"draft": 0}, 8).label == "sd/2" and chooser.probing
    chooser.observe([("draft", "full", 2, 2)])  # 3 of 3 accepted: γ ≤ 4, but 5 tokens are left to test
    assert chooser.choose(rng, {"draft": 0}, 8).label == "sd/4" and chooser.probing
    chooser.observe([("draft", "full", 2, 3)])  # 6 tested: two tokens left to test
    assert chooser.choose(rng, {"draft": 0}, 8).label == "sd/2" and chooser.probing
    cold = Chooser(costs, chooser.arms)
    cold.observe([("lookup", "full", 60, 80), ("draft", "full", 0, 1)])
    assert cold.choose(rng, {"draft": 0}, 8).label == "sd/1" and cold.probing


def test_auto_revisits_the_decision_not_to_test_after_min_tested_tokens():
    """Whether to test a pair turns on the posterior means, which one block barely moves; pricing every arm at
    them before each block cost as much as the choice itself. A decision not to test stands until MIN_TESTED
    more tokens have been emitted (``remaining`` fell by that much), then is made again."""
    import random

    costs = Costs({"full": {1: 1.0, 17: 1.0}, "draft": {1: 0.5}}, "test")  # sd/1: 0.89 tok/s at 1/3, 1.33 at 1
    chooser = Chooser(costs, [Arm("ar"), Arm("sd", 1), Arm("lookup", 8)])
    chooser.observe([("lookup", "full", 190, 200)])  # n-gram drafts accepted on earlier prompts
    chooser.new_prompt()  # this prompt's n-gram posterior starts from them: lookup/8 wins by far
    rng = random.Random(0)
    assert chooser.choose(rng, {"draft": 0}, 8, 0, 40).mode == "lookup" and not chooser.probing
    chooser.observe([("lookup", "full", 0, 100)])  # this prompt stops repeating: sd could now win if tested
    chooser.choose(rng, {"draft": 0}, 8, 0, 39)
    assert not chooser.probing  # 1 token after the decision: it stands
    assert chooser.choose(rng, {"draft": 0}, 8, 0, 40 - MIN_TESTED).label == "sd/1" and chooser.probing


def test_auto_revisits_a_standing_decision_not_to_test_ever_later_on_a_prompt():
    """A decision not to test that holds is revisited after MIN_TESTED tokens, then after twice as many each time
    (8, 16, 32…: a pair never worth a test is not priced at the means every 8 tokens); each prompt starts again."""
    import random

    costs = Costs({"full": {1: 1.0, 17: 1.0}, "draft": {1: 0.5}}, "test")
    chooser = Chooser(costs, [Arm("ar"), Arm("sd", 1), Arm("lookup", 8)])
    chooser.observe([("lookup", "full", 190, 200)])  # lookup/8 wins by far: sd is not worth a test
    rng, now, checked, probe = random.Random(0), [0], [], chooser._probe
    chooser._probe = lambda *a: (checked.append(now[0]), probe(*a))[1]
    for _ in range(2):
        chooser.new_prompt()
        for now[0] in range(64, 0, -1):
            assert chooser.choose(rng, {"draft": 0}, 8, 0, now[0]).mode == "lookup" and not chooser.probing
    assert checked == [64, 64 - MIN_TESTED, 64 - 3 * MIN_TESTED, 64 - 7 * MIN_TESTED] * 2


def test_auto_chooser_state_round_trips():
    """A chooser rebuilt from its saved state (as JSON) goes on as the one that saved it: the same counts,
    calibrations (an overruled one too), timing ratios and overheads, and the same choices from the same draws."""
    import json
    import random

    costs = Costs({"full": {1: 1.0, 2: 1.2, 17: 2.0}, "draft": {1: 0.2}, "slim": {1: 0.6}}, "test")
    chooser = Chooser(costs, arms(draft=True, slim=True), calibrated={("slim", "full"): 0.9, ("draft", "full"): 0.6},
                      worth={("draft", "full"): 6.0})
    chooser.observe([("draft", "full", 5, 8), ("lookup@2", "full", 3, 4), ("slim", "full", 1, 8)])
    chooser.observe_forwards("full", [(2, 1.5), (1, 0.9)])
    chooser.observe_overhead("sd", 0.01, 3)
    assert chooser.overruled == {("slim", "full")}  # 1 of 8 against a 0.9 calibration
    back = Chooser.from_state(costs, chooser.arms, json.loads(json.dumps(chooser.state())))
    assert (back.counts, back.calibrated, back.overruled) == (chooser.counts, chooser.calibrated, chooser.overruled)
    assert back.worth == chooser.worth and back.prior(("draft", "full")) == pytest.approx((1 + 3.6, 1 + 2.4))
    assert (back.scale, back.overhead) == (chooser.scale, chooser.overhead) and ("full", 2) in back.scale
    chooser.new_prompt()  # a restarted process starts a prompt: the per-prompt n-gram counts are not saved
    lag, one, two = {"draft": 0, "slim": 0}, random.Random(3), random.Random(3)
    picks = [chooser.choose(one, lag, 4, 2, 40).label for _ in range(50)]
    assert picks == [back.choose(two, lag, 4, 2, 40).label for _ in range(50)] and len(set(picks)) > 1
    state = chooser.state()  # as saved before a draft's first and later tokens were counted apart
    state["counts"] = {k: c for k, c in state["counts"].items() if "^" not in k and "+|" not in k or "lookup" in k}
    old = Chooser.from_state(costs, chooser.arms, state)
    assert old.means()[("draft", "full")] == pytest.approx((9.6 / 16, 9.6 / 16))  # the pooled 5 of 8, both parts


def test_auto_starts_a_calibrated_slim_from_its_calibration():
    """A slim config carries the slim's acceptance measured on calibration text (mini's: 0.96 top-1 agreement);
    that is its pair's prior, worth CALIBRATED tested tokens. A pair whose calibration already makes its mode win
    runs without a test; one whose calibration makes it lose is still tested on MIN_TESTED tokens if it could win
    (calibration text is not the workload's), and the draws then weigh that test with the calibration."""
    import random

    from dimr.decoding.auto import CALIBRATED, GAMMAS

    costs = Costs({"full": {1: 1.0, 17: 1.0}, "slim": {1: 0.5}}, "test")  # self/1 beats ar above 0.5 acceptance
    own = [Arm("ar")] + [Arm("self", g) for g in GAMMAS]
    rng = random.Random(0)
    cold = Chooser(costs, own)  # no calibration: tested first
    assert cold.choose(rng, {"slim": 0}).label == "self/1" and cold.probing
    poor = Chooser(costs, own, calibrated={("slim", "full"): 0.1})
    assert poor.prior(("slim", "full")) == pytest.approx((1 + 0.1 * CALIBRATED, 1 + 0.9 * CALIBRATED))
    assert poor.choose(rng, {"slim": 0}).label == "self/1" and poor.probing  # loses at 0.1, wins if accepted
    poor.observe([("slim", "full", 1, MIN_TESTED)])  # the test agrees with the calibration: it is kept
    assert not poor.overruled
    picked = [poor.choose(rng, {"slim": 0}).mode for _ in range(200)]
    assert picked.count("self") <= 2 and not poor.probing  # Beta(3.6, 22.4) draws above 0.5: 3 in 10,000
    good = Chooser(costs, own, calibrated={("slim", "full"): 0.95})
    picked = [good.choose(rng, {"slim": 0}) for _ in range(200)]
    assert not good.probing and sum(a.mode == "self" for a in picked) > 190  # it wins at its means: no test
    assert {a.gamma for a in picked if a.mode == "self"} == {1}  # its γ still grows with its own evidence only


def test_auto_weighs_a_calibration_by_how_far_its_sequences_spread():
    """A calibration is worth as many tested tokens as the concentration k of the Beta law whose beta-binomial
    spread (scipy) the calibration's per-sequence rates show: two rates m ± d with that variance give k back. Rates
    that agree no more than sampling allows are worth CALIBRATED (calibration text is not the workload's); rates
    spread wider than any Beta allows (0 and 1) are worth nothing. smollm2's draft (eight calibration continuations
    of 48 tokens, 0.10–0.52) is worth far less than CALIBRATED, and the chooser prices from it."""
    from scipy.stats import betabinom

    from dimr.decoding.auto import CALIBRATED, calibration_worth

    for m, k, tokens in ((0.3, 6.0, 48), (0.75, 2.5, 64), (0.5, 12.0, 20)):
        d = math.sqrt(betabinom(tokens, m * k, (1 - m) * k).var() / tokens**2 / 2)  # sample variance 2d²
        assert calibration_worth([m - d, m + d], tokens) == pytest.approx(k, rel=1e-9)
    assert calibration_worth([0.3, 0.3, 0.3], 48) == CALIBRATED == calibration_worth([0.3], 48)
    assert calibration_worth([0.0, 1.0], 48) == 0.0
    smollm2 = [0.41, 0.46, 0.38, 0.52, 0.15, 0.14, 0.12, 0.10]  # its expected acceptance per sequence
    worth = calibration_worth(smollm2, 48)
    assert 3.0 < worth < 8.0
    chooser = Chooser(Costs({"full": {1: 1.0}}, "test"), [Arm("ar")], calibrated={("draft", "full"): 0.28},
                      worth={("draft", "full"): worth})
    assert chooser.prior(("draft", "full")) == pytest.approx((1 + 0.28 * worth, 1 + 0.72 * worth))
    assert Chooser(chooser.costs, chooser.arms, calibrated={("draft", "full"): 0.28}).prior(
        ("draft", "full")) == pytest.approx((1 + 0.28 * CALIBRATED, 1 + 0.72 * CALIBRATED))  # no spread known


def test_auto_drops_a_calibration_its_pair_contradicts():
    """smollm2's draft agrees with its verifier on 0.34 of the calibration continuations and about 0.75 of code,
    where sd is the fastest mode: from the calibrated prior sd was never run, so never seen. The test of MIN_TESTED
    tokens runs (sd loses at the means but could win), and an accepted count in a tail of the prior's predictive
    law rarer than CONFLICT drops the calibration: the pair goes on from PRIOR and its own evidence, and sd runs."""
    import random

    from scipy.stats import betabinom

    from dimr.decoding.auto import CONFLICT, PRIOR, predictive_tail

    for k, n, a, b in ((6, 8, 6.5, 11.5), (0, 8, 14.0, 4.0), (3, 8, 6.5, 11.5), (40, 64, 2.0, 3.0)):
        tail = min(betabinom.cdf(k, n, a, b), betabinom.sf(k - 1, n, a, b))
        assert predictive_tail(k, n, a, b) == pytest.approx(tail, rel=1e-9)
    # sd beats ar above about 0.6 acceptance (as smollm2's sd@4 above 0.75)
    costs = Costs({"full": {1: 1.0, 2: 1.4, 3: 1.6, 5: 2.0, 7: 2.4, 9: 2.8}, "draft": {1: 0.2}}, "test")
    own = [Arm("ar")] + [Arm("sd", g) for g in (1, 2, 4, 6, 8)]
    rng = random.Random(0)
    chooser = Chooser(costs, own, calibrated={("draft", "full"): 0.34})
    calibrated = chooser.prior(("draft", "full"))
    assert chooser.choose(rng, {"draft": 0}).label == "sd/1" and chooser.probing
    chooser.observe([("draft", "full", 5, MIN_TESTED - 1)])  # not yet MIN_TESTED: not checked, still tested
    assert not chooser.overruled and chooser.choose(rng, {"draft": 0}).label == "sd/1"
    chooser.observe([("draft", "full", 1, 1)])  # 6 of 8: P(K ≥ 6) = 0.058 under Beta(6.4, 11.6)
    assert predictive_tail(6, 8, *calibrated) < CONFLICT
    assert chooser.overruled == {("draft", "full")} and chooser.prior(("draft", "full")) == PRIOR
    picked = [chooser.choose(rng, {"draft": 0}).mode for _ in range(200)]
    assert not chooser.probing and picked.count("sd") > 100  # Beta(7, 4) draws: sd mostly wins
    kept = Chooser(costs, own, calibrated={("draft", "full"): 0.34})
    kept.choose(rng, {"draft": 0})
    kept.observe([("draft", "full", 3, MIN_TESTED)])  # as calibrated: kept, and sd rarely runs
    assert not kept.overruled and [kept.choose(rng, {"draft": 0}).mode for _ in range(200)].count("sd") < 40


def test_auto_calibrated_smollm2_slim_never_runs_on_its_measured_costs():
    """smollm2's slim (top-1 agreement 0.56, expected acceptance 0.65) costs 0.9 of the full verifier: on the six
    cost tables measured in the smollm2 benchmark, neither self nor hier is chosen from its calibrated prior,
    whatever the draft has shown, so calibration changes no choice there."""
    import json
    import random
    from pathlib import Path

    from dimr.slim_config import load_slim_config

    results = Path(__file__).parents[1] / "benchmarks" / "results"
    metrics = load_slim_config(results / "smollm2_light.json").metrics  # the slim those runs decoded with
    for table in json.loads((results / "bench_tiers_smollm2_ab_mean2.json").read_text())["tables"]:
        costs = Costs.from_dict(table)
        m = metrics["top1_agreement" if table["temperature"] == 0 else "expected_acceptance"]
        for accepted, tested in ((0, 0), (2, 8), (6, 8), (40, 60), (21, 30)):
            chooser = Chooser(costs, arms(draft=True, slim=True), calibrated={("slim", "full"): m})
            chooser.observe([("draft", "full", accepted, tested)] if tested else [])
            rng = random.Random(0)
            picked = {chooser.choose(rng, {"draft": 0, "slim": 0}, 8, 1).mode for _ in range(500)}
            assert not picked & {"self", "hier"}, (table["workload"], table["temperature"], accepted, tested)


def test_auto_tests_hier_draft_against_the_slim_before_the_draws_decide():
    """hier's inner pair (the draft against the slim) is only seen when hier runs: on mini at T = 0.7 on the task
    (hier@4x12 the fastest fixed mode) it never ran, its draws at the prior's mean 1/3 losing to sd's. Once sd
    and self are tested, hier(1, 4) runs until the draft has been tested against the slim on MIN_TESTED tokens,
    if hier could win were those drafts always accepted; then the draws decide, each draw of the inner pair held
    within the band the draft's and the slim's acceptance by the full verifier allow."""
    import random

    # a cheap slim that the full verifier nearly always accepts, a draft that the full verifier rarely does
    costs = Costs({"full": {1: 1.0, 17: 1.0}, "draft": {1: 0.05}, "slim": {1: 0.1}}, "test")
    chooser = Chooser(costs, arms(draft=True, slim=True))
    chooser.observe(draft_blocks(0.25, 40, gamma=2) + draft_blocks(0.95, 30, pair=("slim", "full")))
    rng = random.Random(0)
    assert {chooser.choose(rng, {"draft": 0, "slim": 0}, 0).label for _ in range(20)} == {"hier/1/4"}
    assert chooser.probing
    chooser.observe(draft_blocks(0.875, 3, pair=("draft", "slim")))  # 10 of 11 accepted
    # a draft accepted 10 in 11 by a slim that the full verifier accepts 0.95 of the time cannot be accepted 3 in 43
    # by the full: its draws against the slim stay within its draws against the full ± 0.05, and hier loses
    assert all(chooser.choose(rng, {"draft": 0, "slim": 0}, 0).mode != "hier" for _ in range(20))
    # the draft's evidence against the full catches up, and hier's blocks show the draft against the slim
    chooser.observe(draft_blocks(0.8, 200) + draft_blocks(0.85, 40, pair=("draft", "slim"), seed=1))
    picked = [chooser.choose(rng, {"draft": 0, "slim": 0}, 0) for _ in range(20)]
    assert not chooser.probing and sum(a.mode == "hier" for a in picked) > 10  # the draws now favour hier
    assert any(a.mode == "hier" and a != Arm("hier", 1, 4) for a in picked)  # at the longer Γ its evidence allows
    # a slim the full verifier rarely accepts: hier could not win, its inner pair is never probed
    poor = Chooser(costs, arms(draft=True, slim=True))
    poor.observe(draft_blocks(0.25, 40, gamma=2) + draft_blocks(0.05, 30, pair=("slim", "full")))
    assert all(poor.choose(rng, {"draft": 0, "slim": 0}, 0).mode != "hier" for _ in range(20))


def test_inner_acceptance_band_holds_for_any_three_distributions():
    """Speculative sampling accepts a draft from q against p with probability Σ min(p, q) = 1 − TV(p, q); by the
    triangle inequality the draft's acceptance against the slim is within its acceptance against the full ± (1 −
    the slim's). Checked on random next-token laws (and on one-hot ones, greedy), then within_band's clamp."""
    from dimr.decoding.auto import within_band

    rng = np.random.default_rng(0)
    for sharp in (0.3, 1.0, 30.0):
        d, s, f = (rng.dirichlet(np.full(50, 1.0 / sharp), size=200) for _ in range(3))
        ds, df, sf = (np.minimum(x, y).sum(-1).mean() for x, y in ((d, s), (d, f), (s, f)))
        assert abs(ds - df) <= 1 - sf + 1e-12 and within_band(ds, df, sf) == ds
    d, s, f = (np.eye(5)[rng.integers(0, 5, 1000)] for _ in range(3))  # greedy: acceptance = the argmaxes agree
    ds, df, sf = ((x * y).sum(-1).mean() for x, y in ((d, s), (d, f), (s, f)))
    assert abs(ds - df) <= 1 - sf
    assert within_band(0.9, 0.3, 0.95) == pytest.approx(0.35) and within_band(0.1, 0.3, 0.95) == pytest.approx(0.25)

def test_expected_tokens_of_a_first_and_a_rest_rate_match_an_enumeration():
    """(first, rest): the first draft accepted at one rate, each later one (after accepted ones) at another. The
    mean of 1 + the accepted run, enumerated over every accept/reject pattern of γ drafts, equals the closed form;
    equal rates give the i.i.d. formula."""
    import itertools

    from dimr.decoding.costs import expected_tokens

    for first, rest, gamma in [(0.3, 0.95, 4), (0.8, 0.2, 3), (0.5, 0.5, 6), (0.0, 0.9, 2), (1.0, 1.0, 5)]:
        total = 0.0
        for pattern in itertools.product([True, False], repeat=gamma):
            rates = np.array([first] + [rest] * (gamma - 1))
            p = np.prod(np.where(pattern, rates, 1 - rates))
            run = next((i for i, ok in enumerate(pattern) if not ok), gamma)
            total += p * (1 + run)
        assert expected_tokens((first, rest), gamma) == pytest.approx(total)
    assert expected_tokens((0.6, 0.6), 4) == pytest.approx(expected_tokens(0.6, 4))
    assert expected_tokens((0.6, 0.1), 0) == 1.0


def test_a_draft_that_stops_when_unsure_is_priced_as_an_enumeration():
    """A block of at most γ drafts that stops after the first the draft is unsure of: its expected tokens and seconds
    (and drafts), enumerated over every (sure, accepted) pattern of γ drafts with numpy (each position's four outcomes
    at the first or the later position's rates), equal :func:`stopped`'s (and :func:`expected_drafts`'); sure of
    every draft, it is the block without the stop."""
    import itertools

    from dimr.decoding.costs import Sure, expected_drafts, expected_tokens, reaches, stopped

    def verify(n: int) -> float:
        return 1.0 + 0.13 * n + 0.01 * n * n

    cases = [(Sure(0.6, 0.9, 0.7), Sure(0.7, 0.8, 0.75), 4), (Sure(0.3, 0.5, 0.4), Sure(0.9, 1.0, 0.95), 3),
             (Sure(0.5, 0.6, 0.6), Sure(0.5, 0.6, 0.6), 5), (Sure(0.8, 0.9, 0.8), Sure(0.2, 0.3, 0.5), 1)]
    for first, rest, gamma in cases:
        tokens = seconds = drafts = 0.0
        for pattern in itertools.product(range(4), repeat=gamma):  # outcome: 0 sure+accepted, 1 unsure+accepted,
            p = 1.0  # 2 sure+rejected, 3 unsure+rejected
            for k, o in enumerate(pattern):
                r = first if k == 0 else rest
                law = np.array([r.accepted * r.kept, r.accepted * (1 - r.kept), r.sure - r.accepted * r.kept,
                                1 - r.accepted - r.sure + r.accepted * r.kept])
                assert (law >= 0).all()
                p *= law[o]
            drafted = next((k + 1 for k, o in enumerate(pattern) if o in (1, 3)), gamma)
            run = next((k for k, o in enumerate(pattern[:drafted]) if o >= 2), drafted)
            tokens += p * (1 + run)
            seconds += p * (drafted * 0.2 + verify(drafted + 1))
            drafts += p * drafted
        assert stopped(first, rest, gamma, 0.2, verify) == pytest.approx((tokens, seconds))
        # one pass prices every shorter γ too (auto's choice prices six γ of a draft so)
        assert reaches(first, rest, 6, 0.2, verify)[gamma] == pytest.approx((tokens, seconds))
        assert expected_drafts(first, rest, gamma)[gamma] == pytest.approx(drafts)
    assert stopped(Sure(0.6), Sure(0.7), 4, 0.2, verify) == pytest.approx(
        (expected_tokens((0.6, 0.7), 4), 4 * 0.2 + verify(5)))


@torch.inference_mode()
def test_auto_stops_drafting_where_the_draft_is_unsure(decoder: Decoder):
    """auto's stop arms (``sd/γ~``) end the draft after a token the draft gives less than ``Chooser.stop`` and count,
    per block, its drafted and accepted tokens it was sure of: a stop above every probability ends each draft after
    its first token, none was sure. The same γ without the stop drafts γ tokens (fewer only where the decode's end
    cuts them) and counts nothing of the stop; with the stop off (0) the stop arms are not offered."""
    from dimr.decoding.auto import DRAFTS, part, sure_key

    config = DecodeConfig(max_new_tokens=NEW_TOKENS, temperature=1.0, seed=3)
    costs = Costs({t: {1: 1.0} for t in ("draft", "slim", "full")}, "test")
    for offered, stop, per_block in (([Arm("sd", 4, stop=True)], 1.01, 1), ([Arm("sd", 4)], 1.01, 4),
                                     ([Arm("sd", 4, stop=True), Arm("sd", 4)], 0.0, 4)):
        chooser = Chooser(costs, offered, adapt=False, stop=stop)
        result = auto(chooser, decoder.full, decoder.draft, decoder.slim, PROMPT, config, decoder.vocab_size)
        stats = result.stats
        assert stats.drafted == per_block * stats.blocks or per_block == 4 and stats.drafted > 3 * stats.blocks
        sure = chooser.counts.get(part(sure_key(DRAFTS["sd"], False), False))
        assert sure == ([0.0, float(stats.blocks)] if per_block == 1 else None)
        assert set(chooser.chosen) == {"sd/4~" if per_block == 1 else "sd/4"}


def test_auto_prices_sd_with_and_without_the_stop():
    """Each γ of sd is offered drafting all γ and (``sd/γ~``) stopping after an unsure draft. The chooser prices the
    first by :func:`expected_tokens` and γ drafts, the second by :func:`stopped` at the draft's sure-rates, both from
    the same acceptance counts, and runs the faster (sd/8~ at 2.01 tokens/s against sd/2's 1.42; sd/2 against
    sd/4~'s 1.35): the stop where the draft's unsure drafts are the rejected ones
    (sure of 0.3, of 0.95 of the accepted ones), drafting all where it is as often sure of a draft it turns out
    rejected as of an accepted one (sure of 0.3 of either)."""
    import random

    from dimr.decoding.auto import DRAFTS, STOPPED, part, sure_key
    from dimr.decoding.costs import Sure, expected_drafts, expected_tokens, stopped

    costs = Costs({"full": {1: 1.0, 2: 1.05, 9: 1.4}, "draft": {1: 0.1}}, "test")
    offered = [Arm("ar")] + [Arm("sd", g, stop=s) for g in (1, 2, 4, 8) for s in (False, True)]
    pair, big = DRAFTS["sd"], 10_000.0
    for kept, stop_wins in ((0.95, True), (0.3, False)):
        chooser = Chooser(costs, offered, adapt=False)
        for rest in (False, True):  # acceptance 0.5 and 0.7; the draft sure of 0.3 of its drafts
            accepted = 0.7 if rest else 0.5
            chooser.counts[part(pair, rest)] = [big * accepted, big * (1 - accepted)]
            chooser.counts[part(sure_key(pair, False), rest)] = [big * 0.3, big * 0.7]
            chooser.counts[part(sure_key(pair, True), rest)] = [big * kept, big * (1 - kept)]
        chooser.counts[pair] = [big, big]
        speed, block = {}, {}
        for arm in offered[1:]:
            if arm.stop:
                tokens, seconds = stopped(Sure(0.5, kept, 0.3), Sure(0.7, kept, 0.3), arm.gamma, 0.1,
                                          lambda n: costs("full", n))
            else:
                tokens, seconds = expected_tokens((0.5, 0.7), arm.gamma), 0.1 * arm.gamma + costs("full", arm.gamma + 1)
            speed[arm.label], block[arm.label] = tokens / seconds, (tokens, seconds)
        best = max(speed, key=speed.__getitem__)
        assert best.endswith("~") == stop_wins
        rng = random.Random(0)
        assert chooser.speeds(offered[1:], chooser.means(), {"draft": 0}) == pytest.approx(list(speed.values()),
                                                                                            rel=1e-3)
        # the draws run the faster kind, at a γ priced within 1% of the best (sd/2 and sd/4 drafting all are 0.5% apart)
        chosen = {chooser.choose(rng, {"draft": 0}).label for _ in range(20)}
        assert best in chosen and all(speed[label] > 0.99 * speed[best] for label in chosen)
    # the stop arms' step work is kept apart (they read the draft's probability of each token): per verified token
    chooser.overhead = {"sd": 0.01, "sd~": 0.05}
    sure = chooser.means()[STOPPED]
    work = {a.label: (expected_drafts(*sure, a.gamma)[a.gamma] + 1) * 0.05 if a.stop else (a.gamma + 1) * 0.01
            for a in offered[1:]}
    assert chooser.speeds(offered[1:], chooser.means(), {"draft": 0}) == pytest.approx(
        [tokens / (seconds + work[label]) for label, (tokens, seconds) in block.items()], rel=1e-3)


def test_auto_prices_the_ngram_drafts_first_token_apart_from_the_rest():
    """After a single matched token the n-gram draft's first token is a guess, but once it is accepted the text
    that followed the match tends to go on (smollm2's prose: 0.12 of first tokens accepted, then nearly every later
    one). Counted as one i.i.d. rate (0.45 here) a long proposal is priced at 1.8 tokens and lookup/1 wins; by the
    two rates (0.3, 0.95) lookup/8 makes 3.0 tokens for a forward of 2 steps and wins."""
    import random

    from dimr.decoding.auto import lookup_pair

    costs = Costs({"full": {1: 1.0, 2: 1.2, 9: 2.0}}, "test")
    chooser = Chooser(costs, [Arm("ar"), Arm("lookup", 1), Arm("lookup", 8)])
    chooser.observe(lookup_blocks(0.3, 0.95, 200, ngram=1))
    first, rest = chooser.lookup_means(1)
    assert first == pytest.approx(0.3, abs=0.02) and rest == pytest.approx(0.95, abs=0.03)
    (a1, r1), (a2, r2) = chooser.counts[lookup_pair(1)], chooser.counts[lookup_pair(1, rest=True)]
    pooled = Acceptance({("lookup", "full"): (a1 + a2) / (a1 + r1 + a2 + r2)})
    assert predict("lookup", 1, pooled, costs) > predict("lookup", 8, pooled, costs)
    rng = random.Random(0)
    assert {chooser.choose(rng, {}, 8, ngram=1).label for _ in range(20)} == {"lookup/8"}


def test_auto_prices_lookup_by_the_length_of_its_match():
    """After a matched trigram the n-gram draft has been accepted 9 times in 10, after a single token 1 in 10:
    lookup runs after the trigram only. Observations are filed under the match they came from."""
    import random

    from dimr.decoding.auto import _by_match, lookup_pair

    costs = Costs({"full": {1: 1.0, 17: 2.0}}, "test")  # verifying 5 tokens: 1.25 steps
    chooser = Chooser(costs, [Arm("ar"), Arm("lookup", 4)])
    chooser.observe(lookup_blocks(0.9, 0.9, 1000, ngram=3) + lookup_blocks(0.1, 0.1, 1000, ngram=1))
    assert set(chooser.counts) == {lookup_pair(n, rest) for n in (1, 3) for rest in (False, True)}
    rng = random.Random(0)
    assert {chooser.choose(rng, {}, 4, ngram=3).mode for _ in range(20)} == {"lookup"}
    assert {chooser.choose(rng, {}, 4, ngram=1).mode for _ in range(20)} == {"ar"}
    assert _by_match([("draft", "full", 1, 2)], 3) == [("draft", "full", 1, 2)]  # other pairs keep their key


def test_auto_keys_the_ngram_acceptance_to_the_prompt():
    """Earlier prompts repeated their text (the n-gram draft accepted 9 times in 10 after a trigram); this one does
    not: after 48 of its drafts are rejected at their first token, ar runs, although the pooled counts still say
    0.75. The next prompt starts from the pooled counts again, at SEED tokens' weight."""
    import random

    from dimr.decoding.auto import SEED, _by_match, lookup_pair

    costs = Costs({"full": {1: 1.0, 5: 1.5, 17: 2.0}}, "test")
    chooser = Chooser(costs, [Arm("ar"), Arm("lookup", 4)])
    chooser.observe(lookup_blocks(0.9, 0.9, 1000, ngram=3))
    chooser.new_prompt()
    rng = random.Random(0)
    assert {chooser.choose(rng, {}, 4, ngram=3).mode for _ in range(20)} == {"lookup"}
    chooser.observe(_by_match([("lookup", "full", 0, 1)] * 48, 3))
    a, r = chooser.counts[lookup_pair(3)]
    assert a / (a + r) > 0.7  # the pooled estimate moved little, this prompt's a lot
    a, r = chooser.local[lookup_pair(3)]
    assert a + r == pytest.approx(SEED + 48) and a / (a + r) < 0.15
    assert {chooser.choose(rng, {}, 4, ngram=3).mode for _ in range(20)} == {"ar"}
    chooser.new_prompt()
    assert {chooser.choose(rng, {}, 4, ngram=3).mode for _ in range(20)} == {"lookup"}


def test_auto_prices_the_ngram_draft_at_its_posterior_mean():
    """smollm2 on the task, this CPU: verifying 3–5 tokens costs 1.7 steps and the n-gram draft is accepted 9 times
    in 24; at that rate no lookup arm beats ar. The n-gram proposer is seen after every block whatever runs, so
    drawing its rate (Thompson) only added exploration: 3 choices in 10 ran a losing n-gram block."""
    import random

    costs = Costs({"full": {1: 1.0, 2: 1.54, 3: 1.7, 5: 1.7, 9: 2.0}}, "test")
    chooser = Chooser(costs, [Arm("ar")] + [Arm("lookup", g) for g in (1, 2, 4, 8)])
    chooser.observe([("lookup", "full", 9, 24)])
    rng = random.Random(0)
    # the draws the Thompson chooser priced these arms with: a lookup arm beats ar on about 3 in 10 of them
    draws = np.random.default_rng(0).beta(9 + PRIOR[0], 15 + PRIOR[1], 2000)
    wins = [max(predict("lookup", g, Acceptance({("lookup", "full"): a}), costs) for g in (1, 2, 4, 8)) > 1.0
            for a in draws]
    assert 0.2 < np.mean(wins) < 0.4
    assert {chooser.choose(rng, {}, 8).label for _ in range(200)} == {"ar"}
    chooser.observe([("lookup", "full", 14, 16)])  # the prompt's text starts repeating: lookup runs
    assert {chooser.choose(rng, {}, 8).mode for _ in range(20)} == {"lookup"}


def test_auto_prices_a_drafts_first_token_apart_from_the_rest():
    """A model draft's first token in a block is counted apart from its later ones (tested once those before were
    accepted), and a block is priced at that (first, rest): 1 + first · (1 − rest^γ) / (1 − rest) tokens. Drafts
    rejected at their first token 7 blocks in 10 and kept to the end otherwise are 0.77 acceptance pooled, which
    one i.i.d. rate prices as sd/8 beating ar; apart, sd/8 (3.3 tokens for 3.6 s) loses to ar (1 token a second)."""
    from dimr.decoding.auto import part

    costs = Costs({"full": {1: 1.0, 2: 2.0, 9: 2.8}, "draft": {1: 0.1}}, "test")
    chooser = Chooser(costs, [Arm("ar"), Arm("sd", 1), Arm("sd", 8)], stop=0.0)  # every block drafts γ
    chooser.observe([("draft", "full", 3, 4), ("draft", "full", 0, 1), ("draft", "full", 2, 2)])
    pair = ("draft", "full")
    assert chooser.counts == {pair: [5.0, 2.0], part(pair, False): [2.0, 1.0], part(pair, True): [3.0, 1.0]}
    chooser.counts = {}
    chooser.observe([("draft", "full", 0, 1)] * 70 + [("draft", "full", 8, 8)] * 30)
    first, rest = chooser.counts[part(pair, False)], chooser.counts[part(pair, True)]
    assert first == pytest.approx([30.0, 70.0]) and rest == pytest.approx([210.0, 0.0])
    f, r = 31.0 / 103.0, 211.0 / 213.0  # Beta(accepted + 1, rejected + 2) means
    assert chooser.means()[pair] == pytest.approx((f, r))
    ar, sd1, sd8 = chooser.speeds(chooser.arms, chooser.means(), {"draft": 0})
    assert sd8 == pytest.approx((1 + f * (1 - r ** 8) / (1 - r)) / (8 * 0.1 + 2.8))
    assert sd8 < ar == 1.0 and sd1 < ar
    pooled = Chooser(costs, chooser.arms, counts=chooser.counts, split=False, stop=0.0)
    a, b = chooser.counts[pair]  # 240 of 310 (faded to the horizon)
    assert a / (a + b) == pytest.approx(240 / 310, abs=0.01)
    assert pooled.means()[pair] == pytest.approx((a + 1) / (a + b + 3))
    assert max(pooled.speeds(pooled.arms, pooled.means(), {"draft": 0})) > 1.05 * ar  # one rate: sd/8 wins


def test_auto_posterior_fades_to_its_horizon():
    from dimr.decoding.auto import HORIZON

    chooser = Chooser(Costs({"full": {1: 1.0}}, "test"), [Arm("ar")])
    chooser.observe([("draft", "full", 900, 1000)])
    a, r = chooser.counts[("draft", "full")]
    assert a + r == pytest.approx(HORIZON) and a / (a + r) == pytest.approx(0.9)
    for _ in range(50):  # acceptance drops to 0.1: the old evidence fades, the estimate follows
        chooser.observe([("draft", "full", 10, 100)])
    a, r = chooser.counts[("draft", "full")]
    assert a / (a + r) < 0.12


def stretches(emitted: list[int]) -> list[int]:
    """The choices' stretches (blocks each) that blocks emitting ``emitted`` tokens make when every choice picks the
    same mode: each runs blocks until it has emitted 1, 2, 4… up to RUN tokens (at least one block)."""
    from dimr.decoding.auto import RUN

    out, budget, i = [], 1, 0
    while i < len(emitted):
        made, start = 0, i
        while i < len(emitted) and (i == start or made < budget):
            made, i = made + emitted[i], i + 1
        out.append(i - start)
        budget = min(2 * budget, RUN)
    return out


@pytest.mark.parametrize("arm", [Arm("ar"), Arm("sd", 2, stop=True)], ids=["ar", "sd"])
def test_auto_runs_longer_stretches_when_one_arm_keeps_winning(decoder: Decoder, arm: Arm):
    """With one arm only, each choice runs blocks until it has emitted 1, 2, 4… up to RUN tokens: fewer choices than
    blocks, the same output as the fixed mode (a stop arm's: sd's with auto's stop when unsure)."""
    config = DecodeConfig(max_new_tokens=NEW_TOKENS, temperature=0.8, seed=3, gamma=max(arm.gamma, 1),
                          draft_stop=STOP if arm.stop else 0.0)
    chooser = Chooser(Costs({t: {1: 1.0} for t in ("draft", "slim", "full")}, "test"), [arm])
    chooser.counts[("draft", "full")] = [1e3, 0.0]  # the γ cap lets sd run γ = 2 from the first block
    trace: list = []
    result = auto(chooser, decoder.full, decoder.draft, decoder.slim, PROMPT, config, decoder.vocab_size, trace)
    assert result.tokens == decoder.run(PROMPT, arm.mode, config).tokens
    assert all(a == arm for a, *_ in trace)
    expected = stretches([len(emitted) for *_, emitted in trace])
    assert chooser.chosen == {arm.label: len(expected)} and len(expected) < len(trace)


def test_auto_stretch_lengthens_while_the_mode_wins_whatever_its_gamma(decoder: Decoder):
    """A choice of the mode that ran the last stretch lengthens the stretch even at another γ."""
    config = DecodeConfig(max_new_tokens=NEW_TOKENS, temperature=0.8, seed=3)
    chooser = Chooser(Costs({t: {1: 1.0} for t in ("draft", "slim", "full")}, "test"), [Arm("sd", 2), Arm("sd", 3)])
    picks = iter([Arm("sd", 2), Arm("sd", 3)] * NEW_TOKENS)
    chosen: list[Arm] = []
    chooser.choose = lambda *a, **k: (chosen.append(next(picks)), chosen[-1])[1]
    trace: list = []
    auto(chooser, decoder.full, decoder.draft, decoder.slim, PROMPT, config, decoder.vocab_size, trace)
    lengths = stretches([len(emitted) for *_, emitted in trace])
    assert len(chosen) == len(lengths) < len(trace)
    assert [a for a, *_ in trace] == [a for a, n in zip(chosen, lengths, strict=True) for _ in range(n)]


@pytest.mark.parametrize("resume", [True, False])
def test_auto_resumes_a_prompts_first_stretch_at_half_its_modes_last(decoder: Decoder, resume: bool):
    """A prompt's first choice runs half the stretch its mode last ran on an earlier prompt (``Chooser(resume=False)``:
    one token, as a mode never chosen does); within a prompt, a mode chosen after another's stretch starts at one
    token. ``ar`` emits one token a block, so its stretches are counted in blocks."""
    config = DecodeConfig(max_new_tokens=40, temperature=0.8, seed=3)
    chooser = Chooser(Costs({t: {1: 1.0} for t in ("draft", "slim", "full")}, "test"), [Arm("ar"), Arm("sd", 2)],
                      resume=resume)
    picks = iter([Arm("ar")] * 3 + [Arm("sd", 2)] + [Arm("ar")] * 40)
    trace: list = []
    starts: list[int] = []  # the trace's length at each choice
    chooser.choose = lambda *a, **k: (starts.append(len(trace)), next(picks))[1]
    auto(chooser, decoder.full, decoder.draft, decoder.slim, PROMPT, config, decoder.vocab_size, trace)
    lengths = [j - i for i, j in zip(starts, [*starts[1:], len(trace)], strict=True)]
    assert [a.mode for a, *_ in trace[starts[3]:starts[4]]] == ["sd"]  # a one-token stretch: one block
    assert lengths[:3] == [1, 2, 4] and lengths[4:6] == [1, 2]
    last = chooser.stretches["ar"]
    assert last == 16  # 1, 2, 4, 8, 16… (at most RUN)
    picks, trace, starts[:] = iter([Arm("ar")] * 40), [], []  # the next prompt: ar first
    auto(chooser, decoder.full, decoder.draft, decoder.slim, PROMPT, config, decoder.vocab_size, trace)
    assert starts[1] == (last // 2 if resume else 1)


def test_auto_stretch_of_ngram_blocks_ends_where_the_match_changes(decoder: Decoder):
    """A stretch of n-gram blocks goes on only while each block starts from a match of the length its choice was
    priced at: on mini a block past the end of a match drafted nothing and yielded one token for a full forward,
    and lookup/4 stretches made 1.1–1.2 tokens a block where the chooser expected twice that."""
    from dimr.decoding.proposer import lookup_match

    config = DecodeConfig(max_new_tokens=NEW_TOKENS, temperature=0.8, seed=3)
    chooser = Chooser(Costs({t: {1: 1.0} for t in ("draft", "slim", "full")}, "test"), [Arm("lookup", 2)])
    trace: list = []
    starts: list[int] = []  # the trace's length at each choice: where each choice's stretch begins
    choose = chooser.choose
    chooser.choose = lambda *a, **k: (starts.append(len(trace)), choose(*a, **k))[1]
    prompt = torch.cat([PROMPT, PROMPT, PROMPT[:4]])  # repeats: matches of every length
    auto(chooser, decoder.full, decoder.draft, decoder.slim, prompt, config, decoder.vocab_size, trace)
    ngrams = [lookup_match(start, 2)[1] for _, start, _, _ in trace]
    stretches = [ngrams[i:j] for i, j in zip(starts, [*starts[1:], len(trace)], strict=True)]
    assert all(set(stretch) == {stretch[0]} for stretch in stretches)
    assert any(len(stretch) > 1 for stretch in stretches)  # stretches still run where the match holds


def test_auto_stretch_of_model_drafts_ends_where_a_longer_match_appears(decoder: Decoder):
    """A stretch of another mode's blocks stops where a longer n-gram match than the one at its choice appears, so
    the n-gram arms are priced there (on mini's greedy prose, sd stretches ran on through repeats where n-gram
    blocks were faster)."""
    from dimr.decoding.proposer import lookup_match

    config = DecodeConfig(max_new_tokens=NEW_TOKENS, temperature=0.8, seed=3)
    costs = Costs({"draft": {1: 0.01}, "slim": {1: 1.0}, "full": {1: 1.0}}, "test")
    chooser = Chooser(costs, [Arm("sd", 2), Arm("lookup", 2)])
    chooser.observe(draft_blocks(1.0, 300, gamma=2))  # sd wins every choice: only the stretches' ends vary
    trace: list = []
    starts: list[int] = []
    choose = chooser.choose
    chooser.choose = lambda *a, **k: (starts.append(len(trace)), choose(*a, **k))[1]
    prompt = torch.cat([PROMPT, PROMPT, PROMPT[:4]])
    auto(chooser, decoder.full, decoder.draft, decoder.slim, prompt, config, decoder.vocab_size, trace)
    assert {a.mode for a, *_ in trace} == {"sd"}
    ngrams = [lookup_match(start, 2)[1] for _, start, _, _ in trace]
    stretches = [ngrams[i:j] for i, j in zip(starts, [*starts[1:], len(trace)], strict=True)]
    assert all(max(stretch[1:], default=0) <= stretch[0] for stretch in stretches)
    assert any(len(stretch) > 1 for stretch in stretches)


# --- the cost model --------------------------------------------------------------------------------------

COSTS = Costs({"full": {1: 0.050, 5: 0.085, 9: 0.120}, "draft": {1: 0.010}, "slim": {1: 0.030, 3: 0.040,
                                                                                      5: 0.050}}, "test")


def test_costs_interpolate_and_extrapolate():
    assert COSTS("full", 3) == pytest.approx(0.0675)
    assert COSTS("full", 13) == pytest.approx(0.155)  # the last slope
    assert COSTS("draft", 7) == 0.010 and COSTS("lookup", 7) == 0.0
    assert Costs.from_dict(COSTS.to_dict()) == COSTS
    assert COSTS.scaled({"draft": 2.0})("draft", 7) == 0.020 and COSTS.scaled({})("full", 3) == COSTS("full", 3)


def test_costs_past_the_table_follow_the_rows_middle_chord_and_never_fall():
    """Past its last length a row goes on along the chord from the length nearest half the last, never falling: a
    kernel fast at one size tilts the last segment (smollm2's slim in one run: 163 ms at 13 tokens, 128 at 17), and
    extended from it a 53-token catch-up was priced below nothing, so ``auto`` priced a tier that had sat out the
    whole prompt *faster* for its catch-up (the slim then ran on every prompt)."""
    ms = {"full": {1: 66.8, 5: 110.4, 9: 141.3, 13: 184.0, 17: 140.8},
          "slim": {1: 57.1, 5: 97.1, 9: 125.5, 13: 162.8, 17: 127.5}}  # that run's task table
    table = Costs({t: {n: c / 1e3 for n, c in row.items()} for t, row in ms.items()}, "test")
    assert table("slim", 53) == pytest.approx((127.5 + (127.5 - 125.5) / 8 * 36) / 1e3)
    assert Costs({"slim": {1: 0.05, 9: 0.15, 17: 0.12}}, "test")("slim", 53) == pytest.approx(0.12)
    chooser = Chooser(table, [Arm("ar"), Arm("self", 2)], adapt=False)
    chooser.observe([("slim", "full", 65, 100)])
    (current,), (lagging,) = (chooser.speeds([Arm("self", 2)], chooser.means(), {"slim": lag}) for lag in (0, 52))
    assert 0 < lagging < current


def test_a_measured_row_keeps_each_cells_fastest_round_even_where_it_falls(monkeypatch: pytest.MonkeyPatch):
    """Each cell is its fastest timed round (a burst in one round is dropped; the warm-up round is not timed), a
    row that falls with more tokens (CPU kernels faster at 4 tokens than at 3) is kept as measured, not lowered to
    a non-decreasing envelope that would price the 3-token forward at the 4-token one's cost, and a tier's first
    forward after another tier's (here 5 s slower: its weights evicted) is not one of the timed cells."""
    from dimr.decoding import costs as costs_module

    clock, last = [0.0], [None]
    cost = {1: 1.0, 2: 1.5, 3: 2.5, 4: 1.8}  # seconds of each forward size on this "machine"

    class ClockedTier:
        model = SimpleNamespace(device=torch.device("cpu"))

        def __init__(self, scale: float) -> None:
            self.scale, self.seen = scale, dict.fromkeys(cost, 0)

        def reset(self, capacity: int = 0) -> None:
            pass

        def forward(self, x: torch.Tensor, keep: int) -> None:
            n = x.numel()
            cold = 5.0 if last[0] is not self else 0.0
            last[0] = self
            if n in cost:
                first, burst = self.seen[n] == 0, n == 2 and self.seen[n] == 2  # round 0 slow; round 2's burst
                self.seen[n] += 1
                clock[0] += self.scale * cost[n] * (5.0 if first else 1.0) + cold + (9.0 if burst else 0.0)

        def crop(self, length: int) -> None:
            pass

    monkeypatch.setattr(costs_module.time, "perf_counter", lambda: clock[0])
    tiers = {"draft": ClockedTier(0.1), "full": ClockedTier(1.0)}
    table = costs_module.measure(tiers, lengths=(1, 2, 3, 4), reps=3, prefix=8).table
    assert table["full"] == pytest.approx(cost)
    assert table["draft"] == pytest.approx({n: 0.1 * c for n, c in cost.items()})


@pytest.mark.parametrize(("gamma", "window", "alpha"), [(2, 8, 0.5), (4, 12, 0.8), (1, 4, 0.3), (4, 4, 1.0)])
def test_hier_window_fill_matches_a_simulation(gamma: int, window: int, alpha: float):
    """The expected seconds of the inner rounds that fill hier's window against a numpy simulation of them: each
    round drafts min(γ, room) tokens, accepts up to the first rejection and adds one token."""
    rng, total, n = np.random.default_rng(0), 0.0, 20000
    for _ in range(n):
        room = window
        while room > 0:
            g = min(gamma, room)
            total += g * COSTS("draft", 1) + COSTS("slim", g + 1)
            rejected = np.flatnonzero(rng.random(g) >= alpha)
            room -= (rejected[0] if rejected.size else g) + 1
    assert fill(window, gamma, alpha, COSTS) == pytest.approx(total / n, rel=0.01)
    if alpha == 1.0:  # every round drafts γ and yields γ + 1 until the window is full
        assert fill(window, gamma, alpha, COSTS) == pytest.approx(
            math.ceil(window / (gamma + 1)) * (gamma * 0.010 + COSTS("slim", gamma + 1)))

def test_predictions_equal_hand_computation():
    acc = Acceptance({("draft", "full"): 0.6, ("slim", "full"): 0.8, ("draft", "slim"): 0.5,
                      ("lookup", "full"): 0.3})
    assert predict("ar", 0, acc, COSTS) == pytest.approx(20.0)
    # sd, γ = 4: (1 − 0.6⁵)/(1 − 0.6) = 2.3056 tokens for 4·0.010 + c(full, 5) = 0.125 s
    assert predict("sd", 4, acc, COSTS) == pytest.approx(2.3056 / 0.125)
    # self, γ = 2: (1 − 0.8³)/0.2 = 2.44 tokens for 2·0.030 + c(full, 3) = 0.1275 s
    assert predict("self", 2, acc, COSTS) == pytest.approx(2.44 / 0.1275)
    # lookup, γ = 4: (1 − 0.3⁵)/0.7 = 1.4251 tokens for c(full, 5) = 0.085 s
    assert predict("lookup", 4, acc, COSTS) == pytest.approx(1.4251 / 0.085)
    # hier, γ = 2, Γ = 3: rounds fill the window; f[r] = seconds to fill r more slim tokens. r = 1: one draft
    # (0.010) + c(slim, 2) = 0.035 always fills it: 0.045. r = 2: 2·0.010 + c(slim, 3) = 0.060, and one more
    # round of r = 1 when the first draft is rejected (1/2): 0.0825. r = 3: 0.060 + ½·f[2] + ¼·f[1] = 0.1125.
    # The full forward of 4 tokens costs 0.07625 s and yields (1 − 0.8⁴)/0.2 = 2.952 tokens
    assert predict("hier", 2, acc, COSTS, window=3) == pytest.approx(2.952 / (0.1125 + 0.07625))
    # counts: 30 full forwards of 5 tokens on average and 120 draft forwards → 100 tokens in 3.75 s
    assert predict_from_counts(100, {"full": 30, "draft": 120, "slim": 0}, {"full": 150, "draft": 120,
                                                                            "slim": 0}, COSTS) == 100 / 3.75
    # with each forward's own size: a prefill of 21 tokens and 20 one-token steps of the full verifier are
    # c(21) + 20·c(1), not 21 forwards at c(41/21), which would price every step near c(2)
    # (a CPU-like table: steep from 1 to 5 tokens, flat after)
    knee = Costs({"full": {1: 0.050, 5: 0.100, 9: 0.110}}, "test")
    calls, fed, forwards = {"full": 21}, {"full": 41}, {"full": {21: 1, 1: 20}}
    assert predict_from_counts(20, calls, fed, knee, forwards) == pytest.approx(20 / (0.140 + 20 * 0.050))
    assert predict_from_counts(20, calls, fed, knee) == pytest.approx(20 / (21 * (0.050 + 0.0125 * 20 / 21)))
    assert predict_from_counts(20, calls, fed, knee, forwards) > 1.1 * predict_from_counts(20, calls, fed, knee)
    # and the step's own work: 12 sd blocks at 4 ms each outside the forwards (a mode of `sd@2` is `sd`)
    stepped = Costs(knee.table, "test", steps={"sd": 0.004, "ar": 0.001})
    assert stepped.step("sd@2") == 0.004 and stepped.step("self") == 0.0 and knee.step("sd") == 0.0
    assert predict_from_counts(20, calls, fed, stepped, forwards, 12, "sd@2") == pytest.approx(
        20 / (0.140 + 20 * 0.050 + 12 * 0.004))
    assert Costs.from_dict(stepped.to_dict()) == stepped


def test_measured_step_work_per_mode(decoder: Decoder):
    """Each mode's time outside its forwards, per block, from calibration decodes: one non-negative entry per
    mode asked for that the decoder can run, none for modes it cannot (no slim: no self/via/hier)."""
    got = decoder.measure_steps(["ar", "sd@2", "lookup@4", "auto", "self", "nonsense"], tokens=6)
    assert set(got) == {"ar", "sd", "lookup", "auto", "self"} and all(v >= 0 for v in got.values())
    assert not decoder.choosers  # auto's calibration decode leaves no warm chooser behind
    bare = Decoder.from_models(decoder.full.model, decoder.draft.model, None, decoder.tokenizer)
    assert set(bare.measure_steps(["sd", "self", "hier"], tokens=4)) == {"sd"}
    costs = bare.measure_costs(lengths=(1, 2), reps=1, steps=["ar", "sd"])
    assert set(costs.steps) == {"ar", "sd"} and costs.table["full"]


def test_roofline_is_flat_up_to_the_knee():
    table = roofline(GPUS["H200"], {"full": (135e6, 30)}, lengths=[1, 16, 4096])
    assert table("full", 1) == pytest.approx(135e6 * 2 / 4.8e12 + 30 * 8e-6)
    assert table("full", 16) == table("full", 1) < table("full", 4096)


# --- shared-prefix escalation ----------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
@torch.inference_mode()
def test_shared_prefix_escalation_gives_the_full_logits(family: str):
    verifier, _ = build_pair(family, seed=4)
    full, reference = Tier("full", verifier), Tier("full", verifier)
    slim = Tier("slim", slim_verifier(verifier, (True, True, False, True)))  # shares layers 0 and 1
    share = SharedPrefix(full, slim)
    ids = torch.cat([PROMPT, torch.tensor([4, 8, 15, 16, 23, 42, 7, 9])])
    with share.recording():
        check_shared_prefix(share, full, reference, slim, ids)
    assert share.hidden is not None and decoder_layers(slim.model)[2]._forward_pre_hooks == {}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("key", "f"), [("11m1", 1), ("11am", 2), ("110m", 1), ("1m11", 0), ("1101", 2)])
@torch.inference_mode()
def test_shared_prefix_escalation_of_a_sublayer_slim_gives_the_full_logits(family: str, key: str, f: int):
    """The full forward takes over where the slim stops running the full's layers whole and in place: at a
    layer whose MLP is skipped, or before one whose attention is skipped (its MLP runs in the slim layer
    before it)."""
    verifier, _ = build_pair(family, seed=4)
    full, reference = Tier("full", verifier), Tier("full", verifier)
    slim = Tier("slim", slim_verifier(verifier, SublayerMask.from_key(key)))
    assert first_skipped_of(slim) == f
    if f == 0:  # nothing to share: hier escalates with a plain full forward
        return
    share = SharedPrefix(full, slim)
    ids = torch.cat([PROMPT, torch.tensor([4, 8, 15, 16, 23, 42, 7, 9])])
    with share.recording():
        check_shared_prefix(share, full, reference, slim, ids)


def check_shared_prefix(share: SharedPrefix, full: Tier, reference: Tier, slim: Tier, ids: torch.Tensor) -> None:
    for tier in (full, reference, slim):
        tier.reset(64)
        tier.forward(PROMPT, keep=1)
    for slim_end, cut in ((13, 12), (17, 15)):  # the slim saw some of the tokens, then all of them
        slim.forward(ids[slim.length:slim_end], keep=1)
        got = share.forward(ids[full.length:], keep=3)
        want = reference.forward(ids[reference.length:], keep=3)
        # equal up to float32 rounding (the same sums in other shapes); the logits are ~±40 here
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
        assert share.usable() and full.length == reference.length == ids.numel()
        for tier in (full, reference, slim):
            tier.crop(cut)


def test_hier_with_and_without_shared_prefix_agree(decoder: Decoder):
    config = DecodeConfig(max_new_tokens=NEW_TOKENS, gamma=2, window=4, temperature=0.9, seed=3)
    shared = decoder.run(PROMPT, "hier", config)
    plain = decoder.run(PROMPT, "hier", DecodeConfig(**{**config.__dict__, "share_prefix": False}))
    assert shared.tokens == plain.tokens and shared.stats.calls == plain.stats.calls
    assert decoder.shared is not None and decoder.shared.usable()


# --- dimr bench-forward ----------------------------------------------------------------------------------

def test_bench_forward_json_and_bad_input(tiny_pair, capsys, tmp_path):
    import json

    from test_decoding_cli import run_cli

    out = tmp_path / "costs.json"
    code, stdout, _ = run_cli(["bench-forward", "--pair", "tiny-random", "--kept", "2,4", "--lengths", "1,3",
                               "--reps", "1", "--gpu", "H200", "--json", "--out", str(out)], capsys)
    assert code == 0
    data = json.loads(stdout)
    assert set(data["measured"]["table"]) == {"draft", "slim:2", "slim:4", "full"}
    assert set(data["measured"]["table"]["full"]) == {"1", "3"} and data["roofline"]["source"] == "roofline H200"
    assert Costs.load(out)("full", 3) == data["measured"]["table"]["full"]["3"]
    for args in (["--lengths", "x"], ["--gpu", "Z80"], ["--kept", "99"], ["--reps", "0"]):
        code, _, err = run_cli(["bench-forward", "--pair", "tiny-random", *args], capsys)
        assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, (args, err)


def test_auto_spreads_the_drafts_catch_up_over_the_tokens_left():
    """At a prompt's start the draft lags by the whole prompt. Charged whole to one block, its catch-up priced sd
    below ar on mini's long code prompts, and each ar block lengthened the lag. It is paid once for all of sd's
    later blocks, so a block bears its share of the tokens the draft's arms will emit (the tokens left × the share of
    tokens they emitted recently). Once the draft has run on the prompt, a lag is the chooser's own interleaving,
    paid again at each return, so it is charged whole (smollm2's task at T = 0.7: ``sd`` run a block at a time
    between n-gram stretches took 76–91 ms a block after other arms, 70–75 after itself); the slim's (self, hier)
    is always charged whole."""
    import random

    costs = Costs({"full": {1: 1.0, 17: 1.0}, "draft": {1: 0.05, 17: 0.85}, "slim": {1: 0.05, 17: 0.85}}, "test")
    chooser = Chooser(costs, [Arm("ar"), Arm("sd", 4)], adapt=False, stop=0.0)
    chooser.observe([("draft", "full", 900, 1000)])  # sd/4 emits 4.1 tokens in 1.2 s; catching up 100 costs 5 s
    rng = random.Random(0)

    def cold(lag: int, remaining: int) -> set[str]:  # choices at a prompt's start
        picked = set()
        for _ in range(20):
            chooser.new_prompt()
            picked.add(chooser.choose(rng, {"draft": lag}, remaining=remaining).label)
        return picked

    assert cold(100, 256) == {"sd/4"}
    assert cold(100, 4) == {"ar"}  # 4 tokens left
    assert cold(100, 0) == {"ar"}  # tokens left unknown: whole
    chooser.new_prompt()
    assert chooser.choose(rng, {"draft": 0}, remaining=256).label == "sd/4"  # sd runs on this prompt...
    # ...then other arms for 100 tokens: catching up on them is charged whole
    assert {chooser.choose(rng, {"draft": 100}, remaining=200).label for _ in range(20)} == {"ar"}
    assert {chooser.choose(rng, {"draft": 0}, remaining=200).label for _ in range(20)} == {"sd/4"}
    # the prompt's catch-up is spread over the tokens sd's arms are expected to emit: all of the 32 left while they
    # emitted every token so far, 1/10 of them once they emitted 10 tokens in 100 (then it is charged whole)
    assert cold(100, 32) == {"sd/4"}
    chooser.observe_tokens(Arm("ar"), 90)
    chooser.observe_tokens(Arm("sd", 4), 10)
    assert chooser.used("draft") == pytest.approx(0.1)
    assert cold(100, 32) == {"ar"}
    slim = Chooser(costs, [Arm("ar"), Arm("self", 4)], adapt=False)
    slim.observe([("slim", "full", 900, 1000)])
    assert {slim.choose(rng, {"slim": 100}, remaining=256).label for _ in range(20)} == {"ar"}
    assert {slim.choose(rng, {"slim": 0}, remaining=256).label for _ in range(20)} == {"self/4"}

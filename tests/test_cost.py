"""Costs against an independent numpy/scipy computation, including distributions with exact zeros."""

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon
from scipy.special import rel_entr

from dimr import cost
from dimr.divergence import tv_log
from dimr.errors import DimrError


def _dists(rng: np.random.Generator, n: int, v: int, zeros: bool) -> np.ndarray:
    p = rng.dirichlet(np.full(v, 0.5), size=n)
    if zeros:
        p[rng.random((n, v)) < 0.3] = 0.0
        p[:, 0] += 1e-3  # every row keeps some mass
        p /= p.sum(-1, keepdims=True)
    return p


def _logp(p: np.ndarray) -> torch.Tensor:
    with np.errstate(divide="ignore"):
        return torch.from_numpy(np.log(p))


@pytest.fixture(params=[False, True], ids=["dense", "zeros"])
def dists(request):
    rng = np.random.default_rng(0)
    full, slim, draft = (_dists(rng, 12, 17, request.param) for _ in range(3))
    if request.param:
        # KL(a‖b) is finite only where b > 0 wherever a > 0: give slim the union of supports
        slim = np.where((full > 0) | (draft > 0), np.maximum(slim, 1e-4), slim)
        slim /= slim.sum(-1, keepdims=True)
    return full, slim, draft


def test_costs_match_scipy(dists):
    full, slim, draft = dists
    lf, ls, ld = _logp(full), _logp(slim), _logp(draft)
    expected = {
        "kl": rel_entr(full, slim).sum(-1),
        "reverse-kl": rel_entr(slim, full).sum(-1),
        "js": jensenshannon(full, slim, axis=-1) ** 2,
        "bridge": rel_entr(draft, slim).sum(-1) + rel_entr(slim, full).sum(-1),
    }
    for name, fn in cost.COSTS.items():
        got = fn(lf, ls, ld).numpy()
        np.testing.assert_allclose(got, expected[name], rtol=1e-9, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(tv_log(lf, ls).numpy(), 0.5 * np.abs(full - slim).sum(-1), rtol=1e-9)
    np.testing.assert_allclose(cost.expected_acceptance(lf, ls).numpy(),
                               1 - 0.5 * np.abs(full - slim).sum(-1), rtol=1e-9)
    np.testing.assert_array_equal(cost.top1_agreement(lf, ls).numpy(),
                                  (full.argmax(-1) == slim.argmax(-1)).astype(float))


def test_kl_is_inf_where_slim_misses_full_support():
    full = torch.tensor([[0.5, 0.5, 0.0]]).log()
    slim = torch.tensor([[1.0, 0.0, 0.0]]).log()
    assert torch.isinf(cost.kl(full, slim)).all()
    assert torch.isfinite(cost.reverse_kl(full, slim)).all()
    assert torch.isfinite(cost.js(full, slim)).all()


def test_identical_distributions_cost_nothing(dists):
    full = _logp(dists[0])
    for name, fn in cost.COSTS.items():
        assert torch.allclose(fn(full, full, full), torch.zeros(12, dtype=full.dtype), atol=1e-12), name


def test_evaluate_logits_means_and_chunks(dists):
    full, slim, draft = dists
    logits_f = _logp(full).float() + 3.0  # unnormalised: evaluate_logits re-normalises
    logits_s, logits_d = _logp(slim).float(), _logp(draft).float()
    keep = torch.ones(12, dtype=torch.bool)
    keep[::3] = False
    for name in cost.COSTS:
        m = cost.evaluate_logits(logits_f.view(3, 4, -1), logits_s.view(3, 4, -1), name,
                                 draft_logp=logits_d.view(3, 4, -1), token_mask=keep.view(3, 4), chunk=5)
        per = cost.COSTS[name](_logp(full), _logp(slim), _logp(draft)).numpy()[keep.numpy()]
        assert set(m) == {"cost", "top1_agreement", "expected_acceptance"}
        assert all(isinstance(v, float) for v in m.values())
        assert m["cost"] == pytest.approx(per.mean(), rel=1e-4, abs=1e-6), name
        k = keep.numpy()
        tv = 0.5 * np.abs(full - slim).sum(-1)[k]
        assert m["expected_acceptance"] == pytest.approx(1 - tv.mean(), rel=1e-5)
        assert m["top1_agreement"] == pytest.approx((full.argmax(-1) == slim.argmax(-1))[k].mean())


def test_registry_and_errors():
    assert cost.DEFAULT_COST == "kl" and set(cost.COSTS) == {"kl", "reverse-kl", "js", "bridge"}
    with pytest.raises(DimrError, match="unknown cost"):
        cost.get_cost("l2")
    x = torch.zeros(2, 3).log_softmax(-1)
    with pytest.raises(ValueError, match="draft"):
        cost.bridge(x, x)

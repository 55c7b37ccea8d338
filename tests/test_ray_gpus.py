"""The Ray pool's GPU branch on a Ray instance that declares GPUs (Ray's logical resources; this machine has
none): one actor per GPU, each given its own device, and masks still scored as the local scorer scores them.

Its own module: one Ray instance per process, and this one must be started with GPUs.
"""

from __future__ import annotations

import pytest

from dimr.calibration import load_calibration
from dimr.pairs import get_pair, load_tokenizer
from workers import EvalSpec
from workers.local import MaskScorer

ray = pytest.importorskip("ray")
from workers.ray_pool import RayPool  # noqa: E402


def test_one_actor_per_gpu_each_on_its_own_device():
    pair = get_pair("tiny-random")
    calib = load_calibration(pair.calibration, load_tokenizer(pair), num_sequences=4, seq_len=32)
    spec = EvalSpec(pair=pair, input_ids=calib.input_ids, cost="kl")
    pool = RayPool(spec, workers=3, num_cpus=4, num_gpus=2)
    try:
        assert pool.slots == 2  # three workers asked, two GPUs: one actor per GPU
        seen = ray.get([a.placement.remote() for a in pool._actors])
        assert sorted(p["gpu_ids"][0] for p in seen) == ["0", "1"]
        assert all(len(p["gpu_ids"]) == 1 and p["visible"] == p["gpu_ids"][0] for p in seen)
        # no CUDA on this machine, so each scores on the CPU; on a GPU box each gets cuda:0 of its own GPU
        masks = [(True,) * 5 + (False,) * 3, (False,) + (True,) * 6 + (False,)]
        for ticket, mask in enumerate(masks):
            pool.submit(ticket, mask)
        got: dict = {}
        while len(got) < len(masks):
            got.update(pool.wait(timeout=60))
        local = MaskScorer(spec)
        for ticket, mask in enumerate(masks):
            assert got[ticket].cost == pytest.approx(local.score(mask).cost, rel=1e-5)
    finally:
        pool.close()
    assert not ray.is_initialized()


def test_cpu_device_ignores_the_gpus():
    pair = get_pair("tiny-random")
    calib = load_calibration(pair.calibration, load_tokenizer(pair), num_sequences=4, seq_len=32)
    spec = EvalSpec(pair=pair, input_ids=calib.input_ids, cost="kl", device="cpu")
    pool = RayPool(spec, workers=3, num_cpus=4, num_gpus=2)
    try:
        assert pool.slots == 3  # CPU shares, as many actors as asked
        assert all(p["gpu_ids"] == [] and p["device"] == "cpu"
                   for p in ray.get([a.placement.remote() for a in pool._actors]))
    finally:
        pool.close()


def test_gpus_per_worker_gives_each_actor_k_gpus():
    from dataclasses import replace

    from dimr.errors import DimrError

    pair = get_pair("tiny-random")
    calib = load_calibration(pair.calibration, load_tokenizer(pair), num_sequences=2, seq_len=16)
    spec = EvalSpec(pair=pair, input_ids=calib.input_ids, cost="kl", gpus_per_worker=2)
    pool = RayPool(spec, workers=3, num_cpus=4, num_gpus=4)
    try:
        assert pool.slots == 2  # four GPUs, two per worker
        seen = ray.get([a.placement.remote() for a in pool._actors])
        assert sorted(g for p in seen for g in p["gpu_ids"]) == ["0", "1", "2", "3"]
        assert all(len(p["gpu_ids"]) == 2 for p in seen)
    finally:
        pool.close()
    with pytest.raises(DimrError, match="--gpus-per-worker 8 but the Ray cluster has 4 GPU"):
        RayPool(replace(spec, gpus_per_worker=8), workers=1, num_cpus=2, num_gpus=4)
    assert not ray.is_initialized()

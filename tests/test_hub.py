"""Hub models on first run, offline: one download before the workers (a real offline `snapshot_download` over a
local Hugging Face cache), the gated-repo hint, the token for Ray actors, checkpoint identity, the revision in
the study settings, and the decoder's untimed forwards."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from cli_runner import cli
from transformers import AutoModelForCausalLM

from dimr.errors import DimrError
from dimr.hub import checkpoint_digest, fetch, weight_digest
from dimr.pairs import Pair
from dimr.search.settings import StudySettings, check_resume
from dimr.slim_config import apply_slim_config, load_slim_config

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, tiny_pair, monkeypatch):
    """A Hugging Face cache holding ``dimr-test/verifier`` and ``dimr-test/draft`` at ``main`` = COMMIT, as
    ``snapshot_download`` leaves it; the hub itself stays unreachable (HF_HUB_OFFLINE)."""
    from huggingface_hub import constants

    from dimr.pairs import prepare

    prepare(tiny_pair)
    cache = tmp_path / "hub"
    for which in ("verifier", "draft"):
        repo = cache / f"models--dimr-test--{which}"
        shutil.copytree(getattr(tiny_pair, which), repo / "snapshots" / COMMIT)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def hub_pair(tiny_pair, revision="main") -> Pair:
    return Pair("hub-test", "dimr-test/draft", "dimr-test/verifier", revision=revision, dtype="float32",
                calibration=tiny_pair.calibration)


def test_fetch_resolves_the_commit_and_gives_local_snapshots(hub_cache, tiny_pair):
    got = fetch(hub_pair(tiny_pair))
    assert got.verifier_commit == got.draft_commit == COMMIT
    assert Path(got.pair.verifier) == hub_cache / "models--dimr-test--verifier" / "snapshots" / COMMIT
    assert got.pair.revision is None and (Path(got.pair.verifier) / "config.json").is_file()


def test_search_downloads_once_and_records_revision_commit_weights(hub_cache, tiny_pair, tmp_path, capsys):
    pairs = tmp_path / "pairs.toml"
    pairs.write_text(f'[pairs.hub-test]\ndraft = "dimr-test/draft"\nverifier = "dimr-test/verifier"\n'
                     f'revision = "main"\ndtype = "float32"\ncalibration = "{tiny_pair.calibration}"\n')
    db = f"sqlite:///{tmp_path / 'd.db'}"
    code, out, err = cli(capsys, "search", "--pair", "hub-test", "--pairs-file", str(pairs), "--budget", "2",
                         "--trials", "3", "--num-sequences", "2", "--seq-len", "16", "--storage", db, "--study", "h",
                         "--device", "cpu")
    assert code == 0, out + err
    from dimr.studies import load_study
    from storage import open_storage

    settings = load_study(open_storage(db), "h").user_attrs["dimr_settings"]
    assert settings["revision"] == "main" and settings["commit"] == COMMIT
    assert settings["weights"] == checkpoint_digest(tiny_pair.verifier)
    code, out, err = cli(capsys, "export", "h", "-o", str(tmp_path / "slim.json"), "--storage", db)
    assert code == 0, out + err
    cfg = load_slim_config(tmp_path / "slim.json")
    assert (cfg.revision, cfg.commit, cfg.weights) == ("main", COMMIT, settings["weights"])


def test_gated_repo_error_keeps_the_hubs_hint(monkeypatch, tiny_pair):
    """The hub cannot be reached here, so only the hub call is replaced: it raises what the hub raises."""
    import httpx2 as httpx
    import huggingface_hub
    from huggingface_hub.errors import GatedRepoError

    message = ("401 Client Error. (Request ID: Root=1-abc)\n\nCannot access gated repo for url "
               "https://huggingface.co/google/gemma-2-9b-it/resolve/main/config.json.\nAccess to model "
               "google/gemma-2-9b-it is restricted. You must have access to it and be authenticated to access it. "
               "Please log in.")
    response = httpx.Response(401, request=httpx.Request("GET", "https://huggingface.co"))

    def gated(*a, **k):
        raise GatedRepoError(message, response=response)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", gated)
    pair = Pair("g", "google/gemma-2-2b-it", "google/gemma-2-9b-it")
    with pytest.raises(DimrError) as e:
        fetch(pair, configs_only=True)
    msg = str(e.value)
    assert "\n" not in msg and "is restricted. You must have access to it" in msg and "Please log in." in msg
    assert "hf auth login" in msg and "HF_TOKEN" in msg


def test_token_reaches_the_actors_runtime_env(monkeypatch):
    from workers.ray_pool import hub_env

    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.delenv("HF_HOME", raising=False)
    assert hub_env()["HF_TOKEN"] == "hf_secret" and "HF_HOME" not in hub_env()


@pytest.fixture
def two_checkpoints(tmp_path, tiny_pair):
    """tiny-random's verifier, and a copy with other weights: one architecture, two checkpoints."""
    from dimr.pairs import prepare

    prepare(tiny_pair)
    other = tmp_path / "other"
    model = AutoModelForCausalLM.from_pretrained(tiny_pair.verifier)
    with torch.no_grad():
        model.model.norm.weight.mul_(1.5)
    model.save_pretrained(other)
    return tiny_pair.verifier, str(other)


def test_weight_digest_tells_checkpoints_apart(two_checkpoints):
    a, b = two_checkpoints
    assert checkpoint_digest(a) != checkpoint_digest(b)
    model = AutoModelForCausalLM.from_pretrained(a)
    assert weight_digest(model) == checkpoint_digest(a)
    assert weight_digest(model.to(torch.bfloat16)) == checkpoint_digest(a)  # dtype-independent


def test_slim_config_refuses_other_weights(two_checkpoints, tmp_path):
    from dimr.slim_config import make_slim_config

    a, b = two_checkpoints
    model_a, model_b = (AutoModelForCausalLM.from_pretrained(p) for p in (a, b))
    mask = (True,) * 6 + (False,) * 2
    cfg = make_slim_config(model_a, mask, pair="tiny-random", verifier_id=a, cost="kl", metrics={"cost": 0.1},
                           calibration="c", calibration_hash="h")
    cfg.weights, cfg.commit = checkpoint_digest(a), COMMIT
    cfg.save(tmp_path / "s.json")
    assert apply_slim_config(tmp_path / "s.json", model_a) is not None
    with pytest.raises(DimrError, match="other checkpoint"):
        apply_slim_config(tmp_path / "s.json", model_b)  # same fingerprint, other weights
    cfg.weights = None  # configs written before the digest existed still apply
    cfg.save(tmp_path / "old.json")
    assert apply_slim_config(tmp_path / "old.json", model_b) is not None


def test_old_studies_without_revision_resume():
    base = dict(pair="p", verifier="v", fingerprint="f", num_layers=8, skip=2, cost="kl", calibration="c",
                calibration_hash="h", num_sequences=2, seq_len=16)
    new = StudySettings(**base, revision="main", commit=COMMIT, weights="w")
    check_resume({**base, "objective": "cost"}, new, "s")  # stored before these fields existed
    check_resume({**base, "objective": "cost", "revision": "main", "commit": "other", "weights": "w"}, new, "s")
    with pytest.raises(DimrError, match="weights: stored 'x'"):
        check_resume({**base, "objective": "cost", "revision": "main", "weights": "x"}, new, "s")
    stored = json.loads(json.dumps(new.__dict__))
    assert stored["revision"] == "main"


def test_untimed_tier_reads_no_clock(tiny_pair):
    from dimr.decoding.tiers import Tier
    from dimr.pairs import load_model

    model = load_model(tiny_pair, "verifier", "cpu")
    timed, untimed = Tier("full", model), Tier("full", model, timed=False)
    ids = torch.tensor([1, 2, 3])
    a, b = timed.forward(ids, keep=1), untimed.forward(ids, keep=1)
    assert torch.equal(a, b) and untimed.calls == timed.calls == 1
    assert timed.seconds > 0 and untimed.seconds == 0 and untimed.cpu_seconds == 0


def test_bfloat16_by_default_on_a_gpu():
    from dimr.pairs import model_dtype

    assert model_dtype(Pair("p", "d", "v", dtype="float32"), "cuda") == torch.bfloat16
    assert model_dtype(Pair("p", "d", "v", dtype="auto"), "cuda:1") == torch.bfloat16
    assert model_dtype(Pair("p", "d", "v", dtype="float16"), "cuda") == torch.float16
    assert model_dtype(Pair("p", "d", "v", dtype="float32"), "cpu") == torch.float32
    assert model_dtype(Pair("p", "d", "v"), "cpu") == torch.float32

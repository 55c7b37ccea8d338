"""Test-wide settings: offline hub, a private DIMR_HOME, few threads."""

import os
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("DIMR_HOME", tempfile.mkdtemp(prefix="dimr-home-"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(scope="session")
def tiny_pair():
    from dimr.pairs import get_pair

    return get_pair("tiny-random")

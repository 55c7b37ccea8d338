"""Evaluations that keep failing, or run out of memory, stop the search with one line; the study resumes."""

from __future__ import annotations

import optuna
import pytest
import torch
from optuna.trial import TrialState

from dimr.calibration import load_calibration
from dimr.errors import DimrError
from dimr.pairs import get_pair, load_tokenizer, verifier_fingerprint
from dimr.search import Search, SearchOptions, StudySettings
from dimr.search.driver import MAX_CONSECUTIVE_FAILURES, is_out_of_memory
from storage import open_storage
from workers import EvalSpec
from workers.local import LocalEvaluator


class Flaky(LocalEvaluator):
    """The real in-process evaluator whose scorer raises ``errors[i]`` on its i-th mask (None: scores it)."""

    def __init__(self, spec, errors):
        super().__init__(spec)
        self.errors, self.calls = list(errors), 0
        real = self.scorer.score

        def score(mask):
            self.calls += 1
            error = self.errors.pop(0) if self.errors else None
            if error is not None:
                raise error
            return real(mask)

        self.scorer.score = score


@pytest.fixture(scope="module")
def setup():
    pair = get_pair("tiny-random")
    calib = load_calibration(pair.calibration, load_tokenizer(pair), num_sequences=2, seq_len=16)
    settings = StudySettings(pair=pair.name, verifier=pair.verifier, fingerprint=verifier_fingerprint(pair),
                             num_layers=8, skip=2, cost="kl", calibration=calib.spec, calibration_hash=calib.hash,
                             num_sequences=2, seq_len=16)
    return settings, EvalSpec(pair=pair, input_ids=calib.input_ids, device="cpu")


def search(url, setup, evaluator, trials=8):
    settings, _ = setup
    return Search(open_storage(url), "s", settings, SearchOptions(trials, 0, "random", 0), evaluator).run()


def states(url):
    return [t.state for t in optuna.load_study(study_name="s", storage=open_storage(url)).trials]


def test_consecutive_failures_stop_and_the_study_resumes(tmp_path, setup):
    url = f"sqlite:///{tmp_path / 'd.db'}"
    always = Flaky(setup[1], [ValueError("broken\nscorer")] * 100)
    with pytest.raises(DimrError, match=f"{MAX_CONSECUTIVE_FAILURES} evaluations in a row failed, the last "
                                        "with ValueError: broken scorer; fix the cause") as e:
        search(url, setup, always)
    assert "\n" not in str(e.value)
    assert always.calls == MAX_CONSECUTIVE_FAILURES
    assert states(url).count(TrialState.FAIL) == MAX_CONSECUTIVE_FAILURES
    result = search(url, setup, Flaky(setup[1], []))  # resumable: the failed masks are retried
    assert result.complete == 8


def test_failures_between_successes_do_not_stop(tmp_path, setup):
    url = f"sqlite:///{tmp_path / 'd.db'}"
    errors = ([ValueError("once")] * (MAX_CONSECUTIVE_FAILURES - 1) + [None]) * 2
    assert search(url, setup, Flaky(setup[1], errors)).complete == 8


def test_out_of_memory_stops_at_once_naming_the_knob(tmp_path, setup):
    url = f"sqlite:///{tmp_path / 'd.db'}"
    oom = Flaky(setup[1], [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 7.81 GiB")])
    with pytest.raises(DimrError, match="ran out of memory .*lower --batch-size") as e:
        search(url, setup, oom)
    assert oom.calls == 1 and "the study resumes" in str(e.value)
    assert search(url, setup, Flaky(setup[1], [])).complete == 8


def test_out_of_memory_is_recognised_through_ray():
    from ray.exceptions import OutOfMemoryError as RayOOM
    from ray.exceptions import RayTaskError

    wrapped = RayTaskError("score", "Traceback ...", torch.OutOfMemoryError("CUDA out of memory")).as_instanceof_cause()
    assert is_out_of_memory(wrapped)
    assert is_out_of_memory(RayOOM("Task was killed due to the node running low on memory."))
    assert is_out_of_memory(MemoryError())
    assert not is_out_of_memory(ValueError("shape mismatch"))


def test_interrupt_between_start_and_flight_leaves_no_running_trial(tmp_path, setup, monkeypatch):
    """Ctrl-C can land after a trial's start committed and before the driver holds it: it is failed too."""
    from dimr.search import driver

    url, real, calls = f"sqlite:///{tmp_path / 'd.db'}", driver.Driver._launch, []

    def launch(self, started, mask):
        calls.append(started.trial.number)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, started, mask)

    monkeypatch.setattr(driver.Driver, "_launch", launch)
    with pytest.raises(driver.SearchInterrupted):
        search(url, setup, Flaky(setup[1], []))
    assert TrialState.RUNNING not in states(url)
    assert states(url)[calls[2]] == TrialState.FAIL  # the started trial nobody held
    monkeypatch.setattr(driver.Driver, "_launch", real)
    assert search(url, setup, Flaky(setup[1], [])).complete == 8  # its mask was released for the retry

"""Mask evaluation on a pool of Ray actors: one actor per GPU (per ``--gpus-per-worker`` GPUs, the verifier then
spread over them), or small CPU shares without GPUs.

Each actor builds one `MaskScorer`: it loads the verifier once and keeps the prefix cache (from which the
reference is recomputed) for the *whole* calibration set, and scores whole masks. One mask is one Ray task on one
actor, so N actors keep N trials in flight with no cross-actor reduction: a trial's latency is one
actor's forward (no straggler shard), the GPU sees full batches, and a dead actor costs the trials it
held (one, or two running ahead). Sharding the calibration set across actors would only pay off when it
does not fit beside the model on one GPU; then lower ``--num-sequences`` or use bigger GPUs first.

Two deep: a pool of at least `AHEAD_MIN` actors asks the driver for ``ahead`` = one more mask per actor,
and each actor holds up to two ``score`` tasks. Ray runs an actor's calls one after another, so its second
mask starts the moment the first ends, without waiting for the driver to collect the result, tell it and
ask for the next mask: the driver is off every worker's critical path. Smaller pools keep one task each.

Faults: actors restart up to ``max_restarts`` times (reloading the verifier); the tasks in flight on a
dying actor (one or two) come back from `wait` as exceptions, so the driver fails those trials and retries
their masks. An actor out of restarts is dropped and ``slots`` shrinks.

A local Ray instance (no ``address``) keeps every file in a temp dir of the run, runs no dashboard and
writes nothing to ``~/.ray``: its auth token lives in that temp dir too. ``address`` (or ``auto``) joins
an existing cluster instead; then every node needs dimr installed (``pip install -e .`` or a wheel).
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError

from dimr.errors import DimrError
from dimr.masks import SublayerMask
from workers.base import EvalSpec, Evaluation

PROBE_EVERY_S = 1.0  # how often a restarting actor is asked whether it is back
CONNECT_TIMEOUT_S = 5.0  # how long an unreachable --ray-address is tried
START_TIMEOUT_S = 900.0  # loading a 70B verifier onto a GPU takes minutes
AHEAD_MIN = 4  # from this many live actors on, each holds two tasks (``ahead``); fewer: one task each
_AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
HUB_VARS = ("HF_TOKEN", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE")  # what actors need to read gated models


def hub_env() -> dict[str, str]:
    """The driver's hub settings (token, cache), for the actors' runtime env: on a cluster, workers do not
    inherit the driver's environment."""
    return {k: os.environ[k] for k in HUB_VARS if os.environ.get(k)}


class ScorerActor:
    """The body of one Ray worker: a `MaskScorer` built once, then asked to score masks."""

    def __init__(self, spec: EvalSpec, name: str):
        from workers.local import MaskScorer

        self.scorer = MaskScorer(spec, name)

    def ready(self) -> int:
        """Answers once the verifier and the calibration cache are loaded: the verifier's layer count."""
        return self.scorer.num_layers

    def pid(self) -> int:
        return os.getpid()

    def placement(self) -> dict:
        """Where Ray put this worker: its GPU ids, what CUDA sees, and the torch device it scores on."""
        return {"gpu_ids": [str(i) for i in ray.get_gpu_ids()], "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "device": str(self.scorer.device)}

    def score(self, mask: tuple[bool, ...]) -> Evaluation:
        return self.scorer.score(mask)

    def block_influence(self) -> list[float]:
        return self.scorer.block_influence()

    def sublayer_influence(self) -> list[float]:
        return self.scorer.sublayer_influence()


def check_address(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """DimrError, within ``timeout_s``, if nothing listens at ``address`` (host:port or ray://host:port): Ray's own
    connect would retry for minutes. ``auto`` is left to Ray, which fails at once when no cluster runs here."""
    if address == "auto":
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DimrError(f"--ray-address {address!r} is not host:port (or auto); e.g. 10.0.0.1:6379")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise DimrError(f"cannot reach Ray at --ray-address {address} ({e.strerror or e}); start the cluster "
                        "(`ray start --head`) or fix the address") from None


def cpu_share(total_cpus: float, workers: int) -> float:
    """CPUs reserved per CPU-only actor: together at most ``total − 1`` (one core stays free for the driver
    and other Ray tasks), and at most half a core each, so actors never block every further task."""
    return max(0.01, min(0.5, (total_cpus - 1) / max(1, workers)))


def _reload_auth_token() -> None:
    """Ray caches the auth token per process; a second local instance in one process needs a fresh read."""
    try:
        from ray._raylet import AuthenticationTokenLoader

        AuthenticationTokenLoader.instance().reset_cache()
    except (ImportError, AttributeError):  # older Ray: no token auth
        pass


def _start_reaper(temp_dir: str, pythonpath: str) -> tuple[subprocess.Popen, int]:
    """Start `workers.ray_reaper` on ``temp_dir``; return the pipe's write end, which only this process holds
    (not inheritable): its closing, by `LocalRay.close` or by this process's death, starts the sweep."""
    read, write = os.pipe()
    reaper = subprocess.Popen([sys.executable, "-m", "workers.ray_reaper", str(read), temp_dir], pass_fds=(read,),
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True, env={**os.environ, "PYTHONPATH": pythonpath})
    os.close(read)
    return reaper, write


class LocalRay:
    """A private Ray instance of this process: files under a temp dir of the run, no dashboard, and
    nothing written to ``~/.ray`` (Ray 2.5x turns token auth on and would save the token there; the token
    lives in the temp dir instead). `close` stops it and removes the temp dir."""

    def __init__(self, num_cpus: int, temp_dir: str | None = None, num_gpus: int | None = None):
        # Short path: Ray's unix sockets live under it and must stay below ~107 characters.
        self.temp_dir = tempfile.mkdtemp(prefix="dimr-ray-", dir=temp_dir)
        self._saved_env = {k: os.environ.get(k) for k in _AUTH_VARS}
        if not any(self._saved_env.values()):
            token = Path(self.temp_dir) / "auth_token"
            token.write_text(secrets.token_hex(32))
            token.chmod(0o600)
            os.environ["RAY_AUTH_TOKEN_PATH"] = str(token)
            _reload_auth_token()
        root = str(Path(__file__).resolve().parents[1])  # the checkout, for runs without an install
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        ctx = ray.init(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False, _temp_dir=self.temp_dir,
                       log_to_driver=False, configure_logging=False,
                       runtime_env={"env_vars": {"PYTHONPATH": path, **hub_env()}})
        self.address: str = ctx.address_info["gcs_address"]
        self._reaper, self._reaper_fd = _start_reaper(self.temp_dir, path)

    def join_env(self) -> dict[str, str]:
        """What another process on this machine needs in its environment to join with ``address``."""
        return {k: os.environ[k] for k in _AUTH_VARS if k in os.environ}

    def close(self) -> None:
        ray.shutdown()
        os.close(self._reaper_fd)  # the reaper sweeps what shutdown left, and the temp dir
        try:
            self._reaper.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _reload_auth_token()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


class RayPool:
    """The `Evaluator` interface over Ray actors; see the module docstring."""

    def __init__(self, spec: EvalSpec, workers: int = 2, address: str | None = None, *,
                 actor_cls: type = ScorerActor, max_restarts: int = 2, cpus_per_worker: float | None = None,
                 num_cpus: int | None = None, temp_dir: str | None = None, num_gpus: int | None = None):
        self._local: LocalRay | None = None
        self._connected = False
        if not ray.is_initialized():
            if address is None:
                self._local = LocalRay(num_cpus or os.cpu_count() or 1, temp_dir, num_gpus)
            else:
                check_address(address)
                try:
                    ray.init(address=address, log_to_driver=False, runtime_env={"env_vars": hub_env()})
                except ConnectionError as e:
                    raise DimrError(f"cannot join Ray at --ray-address {address} ({str(e).splitlines()[0]}); "
                                    "start the cluster (`ray start --head`) or fix the address") from None
            self._connected = True
        resources = ray.cluster_resources()
        gpus = int(resources.get("GPU", 0))
        on_gpu = gpus > 0 and (spec.device is None or spec.device.startswith("cuda"))
        per = max(1, getattr(spec, "gpus_per_worker", 1))
        if on_gpu:
            if gpus < per:
                self.close()
                raise DimrError(f"--gpus-per-worker {per} but the Ray cluster has {gpus} GPU(s); lower it")
            n, opts = min(workers, gpus // per), {"num_gpus": per, "num_cpus": 1}
        else:
            share = cpus_per_worker or cpu_share(resources.get("CPU", 1.0), workers)
            n, opts = workers, {"num_cpus": share}
        remote = ray.remote(actor_cls).options(max_restarts=max_restarts, max_task_retries=0, **opts)
        self._actors = [remote.remote(spec, f"ray-{i}") for i in range(n)]
        self._state = ["idle"] * n  # idle | busy (1 or 2 tasks outstanding) | probing | dead
        self._load = [0] * n  # score tasks outstanding per actor
        self._epoch = [0] * n  # bumped when a restarted actor is back: older tasks' deaths are already counted
        self._work: dict[Any, tuple[int, int, int]] = {}  # score ref -> (ticket, actor index, epoch)
        self._probes: dict[Any, int] = {}  # ready ref -> actor index
        self._reprobe: dict[int, float] = {}  # actor index -> when to ask again
        self._queue: list[tuple[int, tuple[bool, ...]]] = []
        try:
            layers = ray.get([a.ready.remote() for a in self._actors], timeout=START_TIMEOUT_S)
        except GetTimeoutError:
            self.close()
            raise RuntimeError(f"{n} Ray workers ({opts}) did not start within {START_TIMEOUT_S:.0f} s; "
                               f"the cluster has {resources}") from None
        except BaseException:
            self.close()
            raise
        self.num_layers = layers[0]

    # -- the Evaluator interface ----------------------------------------------------------------------
    @property
    def slots(self) -> int:
        """Live actors (restarting ones included): the driver keeps this many trials in flight."""
        return sum(s != "dead" for s in self._state)

    @property
    def ahead(self) -> int:
        """Masks the driver keeps in flight beyond ``slots``: one per live actor from `AHEAD_MIN` actors on."""
        live = self.slots
        return live if live >= AHEAD_MIN else 0

    @property
    def depth(self) -> int:
        """Score tasks one actor may hold: 2 while the pool runs ahead, else 1."""
        return 2 if self.ahead else 1

    def submit(self, ticket: int, mask: tuple[bool, ...]) -> None:
        self._queue.append((ticket, mask if isinstance(mask, SublayerMask) else tuple(mask)))
        self._dispatch()

    def wait(self, timeout: float | None = None) -> list[tuple[int, Evaluation | BaseException]]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._probe_due()
            self._dispatch()
            out: list[tuple[int, Evaluation | BaseException]] = []
            if not self.slots:  # nobody left to run what is queued
                out = [(t, RuntimeError("every Ray worker died")) for t, _ in self._queue]
                self._queue.clear()
                return out
            refs = list(self._work) + list(self._probes)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self._reprobe:
                next_probe = max(0.0, min(self._reprobe.values()) - time.monotonic())
                left = next_probe if left is None else min(left, next_probe)
            if not refs and not self._queue and not self._reprobe:
                return []
            if refs:
                done, _ = ray.wait(refs, num_returns=1, timeout=left)
                if done:
                    done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
                for ref in done:
                    if ref in self._work:
                        out.append(self._finish(ref))
                    else:
                        self._probed(ref)
            elif left:
                time.sleep(left)
            if out or (deadline is not None and time.monotonic() >= deadline):
                self._dispatch()  # what queued behind the finished tasks starts before the driver tells them
                return out

    def block_influence(self) -> list[float]:
        return self._on_idle_actor("block_influence")

    def sublayer_influence(self) -> list[float]:
        return self._on_idle_actor("sublayer_influence")

    def _on_idle_actor(self, method: str) -> list[float]:
        for i, actor in enumerate(self._actors):
            if self._state[i] == "idle":
                try:
                    return ray.get(getattr(actor, method).remote())
                except RayActorError:
                    self._lost(i)
        raise RuntimeError(f"no idle Ray worker to compute {method.replace('_', ' ')}")

    def close(self) -> None:
        """Kill the actors, and shut down what this pool started or connected."""
        if ray.is_initialized():
            for actor in getattr(self, "_actors", []):
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:  # noqa: BLE001 - already gone
                    pass
        if self._local is not None:
            self._local.close()
        elif self._connected:
            ray.shutdown()
        self._actors, self._state = [], []
        self._local, self._connected = None, False

    # -- helpers -------------------------------------------------------------------------------------
    def worker_pids(self) -> list[int]:
        """PIDs (on their nodes) of the actors that are up now, in actor order."""
        up = [a for a, s in zip(self._actors, self._state, strict=True) if s in ("idle", "busy")]
        return ray.get([a.pid.remote() for a in up])

    def _dispatch(self) -> None:
        """Queued masks to idle actors first, then (running ahead) to actors with one task outstanding."""
        for load in range(self.depth):
            for i, state in enumerate(self._state):
                if not self._queue:
                    return
                if state in ("idle", "busy") and self._load[i] == load:
                    ticket, mask = self._queue.pop(0)
                    self._work[self._actors[i].score.remote(mask)] = (ticket, i, self._epoch[i])
                    self._load[i] += 1
                    self._state[i] = "busy"

    def _finish(self, ref) -> tuple[int, Evaluation | BaseException]:
        ticket, i, epoch = self._work.pop(ref)
        if epoch == self._epoch[i]:
            self._load[i] -= 1
        try:
            result = ray.get(ref)
        except RayActorError as e:  # the actor died under the task: it restarts, or it is gone
            self._lost(i, epoch)
            return ticket, e
        except Exception as e:  # noqa: BLE001 - the scorer raised: the actor is fine, the trial failed
            result = e
        if self._state[i] == "busy" and not self._load[i]:
            self._state[i] = "idle"
        return ticket, result

    def _lost(self, i: int, epoch: int | None = None) -> None:
        """Actor ``i`` died: probe it until it is back or gone. Its other tasks' deaths (same epoch, or one
        already restarted past) count once."""
        if self._state[i] in ("probing", "dead") or (epoch is not None and epoch != self._epoch[i]):
            return
        self._state[i] = "probing"
        self._reprobe[i] = 0.0

    def _probe_due(self) -> None:
        now = time.monotonic()
        for i, when in list(self._reprobe.items()):
            if when <= now:
                del self._reprobe[i]
                self._probes[self._actors[i].ready.remote()] = i

    def _probed(self, ref) -> None:
        i = self._probes.pop(ref)
        try:
            ray.get(ref)
        except ActorDiedError:  # out of restarts: the pool shrinks
            self._state[i] = "dead"
        except RayActorError:  # still restarting
            self._reprobe[i] = time.monotonic() + PROBE_EVERY_S
        else:  # back (restarted): whatever it held died with it
            self._epoch[i] += 1
            self._load[i] = 0
            self._state[i] = "idle"

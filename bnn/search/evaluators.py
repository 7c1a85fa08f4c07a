"""Where candidates are trained, behind one small interface.

``submit(job)`` hands a job (a dict with ``seq``, ``genome``, ``reject_below``) to a free slot;
``poll(timeout=None)`` returns ``[(seq, result), ...]`` of finished jobs, blocking until one
finishes; the pools return ``[]`` after ``timeout`` seconds without one (the engine polls in
short slices, to see a Ctrl-C between them), while the serial evaluator runs the job itself
(``trains_in_process``); ``slots`` is how many jobs may run at once; ``close()`` ends the workers, dropping a job still running (the
engine closes with jobs out only when interrupted; resume re-runs them). A result is always a
dict (``Worker.run`` turns exceptions into ``status: "error"``), so one bad candidate never stops
the search.

* ``SerialEvaluator``: in this process, one job at a time (the default; exactly Algorithm 1).
* ``LocalPoolEvaluator``: N spawned processes, pinned to the GPUs in turn through
  ``CUDA_VISIBLE_DEVICES`` (``--workers-per-device K``: K on each), each loading the data set
  once. A worker process that dies is restarted and its job retried; a worker dies with the
  search (``die_with_parent``), so a SIGKILLed search leaves none behind.
  Ctrl-C is the search's alone: a terminal sends SIGINT to the whole process group, and a worker
  starts with SIGINT blocked (``_sigint_blocked``) and ignores it once running, so none dies in
  the middle of its imports and is restarted while the search stops.
* ``RayEvaluator``: one long-lived actor per GPU (K per GPU, each asking for 1/K of it, with
  ``--workers-per-device K``), or per CPU worker when the cluster has none; Ray restarts a dead
  actor and retries the task on it.
"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import signal
import time

from ..common.liveness import die_with_parent
from .fitness import Worker

MAX_RETRIES = 2  # retries of one job after its worker process died (not after application errors)


class SerialEvaluator:
    """Runs each job in this process, one at a time, when polled (the serial backend)."""
    slots = 1
    trains_in_process = True

    def __init__(self, fitness_spec: str, train: dict):
        self.worker = Worker(fitness_spec, train)
        self.queue: list[dict] = []
        self.busy_s = 0.0  # time spent inside the fitness function (to measure engine overhead)

    def submit(self, job: dict) -> None:
        """Queue a job; it runs at the next poll."""
        self.queue.append(job)

    def poll(self, timeout: float | None = None) -> list[tuple[int, dict]]:
        """Run the oldest queued job to the end and return its (seq, result)."""
        job = self.queue.pop(0)  # run here, to the end: the engine lets Ctrl-C interrupt it
        t0 = time.perf_counter()
        res = self.worker.run(job)
        self.busy_s += time.perf_counter() - t0
        return [(job["seq"], res)]

    @property
    def outstanding(self) -> int:
        """Jobs queued and not yet run."""
        return len(self.queue)

    def close(self) -> None:
        """Nothing to release: no process or thread was started."""


# -- local worker processes ------------------------------------------------------------------------

@contextlib.contextmanager
def _sigint_blocked():
    """SIGINT held pending in this thread while worker processes start. A child inherits the
    blocked mask through fork and exec, so a Ctrl-C cannot kill it during its imports (seconds
    for torch), before ``_pool_main`` ignores SIGINT; the search gets its own SIGINT as soon as
    the mask is restored. CPython's resource tracker starts itself the same way."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no process groups to signal
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _pool_main(fitness_spec, train, jobs, results, parent_pid=None, alive=None):
    # Runs in a spawned child whose CUDA_VISIBLE_DEVICES was set before it started, so the one
    # GPU it sees is "cuda:0" and torch never initializes the others.
    if alive is not None:
        die_with_parent(parent_pid, alive)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it closes us
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked since start; now ignored
    worker = Worker(fitness_spec, train)
    while True:
        job = jobs.get()
        if job is None:
            return
        results.put((job["seq"], worker.run(job)))


def pool_devices(gpus: list[str], workers: int) -> list[str | None]:
    """The GPU of each of ``workers`` local workers, the GPUs in turn (worker i on ``gpus[i % len(gpus)]``),
    or None for each (the CPU) when there is no GPU."""
    return [gpus[i % len(gpus)] if gpus else None for i in range(workers)]


def assign_devices(gpus: list[str], per_device: int) -> list[str | None]:
    """``--workers-per-device K``: K workers on each of ``gpus``, pinned to it (K x len(gpus) in all);
    without a GPU the CPU is the one device: K CPU workers sharing its cores."""
    if per_device < 1:
        raise ValueError(f"workers per device must be a positive integer, got {per_device!r}")
    return pool_devices(gpus, per_device * max(1, len(gpus)))


class LocalPoolEvaluator:
    """Worker processes on this machine (spawned; pinned to GPUs in turn when there are GPUs); restarts a dead one."""
    trains_in_process = False

    def __init__(self, fitness_spec: str, train: dict, workers: int, gpus: list[str]):
        self.ctx = mp.get_context("spawn")  # fork after torch/numba threads start is unsafe
        self.spec, self.train, self.gpus = fitness_spec, dict(train), gpus
        self.devices = pool_devices(gpus, workers)
        self.slots = workers
        self.results = self.ctx.Queue()
        self.procs: list = [None] * workers
        self.inboxes: list = [None] * workers
        self.alive: list = [None] * workers  # our ends of the workers' liveness pipes, never written
        self.running: list[dict | None] = [None] * workers
        self.retries: dict[int, int] = {}
        self.backlog: list[dict] = []  # jobs beyond the free workers (a resumed run may have more)
        self.busy_s = 0.0
        for i in range(workers):
            self._start(i)

    def _start(self, i: int) -> None:
        env = {}
        if self.devices[i] is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.devices[i]
        else:
            # CPU workers share the cores: without this each would start one thread per core.
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // self.slots))
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # spawn copies os.environ at start()
        try:
            inbox = self.ctx.Queue()
            theirs, ours = self.ctx.Pipe(duplex=False)
            p = self.ctx.Process(target=_pool_main, args=(self.spec, self.train, inbox, self.results, os.getpid(),
                                                          theirs), daemon=True)
            with _sigint_blocked():
                p.start()
            theirs.close()  # the worker holds the only other end: EOF there means we are gone
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        if self.alive[i] is not None:
            self.alive[i].close()  # the dead worker's pipe
        self.procs[i], self.inboxes[i], self.alive[i] = p, inbox, ours

    @property
    def outstanding(self) -> int:
        """Jobs at a worker or waiting for a free one."""
        return sum(j is not None for j in self.running) + len(self.backlog)

    def submit(self, job: dict) -> None:
        """Hand the job to a free worker, or keep it in the backlog until one is free."""
        if None not in self.running:
            self.backlog.append(job)
            return
        i = self.running.index(None)
        self.running[i] = job
        self.inboxes[i].put(job)

    def poll(self, timeout: float | None = None) -> list[tuple[int, dict]]:
        """Finished (seq, result) pairs, waiting at most ``timeout`` seconds (None: until one finishes)."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            # Checked on every poll, not only when results stop coming: otherwise a dead worker
            # hides behind a busy one until the end of the run.
            self._check_dead()
            try:
                out = [self.results.get(timeout=1.0 if end is None else max(0.0, min(1.0, end - time.monotonic())))]
                break
            except queue.Empty:
                if end is not None and time.monotonic() >= end:
                    return []
        while True:  # drain whatever else finished meanwhile
            try:
                out.append(self.results.get_nowait())
            except queue.Empty:
                break
        for s, r in out:
            for i, j in enumerate(self.running):
                if j is not None and j["seq"] == s:
                    self.running[i] = None
            self.busy_s += float(r.get("wall_s") or 0.0)
        while self.backlog and None in self.running:
            self.submit(self.backlog.pop(0))
        return out

    def _check_dead(self) -> None:
        for i, p in enumerate(self.procs):
            if p.is_alive():
                continue
            job = self.running[i]
            self._start(i)
            if job is None:
                continue
            n = self.retries.get(job["seq"], 0)
            if n < MAX_RETRIES:
                self.retries[job["seq"]] = n + 1
                self.inboxes[i].put(job)
            else:
                self.running[i] = None
                self.results.put((job["seq"], {"status": "error", "val_acc": None, "val_acc_per_epoch": [],
                                               "epochs": 0, "error": f"worker process died {n + 1} times"}))

    def close(self) -> None:
        """Idle workers get the stop job and 5 s to exit; a worker still on a job (the search was
        interrupted) is killed at once: its result would be dropped anyway, and a training does
        not look at its inbox until it ends, minutes later. Every worker is gone on return."""
        for i, p in enumerate(self.procs):
            if p is None or not p.is_alive():
                continue
            if self.running[i] is not None:
                p.kill()
                continue
            try:
                self.inboxes[i].put(None)
            except Exception:  # noqa: BLE001 - best effort at shutdown
                p.kill()
        deadline = time.time() + 5
        for p in self.procs:
            if p is not None:
                p.join(max(0.0, deadline - time.time()))
                if p.is_alive():
                    p.kill()
                    p.join(5)  # reaped: no worker outlives close()
        for c in self.alive:
            if c is not None:
                c.close()


# -- Ray -------------------------------------------------------------------------------------------

class _RayWorkerImpl:
    def __init__(self, fitness_spec, train):
        self.worker = Worker(fitness_spec, train)

    def run(self, job):
        return self.worker.run(job)

    def pid(self):
        return os.getpid()


# Ray (checked with 2.60) resolves a node address of 127.0.0.1 to the host's public address, and
# its servers then listen on every interface, unless "Ray clusters" are disabled, as they are by
# default on Windows and macOS: then the node's address is the loopback and every server (GCS,
# raylet, workers, the runtime-env agent) binds to it. The switch is read from the environment
# by each process Ray starts, and into a constant when ray is imported.
_RAY_CLUSTERS_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextlib.contextmanager
def _ray_clusters_disabled():
    try:
        from ray._private import ray_constants
    except ImportError:  # another Ray layout: start_local_ray's check still refuses a public node
        ray_constants = None
    saved_env = os.environ.get(_RAY_CLUSTERS_ENV)
    saved_const = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    os.environ[_RAY_CLUSTERS_ENV] = "0"  # inherited by the GCS, the raylet and through it the workers
    if ray_constants is not None:
        ray_constants.ENABLE_RAY_CLUSTER = False  # read when ray was imported, maybe before this
    try:
        yield
    finally:
        if ray_constants is not None:
            ray_constants.ENABLE_RAY_CLUSTER = saved_const
        if saved_env is None:
            os.environ.pop(_RAY_CLUSTERS_ENV, None)
        else:
            os.environ[_RAY_CLUSTERS_ENV] = saved_env


def start_local_ray(num_cpus: int) -> str:
    """Start a local Ray that listens on the loopback only (no dashboard); returns the node's
    address. Refuses (shuts it down, raises) if this Ray version put the node elsewhere."""
    import ray

    with _ray_clusters_disabled():
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    address = ray.nodes()[0]["NodeManagerAddress"]
    if address not in ("127.0.0.1", "::1", "localhost"):
        ray.shutdown()
        raise RuntimeError(f"a local Ray {ray.__version__} started on {address}, not on the loopback, so other "
                           "hosts could reach it: use --backend local, or start Ray yourself and pass --ray-address")
    return address


class RayEvaluator:
    """Ray actors, one per GPU of the cluster (or per CPU slot), that run the jobs (the ray backend)."""
    trains_in_process = False

    def __init__(self, fitness_spec: str, train: dict, workers: int | None, address: str | None,
                 per_device: int | None = None):
        import ray

        self.ray = ray
        if not ray.is_initialized():
            if address:  # the user's cluster, secured by Ray's own token authentication
                ray.init(address=address, log_to_driver=False)
            else:
                start_local_ray(num_cpus=max(1, per_device or workers or 1))
        gpus = int(ray.cluster_resources().get("GPU", 0))
        # --workers-per-device K: K actors per GPU of the cluster, each asking for 1/K of one (K CPU actors without GPUs).
        n = per_device * max(1, gpus) if per_device else (workers or gpus or 1)
        opts = {"max_restarts": 3, "max_task_retries": 3}
        if gpus:
            opts["num_gpus"] = 1 / per_device if per_device else 1
            train = {**train, "device": "cuda"}
        else:
            opts["num_cpus"] = 1
        self._cls = ray.remote(**opts)(_RayWorkerImpl)
        self._args = (fitness_spec, dict(train))
        self.actors = [self._cls.remote(*self._args) for _ in range(n)]
        self.slots = n
        self.running: dict = {}  # ObjectRef -> (actor index, job)
        self.backlog: list[dict] = []
        self.busy_s = 0.0

    @property
    def outstanding(self) -> int:
        """Jobs at an actor or waiting for a free one."""
        return len(self.running) + len(self.backlog)

    def submit(self, job: dict) -> None:
        """Hand the job to a free actor, or keep it in the backlog until one is free."""
        used = {i for i, _ in self.running.values()}
        free = [k for k in range(len(self.actors)) if k not in used]
        if not free:
            self.backlog.append(job)
            return
        self.running[self.actors[free[0]].run.remote(job)] = (free[0], job)

    def poll(self, timeout: float | None = None) -> list[tuple[int, dict]]:
        """Finished (seq, result) pairs, waiting at most ``timeout`` seconds; a dead actor's job is an error result."""
        ready, _ = self.ray.wait(list(self.running), num_returns=1, timeout=timeout)
        out = []
        for ref in ready:
            i, job = self.running.pop(ref)
            try:
                res = self.ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - the actor died beyond its retries
                res = {"status": "error", "val_acc": None, "val_acc_per_epoch": [], "epochs": 0,
                       "error": f"ray: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
                self.actors[i] = self._cls.remote(*self._args)  # a fresh actor for that slot
            self.busy_s += float(res.get("wall_s") or 0.0)
            out.append((job["seq"], res))
        while self.backlog and len(self.running) < len(self.actors):
            self.submit(self.backlog.pop(0))
        return out

    def close(self) -> None:
        """Kill every actor (best effort)."""
        for a in self.actors:
            try:
                self.ray.kill(a)
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass

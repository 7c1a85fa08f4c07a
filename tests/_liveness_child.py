"""A spawned worker for tests/test_worker_death.py that relies on the liveness pipe alone."""
import threading

from bnn.common.liveness import watch_liveness_pipe


def pipe_watching_worker(alive, ready):
    watch_liveness_pipe(alive)
    ready.send(True)
    ready.close()
    threading.Event().wait()  # blocked, as an idle pool worker is, until the watcher ends us

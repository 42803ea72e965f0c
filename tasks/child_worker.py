"""A long-lived worker process that parsers run in, so that input which makes a parser hang, crash
or eat memory costs the document it is in, not the run. The HTML extractor (trafilatura) and the
PDF reader (pdfium, Tesseract) use it: the parent waits for each answer with a time limit and
kills and restarts the child after a timeout or a crash.

`target(conn, *args)` runs in a spawned child: it sends ("ready", None) once it has imported what it
needs (start-up never counts against a document's limit), then answers messages on `conn`."""
from __future__ import annotations

import atexit
import multiprocessing as mp
from typing import Any, Callable

WORKER_START_TIMEOUT_S = 300
TIMEOUT = ("timeout", None)
DIED = ("died", None)


class ChildWorker:
    _all: list["ChildWorker"] = []

    def __init__(self, target: Callable, args: tuple = (), what: str = "worker"):
        self.target, self.args, self.what = target, args, what
        self.proc = None
        self.conn = None
        ChildWorker._all.append(self)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def start(self) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=self.target, args=(child, *self.args), daemon=True)
        self.proc.start()
        child.close()
        self.conn = parent
        # Starting Python and importing the parser takes seconds, more on a loaded machine: wait for
        # the worker to be ready, so that start-up never counts against a document's time limit.
        if not parent.poll(WORKER_START_TIMEOUT_S):
            self.stop()
            raise RuntimeError(f"the {self.what} process did not start in {WORKER_START_TIMEOUT_S} s")
        try:
            parent.recv()
        except EOFError:
            self.stop()
            raise RuntimeError(f"the {self.what} process died while starting (see the error above)") from None

    def stop(self) -> None:
        if self.proc is not None and self.proc.pid is not None:   # pid None: it never started
            self.proc.kill()
            self.proc.join(5)
        self.proc = self.conn = None

    def send(self, msg: Any) -> None:
        if not self.alive():
            self.start()
        self.conn.send(msg)

    def receive(self, timeout_s: float) -> tuple:
        """The child's next answer; TIMEOUT or DIED (the child is then stopped)."""
        if not self.conn.poll(timeout_s):
            self.stop()
            return TIMEOUT
        try:
            return self.conn.recv()
        except (EOFError, OSError):  # the child died (segfault, out of memory)
            self.stop()
            return DIED


@atexit.register
def _stop_all() -> None:
    for w in ChildWorker._all:
        w.stop()

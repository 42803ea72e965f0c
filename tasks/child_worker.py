"""A long-lived worker process that parsers run in, so that input which makes a parser hang, crash
or eat memory costs the document it is in, not the run. The HTML extractor (trafilatura) and the
PDF reader (pdfium, Tesseract) use it: the parent waits for each answer with a time limit and
kills and restarts the child after a timeout or a crash.

`target(conn, *args)` runs in a spawned child: it sends ("ready", None) once it has imported what it
needs (start-up never counts against a document's limit), then answers messages on `conn`.

A child never outlives the process that started it, however that one ends: it is killed by the
kernel when its parent thread exits (PR_SET_PDEATHSIG, Linux), and a thread of its own ends it when
its parent pid changes (any platform, SIGKILL of the parent included). It ignores SIGINT: Ctrl-C
reaches the whole process group, and the parent, not each child, decides what an interrupt ends
(no traceback from a child); what it runs (Tesseract) inherits both."""
from __future__ import annotations

import atexit
import importlib.machinery
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from multiprocessing import resource_tracker
from typing import Any, Callable

from quipu.catalog.processes import die_with_parent   # also pdf.py's Tesseract preexec_fn

WORKER_START_TIMEOUT_S = 300
PARENT_POLL_S = 0.2
TIMEOUT = ("timeout", None)
DIED = ("died", None)


class ChildWorker:
    _all: list["ChildWorker"] = []

    def __init__(self, target: Callable, args: tuple = (), what: str = "worker"):
        self.target, self.args, self.what = target, args, what
        self.proc = None
        self.conn = None
        self.starting = False      # launched, its "ready" not yet read
        ChildWorker._all.append(self)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def start(self) -> None:
        self.launch()
        self._await_ready()

    def launch(self) -> None:
        """Start the child without waiting for it to be ready: it imports its parser while this
        process goes on (`send` queues on the pipe; `receive` waits for "ready" first)."""
        if _ending.is_set():     # a child started now would outlive the run while it imports
            raise RuntimeError(f"not starting the {self.what} process: this run is ending")
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=_child_main, args=(self.target, os.getpid(), child, *self.args), daemon=True)
        # SIGINT blocked from the fork on (the mask survives exec): Ctrl-C while the child imports is
        # no traceback; `_child_main` then ignores it
        resource_tracker.ensure_running()    # its own start unblocks SIGINT in this thread: before ours
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        main = sys.modules["__main__"]
        spec = getattr(main, "__spec__", None)
        # the child imports what its target needs, not the parent's main script again (`quipu`: the
        # whole CLI, seconds in which the child is not yet tied to its parent)
        main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)
        try:
            self.proc.start()
        finally:
            main.__spec__ = spec
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        child.close()
        self.conn = parent
        self.starting = True

    def _await_ready(self) -> None:
        # Starting Python and importing the parser takes seconds, more on a loaded machine: wait for
        # the worker to be ready, so that start-up never counts against a document's time limit.
        if not self.starting:
            return
        self.starting = False
        if not self.conn.poll(WORKER_START_TIMEOUT_S):
            self.stop()
            raise RuntimeError(f"the {self.what} process did not start in {WORKER_START_TIMEOUT_S} s")
        try:
            self.conn.recv()
        except EOFError:
            self.stop()
            raise RuntimeError(f"the {self.what} process died while starting (see the error above)") from None

    def stop(self) -> None:
        if self.proc is not None and self.proc.pid is not None:   # pid None: it never started
            self.proc.kill()
            self.proc.join(5)
        self.proc = self.conn = None
        self.starting = False

    def send(self, msg: Any) -> None:
        if not self.alive():
            self.start()
        self.conn.send(msg)

    def receive(self, timeout_s: float) -> tuple:
        """The child's next answer; TIMEOUT or DIED (the child is then stopped)."""
        self._await_ready()
        if not self.conn.poll(timeout_s):
            self.stop()
            return TIMEOUT
        try:
            return self.conn.recv()
        except (EOFError, OSError):  # the child died (segfault, out of memory)
            self.stop()
            return DIED


_ending = threading.Event()


def refuse_new_children() -> None:
    """The run is ending (a signal arrived): no worker starts a child from now on."""
    _ending.set()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def _child_main(target: Callable, parent: int, conn, *args) -> None:   # runs in the child
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})   # a pending one is dropped: ignored
    die_with_parent()
    if os.getppid() != parent:      # the parent died before the death signal was set
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), name="quipu-parent-watch", daemon=True).start()
    target(conn, *args)


@atexit.register
def _stop_all() -> None:
    for w in ChildWorker._all:
        w.stop()

"""A long-lived worker process that parsers run in, so that input which makes a parser hang, crash
or eat memory costs the document it is in, not the run. The HTML extractor (trafilatura) and the
PDF reader (pdfium, Tesseract) use it: the parent waits for each answer with a time limit and
kills and restarts the child after a timeout or a crash.

The time limit counts CPU seconds, not wall-clock seconds (Linux, from /proc): which documents a run
keeps must not depend on how loaded the machine was (a page that costs 1.2 CPU-s takes over 10 s of
wall clock at a load of 20 on 2 cores). Each message from the child carries the CPU it and its
reaped children (Tesseract) have used so far (`_StampedConn`); an answer is charged the CPU spent
since the answer before, which is the CPU of its request because a child waiting for a request uses
none. The parent polls the pipe in short slices and reads the child's CPU from /proc between them;
an answer whose CPU is over the limit is a timeout too, whenever it arrives. A child that uses no
CPU and never answers (a deadlock, a sleep) is ended by a wall-clock backstop, `wall_backstop`.
Without /proc (not Linux) the limit is wall clock, as the backstop.

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
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing import resource_tracker
from typing import Any, Callable

from quipu.catalog.processes import die_with_parent, process_cpu   # die_with_parent: also pdf.py's Tesseract preexec_fn

WORKER_START_TIMEOUT_S = 300
PARENT_POLL_S = 0.2
POLL_SLICE_S = 0.1            # the pipe is polled this long between two reads of the child's CPU
# A child that uses no CPU and never answers is ended after this much wall clock: WALL_FACTOR times
# its CPU limit, at least WALL_MIN_S more. 20x: a CPU-bound child gets a tenth of a core at a load of
# 20 on 2 cores (seen on the shared machine), so the backstop never ends a child that is working.
WALL_FACTOR = 20
WALL_MIN_S = 120.0
CPU_CLOCK = os.path.exists(f"/proc/{os.getpid()}/stat")    # else: limits are wall clock
TIMEOUT = ("timeout", None)
DIED = ("died", None)


class ChildWorker:
    _all: list["ChildWorker"] = []

    def __init__(self, target: Callable, args: tuple = (), what: str = "worker"):
        self.target, self.args, self.what = target, args, what
        self.proc = None
        self.conn = None
        self.starting = False      # launched, its "ready" not yet read
        self.cpu_mark = 0.0        # the child's CPU when it sent its last message read here
        self.spent_s = 0.0         # CPU the last answer cost (a timeout without /proc: the wall clock)
        self.cpu_total = 0.0       # the sum of `spent_s` over every answer: a caller's budget
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
            self.cpu_mark = self.conn.recv()[1]
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

    def receive(self, timeout_s: float, wall_s: float | None = None) -> tuple:
        """The child's next answer; TIMEOUT or DIED (the child is then stopped). TIMEOUT once the
        answer has cost the child over `timeout_s` CPU seconds (see the module docstring), or
        after `wall_s` of wall clock (default `wall_backstop(timeout_s)`) without an answer.
        `spent_s` is then what the answer cost."""
        self._await_ready()
        wall_s = wall_backstop(timeout_s) if wall_s is None else wall_s
        start, used = time.monotonic(), 0.0
        while not self.conn.poll(POLL_SLICE_S):
            waited = time.monotonic() - start
            used = max(used, self._cpu() - self.cpu_mark) if CPU_CLOCK else waited
            if used > timeout_s or waited > wall_s:
                return self._charge(used, TIMEOUT)
        try:
            msg, cpu = self.conn.recv()
        except (EOFError, OSError):  # the child died (segfault, out of memory)
            return self._charge(used, DIED)
        self._charge(cpu - self.cpu_mark)
        self.cpu_mark = cpu
        if CPU_CLOCK and self.spent_s > timeout_s:     # over, even if it came between two reads
            self.stop()
            return TIMEOUT
        return msg

    def _charge(self, seconds: float, ended: tuple | None = None) -> tuple | None:
        """The last answer cost `seconds`; `ended`: the child is stopped and that is the outcome."""
        self.spent_s = seconds
        self.cpu_total += seconds
        if ended is not None:
            self.stop()
        return ended

    def _cpu(self) -> float:
        """The child's CPU so far, its reaped children's included (0 once it is gone: the pipe
        then says so)."""
        return process_cpu(self.proc.pid) or 0.0


def wall_backstop(timeout_s: float) -> float:
    """The wall clock after which a child that has not answered is ended, whatever CPU it used."""
    return max(WALL_FACTOR * timeout_s, timeout_s + WALL_MIN_S)


def own_cpu() -> float:
    """This process's CPU seconds, its reaped children's included: precise for itself (a message
    answered within one clock tick still costs its CPU), in clock ticks for its children."""
    t = os.times()
    return time.process_time() + t.children_user + t.children_system


def run_limited(cmd: list[str], data: bytes, cpu_s: float, **popen: Any) -> subprocess.CompletedProcess:
    """`subprocess.run(cmd, input=data, capture_output=True)` under the same kind of limit as an
    answer: `cpu_s` CPU seconds of the command (wall clock without /proc), `wall_backstop(cpu_s)`
    of wall clock; past either it is killed and subprocess.TimeoutExpired raised."""
    start, wall_s = time.monotonic(), wall_backstop(cpu_s)
    with tempfile.TemporaryFile() as stdin:       # not a pipe: `communicate` cannot resume writing
        stdin.write(data)                          # one after a timeout (Python 3.11)
        stdin.seek(0)
        with subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen) as proc:
            while True:
                try:
                    out, err = proc.communicate(timeout=POLL_SLICE_S)
                    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
                except subprocess.TimeoutExpired:
                    waited = time.monotonic() - start
                    used = (process_cpu(proc.pid) or 0.0) if CPU_CLOCK else waited
                    if used > cpu_s or waited > wall_s:
                        proc.kill()
                        proc.communicate()
                        raise subprocess.TimeoutExpired(cmd, cpu_s) from None


class _StampedConn:
    """The child's end of the pipe: each message sent goes with `own_cpu()` at that moment."""

    def __init__(self, conn):
        self._conn = conn

    def send(self, msg: Any) -> None:
        self._conn.send((msg, own_cpu()))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


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
    target(_StampedConn(conn), *args)


@atexit.register
def _stop_all() -> None:
    for w in ChildWorker._all:
        w.stop()

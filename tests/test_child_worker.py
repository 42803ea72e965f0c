"""tasks/child_worker.py: a request's time limit counts the CPU the child spends on it (its reaped
children's included), so that which documents a run keeps does not depend on the machine's load; a
child that uses no CPU and never answers is ended by the wall-clock backstop. Each test is decided
by CPU used or not used (a sleep, a stopped process), never by how fast the machine is."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from quipu.tasks import child_worker
from quipu.tasks.child_worker import ChildWorker, run_limited

pytestmark = pytest.mark.skipif(not child_worker.CPU_CLOCK, reason="CPU limits need /proc (Linux)")
BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {}: pass\n"


def _serve(conn) -> None:   # runs in the child: ("burn", cpu s) | ("sleep", s) | ("spawn", cpu s) -> ("ok", None)
    conn.send(("ready", None))
    while True:
        try:
            what, seconds = conn.recv()
        except EOFError:
            return
        if what == "burn":
            exec(BURN.format(seconds))
        elif what == "sleep":
            time.sleep(seconds)
        else:               # a reaped child of its own burns the CPU, as Tesseract does for the PDF reader
            subprocess.run([sys.executable, "-c", BURN.format(seconds)], check=True)
        conn.send(("ok", None))


@pytest.fixture
def worker():
    w = ChildWorker(_serve, what="test worker")
    w.start()
    yield w
    w.stop()


def test_a_child_burning_cpu_past_the_limit_is_ended_as_a_timeout(worker):
    worker.send(("burn", 60))
    assert worker.receive(0.3, wall_s=600) == child_worker.TIMEOUT
    assert worker.proc is None and worker.spent_s > 0.3
    worker.send(("burn", 0))                  # a fresh child answers the next request
    assert worker.receive(30) == ("ok", None) and worker.spent_s < 30


def test_an_answer_over_the_limit_is_a_timeout_even_if_it_arrives_between_two_reads(worker):
    worker.send(("burn", 0.05))     # done well within one poll slice on an idle machine
    assert worker.receive(0.01, wall_s=600) == child_worker.TIMEOUT and worker.proc is None


def test_a_reaped_grandchild_counts_against_the_limit(worker):
    worker.send(("spawn", 0.5))
    assert worker.receive(0.2, wall_s=600) == child_worker.TIMEOUT


def test_wall_clock_over_the_limit_is_no_timeout_when_the_cpu_is_under_it(worker):
    """A machine under load: the request takes longer than its limit in wall clock (a sleep, and a
    child stopped by SIGSTOP, as a descheduled one) but costs far less CPU: it is answered."""
    worker.send(("sleep", 1.0))
    assert worker.receive(0.2, wall_s=600) == ("ok", None) and worker.spent_s < 0.2
    os.kill(worker.proc.pid, signal.SIGSTOP)
    threading.Timer(1.0, os.kill, (worker.proc.pid, signal.SIGCONT)).start()
    t0 = time.monotonic()
    worker.send(("burn", 0.01))
    assert worker.receive(0.2, wall_s=600) == ("ok", None) and time.monotonic() - t0 >= 0.9


def test_a_child_that_sleeps_is_ended_by_the_wall_clock_backstop_only(worker):
    worker.send(("sleep", 3600))
    t0 = time.monotonic()
    assert worker.receive(0.2, wall_s=1.5) == child_worker.TIMEOUT
    assert time.monotonic() - t0 >= 1.5 and worker.proc is None


def test_the_backstop_is_far_above_the_cpu_limit():
    assert child_worker.wall_backstop(10) == 200 and child_worker.wall_backstop(1) == 121


def test_without_proc_the_limit_is_wall_clock(worker, monkeypatch):
    monkeypatch.setattr(child_worker, "CPU_CLOCK", False)
    worker.send(("sleep", 3600))
    assert worker.receive(0.3) == child_worker.TIMEOUT


def test_run_limited_counts_the_commands_cpu_not_its_wall_clock():
    with pytest.raises(subprocess.TimeoutExpired):
        run_limited([sys.executable, "-c", BURN.format(60)], b"", cpu_s=0.3)
    slow = run_limited([sys.executable, "-c", "import sys, time; time.sleep(1); sys.stdout.write(sys.stdin.read())"],
                       b"x" * 200_000, cpu_s=0.5)
    assert slow.returncode == 0 and slow.stdout == b"x" * 200_000


def test_extract_keeps_a_page_that_a_loaded_machine_delays_past_its_limit():
    """The extract stage's HTML child, stopped (SIGSTOP: a process that gets no CPU, as on a loaded
    machine) for longer than the page's limit: the page is extracted, not removed as a timeout."""
    from quipu.tasks.extract import HtmlExtractor
    from tests.test_extract import ARTICLE
    ex = HtmlExtractor()
    try:
        assert ex.extract(ARTICLE.encode(), None, {}, timeout_s=60, method="fast", min_prose=0.85)[0] == "ok"
        pid = ex.worker.proc.pid
        os.kill(pid, signal.SIGSTOP)
        threading.Timer(1.5, os.kill, (pid, signal.SIGCONT)).start()
        status, text, _ = ex.extract(ARTICLE.encode(), None, {}, timeout_s=0.5, method="fast", min_prose=0.85)
        assert status == "ok" and "river rose" in text and ex.worker.proc.pid == pid
    finally:
        ex.stop()

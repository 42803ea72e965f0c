"""How a quipu command ends: on a signal, with the temporary Prefect server, and after a killed run.

- SIGINT / SIGTERM: the first raises KeyboardInterrupt in the main thread, so the run unwinds as it
  would on Ctrl-C (finished shards stay: every write is atomic; the output lock is released by the
  operating system when the process ends) and the command exits 130 / 143. If unwinding has not
  ended the process after `GRACE_S` seconds (a Prefect client retrying a dead API, a C call that
  does not return), or a second signal comes, the process ends at once with the same code, after
  ending the processes it started. A signal handled inside a finalizer (`__del__`, where Python
  drops the exception) is sent to the main thread again, to be raised outside it.
- The temporary ("ephemeral") Prefect API server that Prefect starts when `PREFECT_API_URL` is not
  set runs under `quipu.flows.server_guard`: in its own session (a Ctrl-C to the terminal's process
  group does not kill the API while quipu still reports to it) and ending itself once its parent is
  gone, however the parent ended (SIGKILL included). Its pid is recorded under
  `$QUIPU_HOME/servers/`; the next quipu command ends any recorded server whose parent died.
- A run left `running` in the catalog by a process that no longer exists (the catalog records
  host, pid and the process's start time) is marked `crashed` by the next command, whatever it is.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from quipu.catalog.processes import owner_alive, process_owner, process_start
from quipu.tasks import child_worker

GRACE_S = 5.0              # first signal → the process has ended within this (the issue asks < 10 s)
SERVER_MODULE = "prefect.server.api.server"
_received: list[int] = []  # signals received so far


# ---- processes ---------------------------------------------------------------------------------

def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children first), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_bytes()
            ppid = int(stat[stat.rfind(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def end_processes(pids: list[int], wait_s: float = 3.0) -> None:
    """SIGTERM each, then SIGKILL those still there after `wait_s`."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if _alive_not_zombie(p)]
        time.sleep(0.05)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _alive_not_zombie(pid: int) -> bool:
    with contextlib.suppress(OSError):
        os.waitpid(pid, os.WNOHANG)   # our own child: reap it
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] != b"Z"


def end_children(wait_s: float = 3.0, keep_server: bool = False) -> None:
    """End every process this one started (extraction children, Dask workers, the temporary
    Prefect server unless `keep_server`: Prefect still reports the run's end to it on the way out,
    and it ends itself once this process is gone), so that none outlives the command."""
    keep = {info["pid"] for info in own_servers()} if keep_server else set()
    end_processes([p for p in descendants(os.getpid()) if p not in keep], wait_s)


# ---- signals ------------------------------------------------------------------------------------

def exit_code(default: int = 130) -> int:
    """128 + the first signal received (130 SIGINT, 143 SIGTERM), or `default`."""
    return 128 + _received[0] if _received else default


def install_signal_handlers() -> None:
    """The Python handler raises KeyboardInterrupt in the main thread; a watcher thread, woken by
    the signal's C-level handler through `signal.set_wakeup_fd`, starts the grace timer and ends
    the process on a second signal even while the main thread is stuck in a C call."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_signal)
    if not _watching:
        r, w = os.pipe()
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        _watching.append(r)
        threading.Thread(target=_watch, args=(r,), name="quipu-signal-watch", daemon=True).start()


_watching: list[int] = []
_interrupted: list[bool] = []   # KeyboardInterrupt raised once


def _on_signal(signum, frame) -> None:
    _note(signum)
    if _interrupted:   # the main thread unwinds already; the watcher decides what a second signal does
        return
    if _in_finalizer(frame):
        # raised inside a __del__ (a transport collected mid-wait), the interrupt would be printed as
        # "Exception ignored" and dropped, and the run would wait on until the grace timer: send the
        # signal to the main thread again, to be handled outside the finalizer
        _resend_soon(signum)
        return
    _interrupted.append(True)
    raise KeyboardInterrupt


def _in_finalizer(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


_resent: list[int] = []   # signals this process sent its own main thread (not a second signal)


def _resend_soon(signum: int) -> None:
    def send() -> None:
        time.sleep(0.05)
        with _lock:
            _resent.append(signum)
        with contextlib.suppress(OSError, ValueError):
            signal.pthread_kill(threading.main_thread().ident, signum)
    threading.Thread(target=send, name="quipu-signal-resend", daemon=True).start()


def _note(signum: int) -> bool:
    """Record a signal; True the first time any arrives."""
    with _lock:
        if _received:
            return False
        _received.append(signum)
    child_worker.refuse_new_children()
    name = signal.Signals(signum).name
    with contextlib.suppress(Exception):
        os.write(2, f"\nquipu: {name}: stopping (finished shards are kept); "
                    f"{'Ctrl-C again' if signum == signal.SIGINT else 'a second signal'} ends at once\n".encode())
    threading.Thread(target=_end_after_grace, name="quipu-grace", daemon=True).start()
    return True


_lock = threading.Lock()


def _watch(fd: int) -> None:
    seen = 0
    while True:
        try:
            data = os.read(fd, 64)
        except OSError:
            return
        for b in data:
            if b not in (signal.SIGINT, signal.SIGTERM):
                continue
            with _lock:
                if b in _resent:    # our own copy to the main thread, not the user's second signal
                    _resent.remove(b)
                    continue
            seen += 1
            if seen == 1:
                _note(b)
            else:
                _end_now(exit_code())


def _end_after_grace() -> None:
    time.sleep(GRACE_S)
    _end_now(exit_code())


def _end_now(code: int) -> None:
    with contextlib.suppress(Exception):
        forget_own_servers()
        end_children(wait_s=1.5)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


# ---- the temporary Prefect server ---------------------------------------------------------------

def servers_dir() -> Path:
    from quipu.catalog.db import quipu_home
    return quipu_home() / "servers"


def start_guarded_server(args: list, **kwargs) -> subprocess.Popen:
    """Start Prefect's uvicorn command under `quipu.flows.server_guard` in its own session, and
    record it so that a later command can end it if this process dies first."""
    argv = list(args)
    if argv[1:3] == ["-m", "uvicorn"]:
        argv = [argv[0], "-m", "quipu.flows.server_guard", str(os.getpid()), *argv[3:]]
    proc = subprocess.Popen(argv, start_new_session=True, **kwargs)
    with contextlib.suppress(OSError):
        d = servers_dir()
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{proc.pid}.json").write_text(json.dumps({
            "pid": proc.pid, "start": process_start(proc.pid), "parent": process_owner()}))
    import atexit
    atexit.register(forget_own_servers)   # runs after Prefect's own stop (atexit order is reversed)
    return proc


def own_servers() -> list[dict]:
    """The records of the servers this process started (each with its record's path as `file`)."""
    found = []
    with contextlib.suppress(OSError):
        for rec in servers_dir().glob("*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                info = json.loads(rec.read_text())
                if info["parent"] == process_owner():
                    found.append({**info, "file": rec})
    return found


def forget_own_servers() -> None:
    """End the servers this process started and drop their records."""
    for info in own_servers():
        if process_start(info["pid"]) == info["start"]:
            end_processes([info["pid"]], wait_s=1.0)
        with contextlib.suppress(OSError):
            info["file"].unlink()


def reap_orphan_servers() -> list[int]:
    """End every recorded server whose parent process is gone; returns their pids."""
    ended = []
    with contextlib.suppress(OSError):
        for rec in servers_dir().glob("*.json"):
            try:
                info = json.loads(rec.read_text())
                if owner_alive(info["parent"]) is not False:
                    continue
                if process_start(int(info["pid"])) == info["start"]:
                    end_processes([int(info["pid"])])
                    ended.append(int(info["pid"]))
                rec.unlink()
            except (OSError, ValueError, KeyError, TypeError):
                with contextlib.suppress(OSError):
                    rec.unlink()   # unreadable record: nothing to act on
    return ended


class _GuardedSubprocess:
    """`subprocess` as Prefect's server module sees it: Popen starts the server guarded."""

    def __getattr__(self, name):
        return getattr(subprocess, name)

    @staticmethod
    def Popen(args, **kwargs):   # noqa: N802 (the name Prefect calls)
        return start_guarded_server(args, **kwargs)


def guard_server_module(module) -> None:
    module.subprocess = _GuardedSubprocess()


@contextlib.contextmanager
def _keep_quipus_sigterm_handler():
    yield


def keep_sigterm_handler(module) -> None:
    """Prefect's flow engine swaps SIGTERM for its own handler while a flow runs (for a worker's
    cancellation) and re-sends the signal only after its teardown, which can take longer than the
    10 s a user waits. A flow the CLI runs in its own process keeps quipu's handler instead."""
    module.capture_sigterm = _keep_quipus_sigterm_handler


PATCHES = {SERVER_MODULE: guard_server_module, "prefect.utilities.engine": keep_sigterm_handler}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches Prefect's modules in `PATCHES` when (and only if) they are imported, so that
    commands that never run a flow pay nothing."""

    def find_spec(self, name, path=None, target=None):
        if name not in PATCHES or name in self.busy:
            return None
        self.busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.busy.discard(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        real_exec = spec.loader.exec_module

        def exec_module(module):
            real_exec(module)
            PATCHES[name](module)
        spec.loader.exec_module = exec_module
        return spec

    def __init__(self):
        self.busy: set[str] = set()


def install_prefect_patches() -> None:
    for name, patch in PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


# ---- runs left by dead processes ----------------------------------------------------------------

def mark_dead_runs_crashed() -> int:
    """Runs still `running` whose recorded process on this host is gone become `crashed`."""
    from quipu.catalog import registry
    return registry.mark_dead_runs_crashed()


def install() -> None:
    """Called by the CLI before a command runs."""
    install_signal_handlers()
    install_prefect_patches()
    reap_orphan_servers()

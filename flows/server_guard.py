"""Runs Prefect's temporary API server (uvicorn, in this process) and ends it when the quipu
process that started it is gone, however that process ended (SIGKILL included): a daemon thread
watches the parent pid. Started by `quipu.flows.lifecycle.start_guarded_server`.

Usage: python -m quipu.flows.server_guard PARENT_PID UVICORN_ARGS...
"""
from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import time

POLL_S = 0.5


def watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)   # uvicorn's own graceful shutdown first
    time.sleep(3)
    os._exit(0)


def main() -> None:
    parent = int(sys.argv[1])
    if os.getppid() != parent:   # the parent died before we got here
        sys.exit(0)
    threading.Thread(target=watch_parent, args=(parent,), name="quipu-parent-watch", daemon=True).start()
    sys.argv = ["uvicorn", *sys.argv[2:]]
    runpy.run_module("uvicorn", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

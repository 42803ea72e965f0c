"""What long commands print while they work: one line per finished stage or logged step, with
rates and an ETA, and live bars on a terminal (rich).

`--quiet` prints none of it (warnings and the final result only), `--verbose` adds Prefect's per-task
lines and third-party logs; the choice travels in QUIPU_VERBOSITY so a flow run in this process or
in a worker follows it. Everything Prefect logs also goes to the log file (`logging_setup`).
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

VERBOSITY_ENV = "QUIPU_VERBOSITY"


def verbosity() -> str:
    return os.environ.get(VERBOSITY_ENV, "normal")


def quiet() -> bool:
    return verbosity() == "quiet"


def say(message: str) -> None:
    """A progress line, unless --quiet: on stderr (stdout stays the command's result; the stream,
    not print(): a flow with `log_prints=True` turns print() into log records) and, inside a flow
    run, in the run's log (the UI). A deployment's run on a worker only logs it: the worker's
    terminal shows the run's log, so writing it as well would show every line twice. Control
    characters are escaped (a file name can carry an ESC sequence)."""
    if quiet():
        return
    from quipu.catalog.errors import printable
    message = "\n".join(printable(line) for line in message.split("\n"))   # a table keeps its lines
    logger, deployed = _run_logger()
    if logger is not None:
        logger.info(message)
    if not deployed or VERBOSITY_ENV in os.environ:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()


def _run_logger():
    """(the current Prefect run's logger or None, whether the run belongs to a deployment)."""
    if "prefect" not in sys.modules:
        return None, False
    try:
        from prefect import get_run_logger
        from prefect.context import FlowRunContext
        logger = get_run_logger()
    except Exception:   # outside a run
        return None, False
    ctx = FlowRunContext.get()
    return logger, bool(ctx and ctx.flow_run and ctx.flow_run.deployment_id)


def duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def log_file() -> Path:
    home = Path(os.environ.get("QUIPU_HOME", Path.home() / ".quipu")).expanduser()
    return home / "logs" / "quipu.log"


def logging_setup(level: str) -> None:
    """Before Prefect is imported: Prefect's own logging config with a file handler added (every
    record, DEBUG included, to `log_file()`) and the terminal handler at WARNING unless --verbose,
    so per-task "Finished in state Completed()" lines and library chatter stay out of the terminal
    but not out of the log file or the Prefect UI. Transformers' download/convert bars are off."""
    import importlib.util

    import yaml
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1" if level != "verbose" else "0")
    if level != "verbose":   # e.g. transformers' "Converting and de-quantizing GGUF tensors" bar (plain tqdm)
        os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error" if level != "verbose" else "warning")
    if "PREFECT_LOGGING_SETTINGS_PATH" in os.environ:   # the user's own logging config wins
        return
    spec = importlib.util.find_spec("prefect")
    if spec is None or spec.origin is None:
        return
    cfg = yaml.safe_load((Path(spec.origin).parent / "logging" / "logging.yml").read_text())
    path = log_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return   # an unwritable home: keep Prefect's defaults
    cfg["handlers"]["file"] = {"level": 0, "class": "logging.FileHandler", "formatter": "standard",
                               "filename": str(path), "delay": True, "encoding": "utf-8"}
    cfg["root"]["handlers"] = ["file", *cfg["root"]["handlers"]]   # the file first: it keeps the tracebacks
    cfg["handlers"]["console"]["level"] = 0 if level == "verbose" else "WARNING"
    if level != "verbose":
        cfg.setdefault("filters", {})["one_line"] = {"()": "quipu.flows.progress.OneLineConsole"}
        cfg["handlers"]["console"]["filters"] = ["one_line"]
    settings = path.parent / f"logging-{level}.yaml"
    tmp = settings.with_name(f".{settings.name}.{os.getpid()}")
    tmp.write_text(yaml.safe_dump(cfg, sort_keys=False))
    os.replace(tmp, settings)
    os.environ["PREFECT_LOGGING_SETTINGS_PATH"] = str(settings)


class OneLineConsole:
    """The terminal's log filter unless --verbose: a run's failure is said once, as one line, by
    the CLI (`quipu: ...`), so Prefect's failed-task and failed-flow records with their tracebacks
    stay in the log file and the UI; any other record is cut to its first line, control characters
    escaped."""

    def filter(self, record) -> bool:
        if record.name.startswith(("prefect.flow_runs", "prefect.task_runs")) and (record.exc_info or record.levelno >= 40):
            return False
        msg = record.getMessage()
        if record.exc_info or record.exc_text or "\n" in msg or "\x1b" in msg:
            from quipu.catalog.errors import printable
            first = (msg.strip().splitlines() or [""])[0]
            more = f" (details in {log_file()})" if record.exc_info or "\n" in msg.strip() else ""
            record.msg, record.args, record.exc_info, record.exc_text = printable(first) + more, (), None, None
        return True


class StageProgress:
    """Shards and documents of one curate stage: a live bar on a terminal, else one line when the
    stage ends (and every `every_s` seconds for long stages), with docs/s, ETA and reused shards."""

    def __init__(self, stage: str, shards: int, docs: int | None, every_s: float = 15.0):
        self.stage, self.shards, self.docs = stage, shards, docs
        self.done_shards = self.done_docs = self.reused = self.reused_docs = 0
        self.t0 = self.last = time.monotonic()
        self.every_s = every_s
        self.live = None
        if not quiet() and sys.stderr.isatty() and shards > 1:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
            self.live = Progress(TextColumn(f"{stage:<14}"), BarColumn(), MofNCompleteColumn(), TextColumn("shards"),
                                 TextColumn("{task.fields[rate]}"), TimeRemainingColumn(), transient=True)
            self.task = self.live.add_task(stage, total=shards, rate="")
            self.live.start()

    def rate(self) -> float:
        """Documents per second of the work done now (reused shards cost nothing)."""
        return (self.done_docs - self.reused_docs) / max(1e-9, time.monotonic() - self.t0)

    def advance(self, docs: int, reused: bool = False) -> None:
        self.done_shards += 1
        self.done_docs += docs
        if reused:
            self.reused += 1
            self.reused_docs += docs
        now = time.monotonic()
        if self.live is not None:
            self.live.update(self.task, completed=self.done_shards, rate=f"{self.rate():,.0f} docs/s")
        elif self.done_shards < self.shards and now - self.last >= self.every_s:
            self.last = now
            left = (self.shards - self.done_shards) * (now - self.t0) / max(1, self.done_shards - self.reused)
            say(f"  {self.stage:<14}{self.done_shards:>6}/{self.shards} shards {self.done_docs:>10,} docs "
                f"{self.rate():>9,.0f} docs/s  ETA {duration(left)}")

    def finish(self, kept: int, removed: int, seconds: float) -> None:
        if self.live is not None:
            self.live.stop()
        reused = f"  ({self.reused} of {self.shards} shards reused from an earlier run)" if self.reused else ""
        total = kept + removed
        fresh = total - self.reused_docs
        rate = f"{fresh / max(1e-9, seconds):>9,.0f} docs/s" if seconds and fresh else f"{'':>16}"
        say(f"  {self.stage:<14}{total:>10,} in {kept:>10,} kept {removed:>9,} removed  {rate}  {duration(seconds):>7}{reused}")


class StepProgress:
    """Training: one line per logged step (step, loss, lr, tokens/s, ETA) and each held-out loss."""

    def __init__(self, max_steps: int):
        self.max_steps = max_steps

    def __call__(self, m: dict) -> None:
        if "loss" not in m:
            return
        step = m["step"]
        # ETA from the current rate (also right after a resume): tokens per step / tokens per second
        rate = m.get("tokens_per_s") or 0
        left = (self.max_steps - step) * (m.get("tokens", 0) / max(1, step)) / rate if rate else 0
        line = (f"step {step:>6}/{self.max_steps}  loss {m['loss']:.4f}  lr {m.get('lr', 0):.2e}  "
                f"{m.get('tokens_per_s', 0):>8,.0f} tok/s  ETA {duration(left)}")
        if m.get("eval_loss") is not None:
            line += f"  held-out loss {m['eval_loss']:.4f}"
        if m.get("eval_by_source"):
            line += "\n    held-out bits/byte " + format_eval_groups(m)
        if m.get("skipped"):
            line += f"  (skipped: {m['skipped']})"
        say(line)


def format_eval_groups(m: dict) -> str:
    """`all 2.31 | source en-web 2.10, es-news 2.52 | lang en 2.10, es 2.52` (bits per byte)."""
    parts = [f"all {m['eval_bpb']:.4f}"]
    for key, label in (("eval_by_source", "source"), ("eval_by_lang", "lang")):
        parts.append(label + " " + ", ".join(f"{k} {v['bpb']:.4f}" for k, v in m.get(key, {}).items()))
    for name, t in (m.get("eval_tasks") or {}).items():
        if t.get("items"):
            parts.append(f"task {name} acc {t['accuracy']:.3f} answer {t['answer_bpb']:.4f}")
    return " | ".join(parts)

"""The `quipu` command line: one table of commands, one place that turns errors into exit codes.

Each command parses its arguments, validates its config before any work starts, then runs its
Prefect flow. Without `PREFECT_API_URL` flows run on Prefect's ephemeral local API (SQLite):
nothing to start by hand. An error the user can fix (`quipu.catalog.errors.UserError`: a config
key, a missing model, a busy output folder, ...) is raised, already worded, by the code that
detects it and printed here as one line with its exit code (2: change something; 1: rerun).
"""
from __future__ import annotations

import argparse
import errno
import os
import sys

from quipu.catalog.errors import UserError, printable
from quipu.catalog.files import with_path
from quipu.demo import run as demo
from quipu.flows import ablate_cli, benchmarks_cli, calibrate, config_cli, curate_cli, label_cli, lifecycle, ops, ppl_cli, quality_cli, tiers_cli, train_cli
from quipu.flows.progress import VERBOSITY_ENV, log_file, logging_setup

# Set before Prefect is imported (see ../shared/ENVIRONMENT.md): the ephemeral API needs more than
# the default 20 s to start on two cores, and telemetry has no network to reach.
PREFECT_DEFAULTS = {
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_LOGGING_TO_API_BATCH_INTERVAL": "0.5",
}

WRITE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT, errno.EPERM}

# Every command, in `quipu --help` order: (module, the commands its `add_commands` adds).
COMMANDS = [
    (curate_cli, "curate, report, catalog ls|show"),
    (ops, "watch, deploy"),
    (quality_cli, "quality train"),
    (ppl_cli, "ppl label|distill|eval, kenlm train"),
    (benchmarks_cli, "benchmarks ls|check"),
    (train_cli, "train, plan, export"),
    (ablate_cli, "ablate"),
    (calibrate, "calibrate"),
    (tiers_cli, "tiers fit"),
    (label_cli, "label, serve-labeller, label-head"),
    (demo, "demo"),
    (config_cli, "config show"),
]


def prefect_env() -> None:
    for k, v in PREFECT_DEFAULTS.items():
        os.environ.setdefault(k, v)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quipu", description="Curate web crawls and text dumps into training data, and train on it.")
    parser.add_argument("--version", action="version", version=f"quipu {installed_version()}")
    parser.add_argument("--quiet", action="store_true", help="no progress lines: warnings and the result only")
    parser.add_argument("--verbose", action="store_true",
                        help=f"also Prefect's per-task lines and library logs (always in {log_file()})")
    sub = parser.add_subparsers(dest="command", required=True)
    for module, _ in COMMANDS:
        module.add_commands(sub)
    return parser


def installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("quipu")
    except PackageNotFoundError:   # run from a checkout without installing
        from quipu.tasks.stage import QUIPU_VERSION
        return QUIPU_VERSION


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # --quiet / --verbose anywhere on the line (before or after the command), for every command
    level = "verbose" if "--verbose" in argv else "quiet" if "--quiet" in argv else "normal"
    argv = [a for a in argv if a not in ("--quiet", "--verbose")]
    os.environ[VERBOSITY_ENV] = level
    prefect_env()
    logging_setup(level)
    args = build_parser().parse_args(argv)
    try:
        lifecycle.install()   # signals, the temporary Prefect server, servers left by killed commands
        if args.command != "config":   # a run a killed process left `running` is marked crashed
            lifecycle.mark_dead_runs_crashed()
        code = int(args.func(args) or 0)
        sys.stdout.flush()   # here, so that a closed pipe is handled below and not at interpreter exit
        return code
    except UserError as e:
        print(f"quipu: {printable(str(e))}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("quipu: interrupted; finished shards are kept, rerun the same command to resume", file=sys.stderr)
        lifecycle.end_children(wait_s=2.0, keep_server=True)
        return lifecycle.exit_code(130)
    except BrokenPipeError:
        # the reader went away (`quipu report RUN | head`): stop quietly, as cat would; point stdout
        # at /dev/null so the interpreter's final flush does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:
        if e.errno is None:     # numpy's short write on a full disk carries no errno and no path
            e = with_path(e, written_path(e))
        if e.errno in WRITE_ERRNOS:  # disk full, read-only or forbidden output: say where, no traceback
            print(f"quipu: cannot write {printable(str(e.filename or written_path(e)))}: {e.strerror}; "
                  "earlier outputs are left as they were", file=sys.stderr)
            return 1
        return unexpected(e, level)
    except Exception as e:
        return unexpected(e, level)


def written_path(e: BaseException) -> str:
    """The file an OSError without `filename` was about (pyarrow's and zstd's writers drop it): the
    innermost frame's `path`-like local, else 'output'."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    f = tb.tb_frame if tb else None
    while f is not None:
        for name in ("path", "tmp", "dest", "target", "where", "filename"):
            v = f.f_locals.get(name)
            if isinstance(v, (str, os.PathLike)):
                return os.fspath(v)
        f = f.f_back
    return "output"


def unexpected(e: BaseException, level: str) -> int:
    """A failure no code worded for the user: one line (the traceback goes to the log file), or the
    traceback with --verbose. Exit 1: the run failed, rerun."""
    if level == "verbose":
        raise e
    import traceback
    try:
        log_file().parent.mkdir(parents=True, exist_ok=True)
        with open(log_file(), "a", encoding="utf-8", errors="backslashreplace") as f:
            f.write("".join(traceback.format_exception(e)))
    except OSError:
        pass
    first = (str(e).strip().splitlines() or [""])[0][:500]
    print(f"quipu: {type(e).__name__}: {printable(first)} (traceback in {log_file()}; --verbose shows it)",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())

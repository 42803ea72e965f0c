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

from quipu.catalog.errors import UserError
from quipu.demo import run as demo
from quipu.flows import ablate_cli, benchmarks_cli, curate_cli, ops, ppl_cli, quality_cli, train_cli

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
    (demo, "demo"),
]


def prefect_env() -> None:
    for k, v in PREFECT_DEFAULTS.items():
        os.environ.setdefault(k, v)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quipu", description="Curate web crawls and text dumps into training data, and train on it.")
    sub = parser.add_subparsers(dest="command", required=True)
    for module, _ in COMMANDS:
        module.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    prefect_env()
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"quipu: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("quipu: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        if e.errno in WRITE_ERRNOS:  # disk full, read-only or forbidden output: say where, no traceback
            print(f"quipu: cannot write {e.filename or 'output'}: {e.strerror}; earlier outputs are left as they were",
                  file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())

"""The documentation is tested (docs/tests.md, "The documentation is tested"): the site builds
strictly (no broken link or anchor), and every command shown in a ```bash or ```console block of
README.md and docs/*.md runs or parses:

- `quipu ...`: parsed by the real CLI parser (`quipu.flows.cli.build_parser`), in process; a
  subcommand or option that no longer exists fails. Cheap read-only commands (`config show`,
  `benchmarks ls`, `catalog ls`, `plan`) also run for real and must exit 0; a `quipu curate` or
  `quipu train` of a shipped config also has its config and `--set` overrides validated
  (`quipu config show NAME CONFIG --set ...`), which loads the config as the run would.
- `make T`: T is a Makefile target; `python -m M`, `torchrun -m M`: M is an installed module;
  `python FILE`: FILE exists.
- every repository path a command names (configs/, deploy/, bench/, ...) exists, unless an earlier
  command of the same block writes it (`--output configs/curate/gl.yaml`).
- other programs (docker, dask, prefect, cp, export) are the user's own: only their paths are checked.
A program the test does not know fails it, so a new kind of command gets a rule here.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# bench/RESULTS.md is a page of the site (docs/results.md) but a log of measurements: the commands
# there are the benchmarks' own, recorded with their results, not instructions.
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if not p.is_symlink())]
SHELL_BLOCK = re.compile(r"^```(bash|sh|shell|console)[^\n]*\n(.*?)^```", re.S | re.M)
REPO_PATH = re.compile(r"^(configs|deploy|bench|demo|tests|docs|tasks|flows|trainer|catalog|\.ci)/[^*?{}\[\]]*$")
WRITES = {"--output", "--out", "--hf", "-o"}
OWN_PROGRAMS = {"docker", "dask", "prefect", "cp", "export", "cd", "huggingface-cli", "cat", "tail", "ls"}
RUN_FOR_REAL = {("config", "show"), ("benchmarks", "ls"), ("catalog", "ls"), ("plan",)}
VALIDATE_CONFIG = {"curate": "curate", "train": "train", "ablate": "ablate", "quality": "quality"}


def shell_commands(text: str) -> list[list[list[str]]]:
    """Per shell block, its commands as argument lists (continuations joined, comments dropped,
    `a && b` split; a console block's commands are its `$ ` lines)."""
    blocks = []
    for m in SHELL_BLOCK.finditer(text):
        lang, body = m.group(1), m.group(2)
        lines, joined = body.split("\n"), []
        if lang == "console":
            lines = [line[2:] for line in lines if line.startswith("$ ")]
        for line in lines:
            if joined and joined[-1].endswith("\\"):
                joined[-1] = joined[-1][:-1] + " " + line.strip()
            else:
                joined.append(line)
        commands = []
        for line in joined:
            words = shlex.split(line, comments=True)
            while words:
                cut = next((i for i, w in enumerate(words) if w in ("&&", ";", "||", "|")), len(words))
                if words[:cut]:
                    commands.append(words[:cut])
                words = words[cut + 1:]
        blocks.append(commands)
    return blocks


def documented() -> list[tuple[str, int, list[str]]]:
    """(page, block number, command) of every command the pages show."""
    return [(p.relative_to(ROOT).as_posix(), n, cmd) for p in PAGES
            for n, block in enumerate(shell_commands(p.read_text())) for cmd in block]


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z0-9_.-]+):", text, re.M)}


def without_env(cmd: list[str]) -> list[str]:
    """The command without its leading `NAME=value` assignments."""
    i = 0
    while i < len(cmd) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", cmd[i]):
        i += 1
    return cmd[i:]


@functools.lru_cache(maxsize=1)
def cli_parser():
    from quipu.flows.cli import build_parser
    return build_parser()


def quipu_parse(argv: list[str]):
    """The real CLI parser's result for `argv`, or the parser's error message."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            return cli_parser().parse_args(argv), None
        except SystemExit as e:
            return None, None if e.code == 0 else err.getvalue().strip().splitlines()[-1]


def problems_of(cmd: list[str], written: set[str], targets: set[str]) -> list[str]:
    """What is wrong with one documented command (empty: nothing)."""
    found = []
    for prev, word in zip([""] + cmd, cmd):
        if prev in WRITES or word.startswith(tuple(f"{w}=" for w in WRITES)):
            written.add(word.split("=", 1)[-1])
        elif REPO_PATH.match(word) and word not in written and not (ROOT / word).exists():
            found.append(f"no such file in the repository: {word}")
    words = without_env(cmd)
    if not words:
        return found
    prog, args = words[0], words[1:]
    if prog in ("quipu", ".venv/bin/quipu"):
        parsed, error = quipu_parse(args)
        if error:
            found.append(f"quipu rejects it: {error}")
    elif prog == "make":
        found += [f"no Makefile target {t!r}" for t in args if not re.match(r"^[A-Z_]+=", t) and t not in targets]
    elif prog in ("python", "python3", ".venv/bin/python", "torchrun"):
        if "-m" in args:
            module = args[args.index("-m") + 1]
            if importlib.util.find_spec(module) is None:
                found.append(f"no installed module {module}")
        elif prog != "torchrun" and args and not (ROOT / args[0]).is_file():
            found.append(f"no such script: {args[0]}")
    elif prog not in OWN_PROGRAMS:
        found.append(f"a program this test has no rule for: {prog} (add one in tests/test_docs.py)")
    return found


def test_the_pages_show_commands_of_every_kind():
    """The extraction sees the commands (a change of fence style would silently test nothing)."""
    progs = {without_env(cmd)[0] for _, _, cmd in documented() if without_env(cmd)}
    assert {"quipu", "make", "torchrun", "dask", "docker", "export"} <= progs, progs
    heads = {tuple(c[1:3]) for _, _, c in documented() if c[0] == "quipu"}
    assert ("curate", "configs/curate/default.yaml") in heads and ("deploy",) in {h[:1] for h in heads}
    readme = shell_commands((ROOT / "README.md").read_text())
    assert [c for block in readme for c in block][:2] == [["make", "demo"], ["make", "test"]]


def test_every_documented_command_parses():
    targets, bad, written = makefile_targets(), [], {}
    for page, block, cmd in documented():
        for problem in problems_of(cmd, written.setdefault((page, block), set()), targets):
            bad.append(f"{page}: {shlex.join(cmd)}: {problem}")
    assert bad == []


def test_a_command_that_no_longer_exists_fails():
    targets = makefile_targets()
    assert problems_of(["quipu", "curate", "configs/curate/default.yaml", "--input", "x", "--output", "o"], set(), targets) == []
    assert problems_of(["quipu", "frobnicate", "x"], set(), targets)
    assert problems_of(["quipu", "curate", "configs/curate/default.yaml", "--no-such-option"], set(), targets)
    assert problems_of(["quipu", "curate", "configs/curate/gone.yaml"], set(), targets)
    assert problems_of(["make", "no-such-target"], set(), targets)
    assert problems_of(["torchrun", "-m", "quipu.flows.no_such_module"], set(), targets)
    assert problems_of(["rsync", "a", "b"], set(), targets)
    written: set[str] = set()
    assert problems_of(["quipu", "calibrate", "configs/curate/default.yaml", "--reference", "r", "--lang", "gl",
                        "--output", "configs/curate/gl.yaml"], written, targets) == []
    assert problems_of(["quipu", "calibrate", "--check", "configs/curate/gl.yaml", "--reference", "r", "--lang", "gl"],
                       written, targets) == []


def quipu_run(args: list[str], monkeypatch) -> tuple[int, str]:
    """`quipu ARGS` in this process; the variables main() sets are restored afterwards."""
    from quipu.flows.cli import PREFECT_DEFAULTS, main
    from quipu.flows.progress import VERBOSITY_ENV
    for key in [VERBOSITY_ENV, "PREFECT_LOGGING_SETTINGS_PATH", *PREFECT_DEFAULTS]:
        if key in os.environ:
            monkeypatch.setenv(key, os.environ[key])
        else:
            monkeypatch.delenv(key, raising=False)
    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(args)
    finally:
        os.chdir(cwd)
    return code, out.getvalue() + err.getvalue()


def config_checks(cmd: list[str]) -> list[list[str]]:
    """`config show` lines that validate a documented curate/train run's shipped config and overrides."""
    args = without_env(cmd)[1:]
    if not args or args[0] not in ("curate", "train") or len(args) < 2 or not (ROOT / args[1]).is_file():
        return []
    sets = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--set"]
    return [["config", "show", args[0], args[1], "--brief", *[x for s in sets for x in ("--set", s)]]]


def test_cheap_documented_commands_run(monkeypatch):
    """The read-only commands run for real; documented runs of shipped configs load with their --set."""
    runs = set()
    for _, _, cmd in documented():
        words = without_env(cmd)
        if words and words[0] in ("quipu", ".venv/bin/quipu"):
            if tuple(words[1:3]) in RUN_FOR_REAL or tuple(words[1:2]) in RUN_FOR_REAL:
                runs.add(tuple(words[1:]))
            runs.update(tuple(c) for c in config_checks(words))
    assert ("config", "show", "curate") in runs and any(r[:1] == ("plan",) for r in runs)
    failed = []
    for args in sorted(runs):
        code, output = quipu_run(list(args), monkeypatch)
        if code != 0:
            failed.append(f"quipu {shlex.join(args)}: exit {code}: {output.strip().splitlines()[-1:]}")
    assert failed == []


def test_the_site_builds_strictly(tmp_path):
    """`make docs`: mkdocs in strict mode, so a broken link or anchor between pages fails."""
    pytest.importorskip("mkdocs", reason="mkdocs is in the dev extras: make install")
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "index.html").is_file() and (tmp_path / "site" / "results" / "index.html").is_file()


def test_every_page_is_in_the_navigation():
    import yaml
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]

    def files(node):
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [f for n in node for f in files(n)]
        return [f for v in node.values() for f in files(v)]
    assert sorted(files(nav)) == sorted(p.name for p in (ROOT / "docs").glob("*.md"))

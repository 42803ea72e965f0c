"""Fault injection across the pipeline (issue 9): config fuzz, disk full, read-only output,
transient task failures. The bad-input corpus and SIGKILL-and-resume cases are in test_fault_suite.py.
See tests/FAULTS.md for the table of faults and what each test checks."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from quipu.catalog.files import sha256_file
from quipu.flows.cli import main
from quipu.flows.config import ConfigError, load_config
from quipu.flows.curate import CurateConfig
from tests.conftest import FUZZ_SEED, missing_install
from tests.textgen import make_docs, write_jsonl


# ---- config fuzz --------------------------------------------------------------------------------

def _leaf_keys(model, prefix=()):
    """Dotted keys of every leaf field of a pydantic model (nested models expanded)."""
    from pydantic import BaseModel
    out = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += _leaf_keys(ann, prefix + (name,))
        else:
            out.append(prefix + (name,))
    return out


LEAVES = _leaf_keys(CurateConfig)
BAD_VALUES = st.one_of(st.text(max_size=8), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                       st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
                       st.none(), st.booleans())


def _field(key: tuple):
    """The pydantic field a dotted key of the curate config ends at."""
    model = CurateConfig
    for part in key[:-1]:
        model = model.model_fields[part].annotation
    return model.model_fields[key[-1]]


def _field_type(field):
    """The field's type with its validators (pydantic keeps an `Annotated` field's validators in
    `metadata`, not in `annotation`): a per-language threshold's `off`/false is part of its type."""
    from typing import Annotated
    return Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation


def _accepts(field, value) -> bool:
    from pydantic import TypeAdapter, ValidationError
    try:
        TypeAdapter(_field_type(field)).validate_python(value)
        return True
    except ValidationError:
        return False


def _names(msg: str, dotted: str) -> bool:
    """`dotted` appears in the message as a whole key (`dedup.threshold`, not inside `x_dedup.thresholds`)."""
    import re
    return re.search(rf"(?<![\w.]){re.escape(dotted)}(?![\w])", msg) is not None


def _nested(key: tuple, value) -> dict:
    data: dict = {}
    node = data
    for part in key[:-1]:
        node = node.setdefault(part, {})
    node[key[-1]] = value
    return data


# The suite runs a fixed sample of each config fuzz (CONFIG_SEED); `make fuzz` runs many more examples
# from FUZZ_SEED, new each run and printed (QUIPU_FUZZ_SEED=N replays it).
CONFIG_SEED = 20261128
CONFIG_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def print_fuzz_seed():
    print(f"config fuzz: seed {FUZZ_SEED} (QUIPU_FUZZ_SEED={FUZZ_SEED} replays it)")


@seed(CONFIG_SEED)
@settings(max_examples=300, **CONFIG_SETTINGS)
@given(key=st.sampled_from(LEAVES), value=BAD_VALUES)
def test_fuzzed_value_is_accepted_or_refused_naming_the_key(key, value):
    value_is_accepted_or_refused_naming_the_key(key, value)


@pytest.mark.fuzz
@seed(FUZZ_SEED)
@settings(max_examples=3000, **CONFIG_SETTINGS)
@given(key=st.sampled_from(LEAVES), value=BAD_VALUES)
def test_fuzzed_value_is_accepted_or_refused_naming_the_key_many(print_fuzz_seed, key, value):
    value_is_accepted_or_refused_naming_the_key(key, value)


def value_is_accepted_or_refused_naming_the_key(key, value):
    """The field's own type (a TypeAdapter of its annotation, not load_config) is the oracle: a value
    it refuses must be refused by load_config; a value load_config accepts must be in the config as given."""
    import math

    from pydantic import TypeAdapter, ValidationError
    field = _field(key)
    try:
        expected = TypeAdapter(_field_type(field)).validate_python(value)
        field_accepts = True
    except ValidationError:
        field_accepts = False
    try:
        cfg = load_config(CurateConfig, data=_nested(key, value))
    except ConfigError as e:
        msg = str(e)
        # the message names the key; a cross-field rule may name the key's section instead (never "")
        assert _names(msg, ".".join(key)) or (len(key) > 1 and _names(msg, ".".join(key[:-1]))), msg
    else:
        got = cfg
        for part in key:
            got = getattr(got, part)
        # what was loaded is of the field's type (a field validator may have converted the value) ...
        TypeAdapter(_field_type(field)).validate_python(got)
        if field_accepts:   # ... and a value of that type is loaded as given
            same_nan = isinstance(got, float) and isinstance(expected, float) and math.isnan(got) and math.isnan(expected)
            assert same_nan or got == expected, f"{'.'.join(key)}={value!r} loaded as {got!r}"


SECTIONS = {k[:i] for k in LEAVES for i in range(1, len(k))}


PARTS = st.lists(st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=10), min_size=1, max_size=3)


@seed(CONFIG_SEED)
@settings(max_examples=100, **CONFIG_SETTINGS)
@given(known=st.sampled_from([()] + sorted(SECTIONS | set(LEAVES))), path=PARTS)
def test_fuzzed_unknown_key_is_refused_naming_it(known, path):
    unknown_key_is_refused_naming_it(known, path)


@pytest.mark.fuzz
@seed(FUZZ_SEED)
@settings(max_examples=1000, **CONFIG_SETTINGS)
@given(known=st.sampled_from([()] + sorted(SECTIONS | set(LEAVES))), path=PARTS)
def test_fuzzed_unknown_key_is_refused_naming_it_many(print_fuzz_seed, known, path):
    unknown_key_is_refused_naming_it(known, path)


def unknown_key_is_refused_naming_it(known, path):
    """Random parts after a real section or key (or at the top level)."""
    key = tuple(known) + tuple(path)
    known = next((i for i in range(len(key), 0, -1) if key[:i] in SECTIONS or key[:i] in LEAVES), 0)
    if known == len(key):
        return  # a real key or section
    # the first unknown part, or the leaf that was given a section instead of a value
    named = key[:known] if key[:known] in LEAVES else key[:known + 1]
    if key[:known] in LEAVES and _accepts(_field(key[:known]), _nested(key[known:], 1)):
        return  # a mapping field (e.g. `top_fraction_per_language`): the parts are its keys, not config keys
    with pytest.raises(ConfigError) as e:
        load_config(CurateConfig, data=_nested(key, 1))
    assert _names(str(e.value), ".".join(named)), str(e.value)


@pytest.mark.parametrize("text", ["langid: [1, 2", "- a\n- b\n", "extract:\n  timeout_s: -1\n", "\tbad: tab\n"])
def test_cli_never_shows_a_traceback_for_config_errors(tmp_path, capsys, text):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    assert main(["curate", str(cfg), "--input", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("quipu: ") and "Traceback" not in err


# ---- disk full and read-only output -------------------------------------------------------------

def _mount(args: list[str]) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or not _mount(["-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)]):
        missing_install("needs root and permission to mount a tmpfs (the OS refused)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _config(tmp_path: Path) -> Path:
    cfg = tmp_path / "faults.yaml"
    cfg.write_text("heuristics:\n  enabled: false\nextract:\n  shard_mb: 0.2\n")
    return cfg


@pytest.mark.slow
def test_disk_full_fails_clearly_and_keeps_earlier_outputs(prefect_server, tmp_path, small_tmpfs, capsys):
    out = small_tmpfs / "run"
    small = write_jsonl(tmp_path / "in1" / "small.jsonl", make_docs(40, seed=1))
    assert main(["curate", str(_config(tmp_path)), "--input", str(small), "--output", str(out)]) == 0
    before = {p: sha256_file(p) for p in (out / "curated").glob("*.parquet")}
    assert before
    big = write_jsonl(tmp_path / "in2" / "big.jsonl", make_docs(3000, seed=2))  # ~10 MB: cannot fit
    capsys.readouterr()
    # a second run on the same full disk (another output: one with other inputs would be refused first)
    out2 = small_tmpfs / "run2"
    rc = main(["curate", str(_config(tmp_path)), "--input", str(big), "--output", str(out2)])
    err = capsys.readouterr().err
    assert rc == 1 and "No space left on device" in err and "Traceback" not in err
    assert f"quipu: cannot write {out2}/" in err, err   # the path (issue 32: pyarrow's error had none)
    assert {p: sha256_file(p) for p in (out / "curated").glob("*.parquet")} == before
    assert not list(out.rglob(".tmp-*")) and not list(out2.rglob(".tmp-*"))


@pytest.mark.slow
def test_read_only_output_fails_clearly_and_keeps_earlier_outputs(prefect_server, tmp_path, capsys):
    src = tmp_path / "ro-src"
    out = src / "run"
    docs = write_jsonl(tmp_path / "in" / "docs.jsonl", make_docs(30, seed=3))
    assert main(["curate", str(_config(tmp_path)), "--input", str(docs), "--output", str(out)]) == 0
    before = {p: sha256_file(p) for p in out.rglob("*.parquet")}
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0 or not _mount(["--bind", str(src), str(ro)]):
        missing_install("needs root and permission to bind-mount (the OS refused)")
    try:
        if not _mount(["-o", "remount,ro,bind", str(ro)]):
            missing_install("the OS refused a read-only remount")
        more = write_jsonl(tmp_path / "in2" / "more.jsonl", make_docs(30, seed=4))
        capsys.readouterr()
        rc = main(["curate", str(_config(tmp_path)), "--input", str(more), "--output", str(ro / "run")])
        err = capsys.readouterr().err
        # refused before any work (and before Prefect starts), in one line
        assert rc == 2 and "read-only file system" in err and "Traceback" not in err and err.count("\n") == 1, err
    finally:
        subprocess.run(["umount", "-l", str(ro)], capture_output=True)
    assert {p: sha256_file(p) for p in out.rglob("*.parquet")} == before


# ---- transient failures -------------------------------------------------------------------------

@pytest.mark.slow
def test_transient_failure_is_retried_without_redoing_finished_shards(prefect_server, tmp_path, monkeypatch):
    from quipu.tasks import langid

    for i in range(3):
        write_jsonl(tmp_path / "in" / f"part{i}.jsonl", make_docs(20, seed=10 + i))
    calls: dict[str, int] = {}
    failed: list[str] = []
    real = langid.LanguageId.process

    def flaky(self, batch, shard_plan=None):
        first_id = batch.column("id")[0].as_py() if batch.num_rows else ""
        calls[first_id] = calls.get(first_id, 0) + 1
        if first_id.startswith("doc-11-") and not failed:
            failed.append(first_id)
            raise ConnectionError("injected transient failure")
        return real(self, batch, shard_plan)

    monkeypatch.setattr(langid.LanguageId, "process", flaky)
    cfg = _config(tmp_path)
    # one work unit (and so one shard) per input file, so that one shard's failure is visible: each
    # file at least pack_mb (not packed with another) and under twice it (not read in parts)
    sizes = [p.stat().st_size for p in (tmp_path / "in").iterdir()]
    pack = 0.51 * max(sizes)
    assert min(sizes) >= pack
    cfg.write_text(cfg.read_text().replace("extract:\n", f"extract:\n  pack_mb: {pack / 1e6}\n"))
    out = tmp_path / "run"
    assert main(["curate", str(cfg), "--input", str(tmp_path / "in" / "*.jsonl"), "--output", str(out)]) == 0
    assert failed == ["doc-11-0"]
    assert calls == {"doc-10-0": 1, "doc-11-0": 2, "doc-12-0": 1}   # only the failed shard ran twice
    calls.clear()
    assert main(["curate", str(cfg), "--input", str(tmp_path / "in" / "*.jsonl"), "--output", str(out)]) == 0
    assert calls == {}                                                 # a rerun skips every finished shard

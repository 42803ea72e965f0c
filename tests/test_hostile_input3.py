"""Hostile input, part 3 (issue 44): PDF work bounded in time and processes, checkpoints that trust
nothing outside their folder, tiny files that would cost gigabytes, every config value range-checked.
Each test is a reproduction of the probe, small and fast."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quipu.tasks.reading import pdf
from quipu.tasks.reading.pdf import PdfConfig
from tests.test_hostile_input import small_quality_model  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parents[1]


def many_lines_pdf(pages: int, lines: int, seed: int = 0) -> bytes:
    """A PDF whose pages all share one content stream of `lines` tiny words scattered at random:
    small as bytes, costly to lay out."""
    rnd = random.Random(seed)
    content = "\n".join(f"BT /F1 2 Tf {rnd.uniform(0, 600):.1f} {rnd.uniform(0, 780):.1f} Td (w{i % 97}) Tj ET"
                        for i in range(lines)).encode()
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [%s] /Count %d >>" % (" ".join(f"{5 + i} 0 R" for i in range(pages)).encode(), pages),
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
            b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content)]
    objs += [b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
             b"/Contents 4 0 R >>"] * pages
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for n, obj in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (n, obj)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1) + b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)


def _dense_results(pages: int, lines: int) -> dict[int, dict]:
    rnd = random.Random(3)
    return {p: {"status": "text", "width": 612.0, "height": 792.0,
                "lines": [(x, x + 8, y, y + 2, f"w{i}") for i in range(lines)
                          for x, y in [(rnd.uniform(0, 600), rnd.uniform(0, 780))]]} for p in range(pages)}


def test_layout_runs_in_the_child_under_the_documents_time_budget():
    """A layout that takes longer than the time left drops the document's pages (pdf:time_budget)
    and costs the caller no more than that time: the layout runs in the PDF child, not here."""
    cfg = PdfConfig(page_timeout_s=0.05)
    results = _dense_results(8, 4000)
    info = {"pages": 8, "producer": None, "title": None, "repaired": False}
    pdf._worker(cfg.max_memory_mb).send(("count", b"%PDF-1.4"))      # the child started, as in a run
    pdf._worker(cfg.max_memory_mb).receive(60)
    t0 = time.monotonic()
    got = pdf.lay_out(info, results, cfg, seconds_left=0)
    assert time.monotonic() - t0 < 5      # the pages' transfer and the 0.05 s limit, not the layout
    assert got.reason == "pdf:time_budget" and got.stats["pages_dropped"] == {"pdf:time_budget": 8}
    assert [p[:3] for p in got.lost_pages] == [(i, i, "pdf:time_budget") for i in range(1, 9)]
    fine = pdf.lay_out(info, _dense_results(2, 20), PdfConfig(), seconds_left=60)    # and it still works
    assert fine.reason is None and fine.metadata["pdf_pages_text"] == 2


def _serve_hanging_on_page(hang: int, pid_file: str, conn, max_memory_mb: int) -> None:   # runs in the child
    """The PDF child, whose parse of page `hang` (0-based) loops for ever; it notes its pid first."""
    real = pdf._read_page

    def read_page(doc, i, cfg, state):
        if i == hang:
            Path(pid_file).write_text(str(os.getpid()))
            while True:      # the limit counts CPU: a parser stuck in a loop (a sleep: the wall backstop)
                pass
        return real(doc, i, cfg, state)
    pdf._read_page = read_page
    pdf._serve(conn, max_memory_mb)


def test_a_page_whose_parse_hangs_is_dropped_and_reading_goes_on_in_a_fresh_child(tmp_path):
    """tasks/pdf.py: a page that hangs past `page_timeout_s` is dropped as pdf:page_timeout (that page
    only), the hung child is stopped and the next page is read by a new one."""
    import functools

    from quipu.tasks.child_worker import ChildWorker
    cfg = PdfConfig(ocr="never", page_timeout_s=0.75)
    hung = tmp_path / "hung.pid"
    old = getattr(pdf._local, "pdf_worker", None)
    if old is not None:
        old.stop()
    # this thread's PDF child, as pdf._worker makes it (same args), with the hanging page parser
    pdf._local.pdf_worker = ChildWorker(functools.partial(_serve_hanging_on_page, 1, str(hung)),
                                        (cfg.max_memory_mb,), "PDF reader")
    try:
        got = pdf.read_pdf(many_lines_pdf(3, 40), cfg)
        worker = pdf._local.pdf_worker
        assert got.stats["pages_dropped"] == {"pdf:page_timeout": 1}, got.stats
        assert [p[:3] for p in got.lost_pages] == [(2, 2, "pdf:page_timeout")]
        assert got.reason is None and got.metadata["pdf_pages_text"] == 2     # pages 1 and 3 read
        assert worker.alive() and worker.proc.pid != int(hung.read_text())   # a fresh child read page 3
        with pytest.raises(ProcessLookupError):
            os.kill(int(hung.read_text()), 0)                                  # the hung one is gone
    finally:
        pdf._local.pdf_worker.stop()
        pdf._local.pdf_worker = None


def test_a_page_of_thousands_of_tiny_lines_is_dropped_not_laid_out():
    got = pdf.read_pdf(many_lines_pdf(2, pdf.MAX_PAGE_LINES + 500), PdfConfig(ocr="never"))
    assert got.reason == "pdf:page_too_dense" and got.stats["pages_dropped"] == {"pdf:page_too_dense": 2}
    assert "text lines" in got.lost_pages[0][3]


CHILD = """
import sys, time
from quipu.tasks.reading import pdf
w = pdf._worker(512)
w.send(("count", b"%PDF-1.4"))
w.receive(120)
print(w.proc.pid, flush=True)
time.sleep(600)
"""


def _gone(pid: int, within_s: float) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_pdf_child_ignores_ctrl_c_and_dies_with_its_parent_even_on_sigkill():
    """Ctrl-C reaches the whole process group: the child neither dies with a traceback nor stops the
    parent's work; SIGKILL of the parent leaves no child with parent 1."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        child = int(proc.stdout.readline())
        os.kill(child, signal.SIGINT)
        assert not _gone(child, 0.5), "the PDF child died of SIGINT"
        proc.kill()
        proc.wait(10)
        assert _gone(child, 3), "the PDF child outlived its SIGKILLed parent"
        assert "Traceback" not in proc.stderr.read()
    finally:
        proc.kill()


STARTS = """
from quipu.tasks.reading import pdf
for i in range(2):
    w = pdf._worker(512)
    w.start()
    print('started', flush=True)
    w.stop()
"""


def test_ctrl_c_while_a_pdf_child_starts_is_no_traceback():
    """Ctrl-C reaches children still importing (the window where a run's Ctrl-C printed a child's
    traceback): SIGINT is blocked from the fork on, then ignored."""
    proc = subprocess.Popen([sys.executable, "-c", STARTS], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    hits = 0
    while proc.poll() is None:
        for d in os.listdir("/proc"):
            try:
                if d.isdigit() and int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1]) == proc.pid:
                    os.kill(int(d), signal.SIGINT)
                    hits += 1
            except (OSError, IndexError, ValueError):
                pass
        time.sleep(0.01)
    out, err = proc.communicate()
    assert hits and out.count("started") == 2 and "Traceback" not in err, err[-2000:]


def test_long_pdf_changed_between_planning_and_joining_is_quarantined(tmp_path):
    """A long PDF read in ranges and replaced before its join is quarantined with the reason; the
    other inputs of the run are extracted and the accounts add up."""
    from quipu.tasks.extract import ExtractConfig, extract_units, run_extract
    from quipu.tasks.reading.pdf_ranges import plan_unit
    from quipu.tasks.stage import RunContext
    long_pdf, other = tmp_path / "long.pdf", tmp_path / "other.jsonl"
    long_pdf.write_bytes(many_lines_pdf(6, 30))
    other.write_text('{"id": "a", "text": "Una frase cualquiera con bastantes palabras para quedarse."}\n')
    cfg = ExtractConfig(min_chars=1, pdf=PdfConfig(ocr="never", pages_per_unit=2))
    assert len(plan_unit([str(long_pdf)], cfg.pdf)) == 3

    def then_replace(units, run, c, on_result):
        got = extract_units(units, run, c, on_result)
        long_pdf.write_bytes(many_lines_pdf(9, 30, seed=1))      # another, longer file under its name
        return got

    results, report = run_extract([[str(long_pdf)], [str(other)]], RunContext(str(tmp_path / "run")), cfg, then_replace)
    assert report["quarantined"] == 1 and report["kept_docs"] == 1
    assert list(results[0].quarantine_by_reason) == ["pdf changed while read"]
    assert report["records_read"] == report["input_docs"] + report["quarantined"]


def test_page_ranges_share_one_time_budget(tmp_path, monkeypatch):
    """Each range of a long PDF reads under its share of doc_timeout_s, not the whole of it."""
    from quipu.tasks import reading as readers
    from quipu.tasks.reading import pdf_ranges
    from quipu.tasks.stage import RunContext
    path = tmp_path / "long.pdf"
    path.write_bytes(many_lines_pdf(8, 120))
    budgets = []
    real = pdf.read_pages
    monkeypatch.setattr(pdf, "read_pages", lambda *a, budget_s=None, **k: budgets.append(budget_s) or real(*a, budget_s=budget_s, **k))
    cfg = PdfConfig(ocr="never", pages_per_unit=3, doc_timeout_s=80)
    layout = RunContext(str(tmp_path / "run")).layout("extract")
    for n, (part,) in enumerate(pdf_ranges.plan_unit([str(path)], cfg)):
        assert isinstance(part, readers.FileSlice)
        pdf_ranges.read_range(part, layout, f"u{n}", "fp", cfg)
    assert budgets == [30.0, 30.0, 20.0]


def test_pdf_whose_name_is_not_utf8_is_read(tmp_path):
    from quipu.tasks.extract import ExtractConfig, extract_file
    name = os.fsdecode(b"informe-caf\xe9.pdf")
    (tmp_path / name).write_bytes(many_lines_pdf(1, 40))
    r = extract_file(str(tmp_path / name), tmp_path / "run", ExtractConfig(min_chars=1, pdf=PdfConfig(ocr="never")))
    assert (r.input_docs, r.kept_docs, r.quarantined) == (1, 1, 0)


@pytest.mark.parametrize("key, value", [("page_timeout_s", 1e300), ("doc_timeout_s", float("inf")),
                                        ("page_timeout_s", float("nan"))])
def test_pdf_time_limits_are_bounded(key, value):
    from pydantic import ValidationError
    with pytest.raises(ValidationError, match=key):
        PdfConfig(**{key: value})


# ---- checkpoints: nothing outside their folder, every length checked ------------------------------

def _sharded(tmp_path: Path) -> Path:
    import torch
    import torch.distributed.checkpoint as dcp
    step = tmp_path / "checkpoints" / "step-0000001"
    dcp.save({"model": {"w": torch.arange(64, dtype=torch.float32).reshape(8, 8)}},
             checkpoint_id=str(step / "state"), no_dist=True)
    return step


def _rewrite_metadata(step: Path, change) -> None:
    import pickle
    meta_path = step / "state" / ".metadata"
    meta = pickle.loads(meta_path.read_bytes())
    for index, info in list(meta.storage_data.items()):
        change(info)
    meta_path.write_bytes(pickle.dumps(meta))


def _load_one_line(step: Path) -> str:
    from quipu.catalog.errors import UserError
    from quipu.trainer.checkpoint import read_sharded_tensor, sharded_tensor_specs
    with pytest.raises(UserError) as e:
        for name, (shape, dtype) in sharded_tensor_specs(step).items():
            read_sharded_tensor(step, name, shape, dtype)
    message = str(e.value)
    assert "\n" not in message and len(message) < 400, message
    return message


def test_sharded_checkpoint_loads_and_its_metadata_cannot_point_outside_it(tmp_path):
    import torch
    from quipu.trainer.checkpoint import read_sharded_tensor, sharded_tensor_specs
    step = _sharded(tmp_path)
    (shape, dtype), = sharded_tensor_specs(step).values()
    assert torch.equal(read_sharded_tensor(step, "w", shape, dtype), torch.arange(64, dtype=torch.float32).reshape(8, 8))
    outside = tmp_path / "secret"
    outside.write_bytes(b"x" * 100_000)
    _rewrite_metadata(step, lambda info: setattr(info, "relative_path", "../../../secret"))
    assert "outside" in _load_one_line(step)
    _rewrite_metadata(step, lambda info: setattr(info, "relative_path", "/dev/zero"))
    assert "outside" in _load_one_line(step)
    shard = next(p.name for p in (step / "state").iterdir() if p.suffix == ".distcp")
    (step / "state" / "zero.distcp").symlink_to("/dev/zero")
    _rewrite_metadata(step, lambda info: setattr(info, "relative_path", "zero.distcp"))
    assert "zero.distcp" in _load_one_line(step)
    _rewrite_metadata(step, lambda info: (setattr(info, "relative_path", shard), setattr(info, "length", 6 << 30)))
    assert shard in _load_one_line(step) and "truncated" in _load_one_line(step)


def test_truncated_shard_and_symlinked_step_folder_are_one_line_naming_them(tmp_path):
    step = _sharded(tmp_path)
    shard = next(p for p in (step / "state").iterdir() if p.suffix == ".distcp")
    shard.write_bytes(shard.read_bytes()[:-100])
    assert shard.name in _load_one_line(step)
    elsewhere = _sharded(tmp_path / "other")
    linked = tmp_path / "checkpoints" / "step-0000002"
    linked.symlink_to(elsewhere)
    assert "link" in _load_one_line(linked)


def test_one_file_checkpoint_cut_short_is_one_line(tmp_path):
    import torch
    from quipu.trainer.checkpoint import DamagedCheckpoint, load_checkpoint
    path = tmp_path / "step-0000001.pt"
    torch.save({"model": {"w": torch.ones(256)}, "step": 1}, path)
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(DamagedCheckpoint, match="step-0000001.pt"):
        load_checkpoint(path)
    (tmp_path / "step-0000002.pt").symlink_to("/dev/zero")
    with pytest.raises(DamagedCheckpoint, match="link"):
        load_checkpoint(tmp_path / "step-0000002.pt")


def test_shard_damaged_inside_is_one_line_naming_it(tmp_path):
    step = _sharded(tmp_path)
    shard = next(p for p in (step / "state").iterdir() if p.suffix == ".distcp")
    shard.write_bytes(b"\0" * shard.stat().st_size)
    assert shard.name in _load_one_line(step)


# ---- values: finite, in range, known language codes, one line -----------------------------------

def _curate_refusal(tmp_path: Path, *overrides: str) -> str:
    from quipu.flows.config import ConfigError, load_config
    from quipu.flows.curate_config import CurateConfig
    with pytest.raises(ConfigError) as e:
        load_config(CurateConfig, ROOT / "configs" / "curate" / "demo.yaml", list(overrides))
    message = str(e.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("override, key", [
    ("heuristics.fineweb.line_punct_thr={default: 0.12, es: .inf}", "line_punct_thr.es"),
    ("heuristics.fineweb.line_punct_thr=.nan", "line_punct_thr"),
    ("langid.min_score={default: .inf}", "min_score.default"),
    ("extract.pdf.page_timeout_s=1e300", "page_timeout_s"),
    ("extract.timeout_s=.inf", "timeout_s"),
    ("heuristics.fineweb.short_line_thr={default: 0.67, es: 1.5}", "short_line_thr"),
    ("heuristics.gopher_quality.min_doc_words={default: 50, pt: -3}", "min_doc_words"),
])
def test_non_finite_or_unbounded_numbers_are_refused_naming_the_key(tmp_path, override, key):
    assert key in _curate_refusal(tmp_path, override)


@pytest.mark.parametrize("code", ["ES", "xx", "spa"])
def test_unknown_language_codes_are_refused_naming_the_key_and_the_known_codes(tmp_path, code):
    for override, key in [(f"heuristics.fineweb.line_punct_thr={{default: 0.12, {code}: 0.2}}", "line_punct_thr"),
                          (f"langid.languages=[es, {code}]", "langid.languages"),
                          (f"heuristics.per_language={{{code}: {{c4: {{}}}}}}", "heuristics"),
                          (f"langid.min_score={{default: 0.65, {code}: 0.5}}", "min_score")]:
        message = _curate_refusal(tmp_path, override)
        assert key in message and repr(code) in message and "es, pt, en" in message, message


def test_control_characters_in_set_are_one_line():
    from quipu.flows.config import ConfigError, parse_override
    for item in ["extract.min_chars=1\x01", "extract.min\nchars=1", "a=\x1b[31mred"]:
        with pytest.raises(ConfigError) as e:
            parse_override(item)
        assert "\n" not in str(e.value) and "\x1b" not in str(e.value)


def test_a_model_of_another_kind_is_refused_for_a_stage(tmp_path):
    """news.model pointed at the quality classifier (its sidecar says what it is) is one line."""
    import json
    from quipu.scoring.resolver import ModelNotFound, resolve_model
    model = tmp_path / "quality.bin"
    model.write_bytes(b"\xba\x16\x4f\x2f" + b"\0" * 60)
    model.with_suffix(".json").write_text(json.dumps({"kind": "quality-fasttext", "positive_label": "hq"}))
    with pytest.raises(ModelNotFound, match=r"news\.model: .* is a `quality-fasttext` model, not a `news-fasttext`"):
        resolve_model("news-fasttext", str(model), "news.model", (".bin",))
    assert resolve_model("quality-fasttext", str(model), "quality.model", (".bin",)) == str(model)


# ---- model files: what the run uses is finite, and loading them is bounded ---------------------

def test_fasttext_model_with_nan_weights_is_refused_in_one_line(tmp_path, small_quality_model):
    import struct
    from quipu.scoring.model_files import ModelFileError, check_fasttext, fasttext_problem
    assert fasttext_problem(str(small_quality_model)) is None
    check_fasttext(str(small_quality_model), "__label__hq")
    data = bytearray(small_quality_model.read_bytes())
    output_bytes = 2 * 16 * 4 + 17         # 2 labels x dim 16, after its quant flag and shape
    for at, what in [(len(data) - 4, "output"), (len(data) - output_bytes - 4, "input")]:
        bad = bytearray(data)
        bad[at:at + 4] = struct.pack("<f", float("nan"))
        path = tmp_path / f"{what}.bin"
        path.write_bytes(bytes(bad))
        with pytest.raises(ModelFileError, match=f"{path}.*{what} matrix holds NaN"):
            check_fasttext(str(path), "__label__hq")


def test_fasttext_words_too_long_to_load_are_refused_before_loading(tmp_path, monkeypatch, small_quality_model):
    """The loader builds every word's character n-grams (minn..maxn): 60,000-character words cost
    gigabytes however small the file. Here the tiny model's header asks for 1- to 1000-grams."""
    import struct
    from quipu.scoring import model_files
    data = bytearray(small_quality_model.read_bytes())
    data[44:52] = struct.pack("<ii", 1, 1000)       # minn, maxn
    path = tmp_path / "ngrams.bin"
    path.write_bytes(bytes(data))
    assert model_files.fasttext_problem(str(small_quality_model)) is None
    monkeypatch.setattr(model_files, "MAX_NGRAM_BYTES", 2_000)
    assert "character n-grams" in model_files.fasttext_problem(str(path))


def test_model_loading_child_has_a_memory_limit(tmp_path, monkeypatch, small_quality_model):
    from quipu.scoring import model_files
    monkeypatch.setattr(model_files, "CHILD_MEMORY_BYTES", 64 << 20)   # too little for Python and fastText
    path = tmp_path / "m.bin"
    path.write_bytes(small_quality_model.read_bytes())
    with pytest.raises(model_files.ModelFileError) as e:
        model_files.check_fasttext(str(path), "__label__hq")
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def _student(tmp_path: Path, label_mean: float = 3.0, poison: bool = False) -> Path:
    import torch
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from quipu.scoring.wayra import WayraArch, WayraModel, WayraStudent
    torch.manual_seed(0)
    model = WayraModel(WayraArch(vocab_size=300, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=16))
    if poison:
        with torch.no_grad():
            next(model.parameters())[0, 0] = float("nan")
    d = tmp_path / f"student-{label_mean}-{poison}"
    WayraStudent(model, Tokenizer(WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]")), label_mean, 1.0).save(d)
    return d


def test_student_with_nan_label_mean_or_weights_is_refused_and_written_with_the_umask_mode(tmp_path):
    from quipu.catalog.files import default_mode
    from quipu.scoring.wayra import StudentError, WayraStudent
    good = _student(tmp_path)
    WayraStudent.load(good)
    assert all((p.stat().st_mode & 0o777) == default_mode() for p in good.iterdir()), \
        {p.name: oct(p.stat().st_mode & 0o777) for p in good.iterdir()}
    with pytest.raises(StudentError, match="label_mean"):
        WayraStudent.load(_student(tmp_path, label_mean=float("nan")))
    with pytest.raises(StudentError, match="NaN or infinite weights"):
        WayraStudent.load(_student(tmp_path, poison=True))


def test_calibrate_escapes_what_it_writes_so_a_file_name_cannot_inject_keys():
    import yaml
    from quipu.flows.calibrate import config_yaml
    name = "ref\nlangid:\n  languages: [xx]\u2028enabled: false\x85c: 1.jsonl"
    text = config_yaml({"heuristics": {"c4": {"enabled": True}}}, {("heuristics", "c4", "enabled"): f"from {name}"},
                       [f"calibrated en: 80 reference documents from {name}"])
    assert yaml.safe_load(text) == {"heuristics": {"c4": {"enabled": True}}}
    assert "\\n" in text and "\\u2028" in text


# ---- disk full: one line naming the path and "no space left" -----------------------------------

def test_a_short_write_without_errno_reads_as_no_space_left_naming_the_file(tmp_path, monkeypatch):
    """numpy's writers on a full disk raise `OSError: 45440 requested and 992 written`: no errno,
    no path. It is told as what it is, naming the file."""
    import errno
    from quipu.catalog.files import with_path
    full = os.statvfs_result((4096, 4096, 100, 0, 0, 10, 0, 0, 0, 255))
    monkeypatch.setattr(os, "statvfs", lambda p: full)
    got = with_path(OSError("45440 requested and 992 written"), tmp_path / "seg-1-0-sig.npy")
    assert (got.errno, got.filename) == (errno.ENOSPC, str(tmp_path / "seg-1-0-sig.npy"))
    assert "No space left" in got.strerror


@pytest.fixture()
def tiny_disk(tmp_path):
    where = tmp_path / "disk"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_dedup_index_on_a_full_disk_is_one_line_naming_the_file(tiny_disk):
    import numpy as np
    from quipu.tasks.dedup_index import FileStore
    store = FileStore(tiny_disk / "index")
    with pytest.raises(OSError) as e:
        store.put_array("seg-1-0-sig.npy", np.arange(100_000, dtype=np.uint32))
    assert e.value.filename == str(tiny_disk / "index" / "seg-1-0-sig.npy") and "No space left" in e.value.strerror
    assert not [p for p in (tiny_disk / "index").iterdir() if p.name != ".lock"]     # no half-written file left


# ---- tiny files that would cost gigabytes -------------------------------------------------------

BOMB_READ = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1536 << 20, 1536 << 20))
from quipu.tasks import reading as readers
from quipu.tasks.reading.records import ReadStats
rows = readers.read(sys.argv[1], ReadStats(), readers.ReadLimits(max_record_bytes=1 << 20))
got = [(type(r).__name__, getattr(r, "reject", None), len(getattr(r, "text", "") or "")) for r in rows]
# VmHWM, this process image's own peak: ru_maxrss also carries the (v)forking parent's peak across exec
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(len(got), sorted(set(got)), hwm >> 10)
"""


@pytest.mark.parametrize("column", ["text", "url"])
def test_parquet_rows_sharing_one_huge_dictionary_entry_cost_it_once(tmp_path, column):
    """A few-KB parquet file whose 200 rows share one 24 MB dictionary string (in the text, or in
    another column) decodes to ~5 GB when each row is made its own copy: read under a 1.5 GiB
    address-space limit, every row comes back (too large, or kept) and the peak stays small."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows = 200
    bomb = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["a" * (24 << 20)]))
    table = {"text": bomb if column == "text" else pa.array(["ok"] * rows),
             "url": bomb if column == "url" else pa.array(["u"] * rows)}
    path = tmp_path / "bomb.parquet"
    pq.write_table(pa.table(table), path, compression="zstd")
    assert path.stat().st_size < 100_000
    env = {**os.environ, "ARROW_DEFAULT_MEMORY_POOL": "system"}   # mimalloc reserves address space unevenly
    p = subprocess.run([sys.executable, "-c", BOMB_READ, str(path)], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-1500:]
    n, kinds, peak_mib = p.stdout.split(" ", 1)[0], p.stdout.split(" ", 1)[1].rsplit(" ", 1)[0], int(p.stdout.rsplit(" ", 1)[1])
    assert int(n) == rows and peak_mib < 1024, p.stdout
    assert ("too_large" in kinds) == (column == "text"), kinds


def test_one_long_string_aliased_many_times_is_refused_before_it_expands(tmp_path):
    """A 1 MB config whose one 1 MiB string is aliased 300 times would be 300 MB to validate and to
    hash as the run's identity: refused in one line, as the alias bomb of many small values is."""
    from quipu.flows.config import ConfigError, load_config
    from quipu.flows.curate_config import CurateConfig
    path = tmp_path / "bomb.yaml"
    path.write_text(f"dedup:\n  _x: &big '{'a' * (1 << 20)}'\nbench_notes: [{', '.join(['*big'] * 300)}]\n")
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="MB of text") as e:
        load_config(CurateConfig, path)
    assert "\n" not in str(e.value) and time.monotonic() - t0 < 10

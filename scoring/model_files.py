"""Model files are data: a fastText file is checked for internal consistency before the native
loader sees it, then loaded once in a child process, so that a file the loader would crash on
(`free(): invalid next size`, an abort) costs one line naming the file, not the run.

- `fasttext_problem(path)` walks the binary layout (fastText 0.9: header, arguments, dictionary,
  input and output matrices, dense or product-quantized) with the declared sizes checked against
  sane limits and against the file size: a changed integer or a truncated file is named here.
- `check_fasttext(path, positive)` runs the load (and for a classifier the scoring of a built-in
  probe set of good and junk text) in a child: a crash, or scores that are the same for every
  probe text (a model that would keep or remove everything alike), is a `ModelFileError`.
- `load_fasttext(path, positive)`: the check, then the load in this process (the one loader).
`check_kenlm(path)` loads a KenLM file in a child the same way. Run as
`python -m quipu.scoring.model_files PATH [LABEL]` (or `--kenlm PATH`) it is that child.
`weights_fingerprint(path)` names a model file's or folder's content (the teacher's labels and an HF
judge's scores are keyed by it).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import struct
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from quipu.catalog.errors import UserError

FASTTEXT_MAGIC = 793712314
MAX_DIM = 10_000
MAX_WORDS = 100_000_000
MAX_BUCKET = 1 << 31
KSUB = 256                 # centroids per product-quantizer subspace
CHILD_TIMEOUT_S = 300
FLOAT_CHUNK = 1 << 20
NGRAM_BYTES = 8            # an n-gram id in a word's subword list, with the vector's growth
MAX_NGRAM_BYTES = 1 << 30
CHILD_MEMORY_BYTES = 1536 << 20   # address space of the loading child, plus twice the file's size

# Good and junk text in the project's languages: a quality classifier scores them differently.
PROBE = [
    "The committee published its annual report on Tuesday, describing how the new water treatment plant "
    "reduced contamination in the river by almost forty percent over two years.",
    "El ayuntamiento aprobó ayer el presupuesto para el próximo año, que incluye nuevas inversiones en "
    "transporte público y en la rehabilitación de viviendas del casco antiguo.",
    "O governo anunciou um programa de apoio às pequenas empresas, com crédito a juros reduzidos e "
    "formação profissional para os trabalhadores das regiões mais afetadas.",
    "In this chapter we prove that every bounded monotone sequence of real numbers converges, and we use "
    "the result to define the exponential function.",
    "click here click here BUY NOW cheap cheap cheap viagra casino bonus free free free $$$ win win win",
    "asdf qwer zxcv asdf qwer zxcv 1234 5678 !!!! ???? #### @@@@ lorem ipsum ipsum ipsum",
    "home | about | contact | login | register | cart | home | about | contact | login | register",
    "Copyright 2024 All rights reserved. Privacy Policy. Terms of Use. Cookie settings. Sitemap.",
]


class ModelFileError(UserError, ValueError):
    """A model file that must not be used; the message names the file."""


class _Reader:
    def __init__(self, fh, size: int):
        self.fh, self.size = fh, size

    def unpack(self, fmt: str):
        n = struct.calcsize(fmt)
        data = self.fh.read(n)
        if len(data) != n:
            raise EOFError
        return struct.unpack(fmt, data)

    def skip(self, n: int) -> None:
        if n < 0 or self.fh.tell() + n > self.size:
            raise EOFError
        self.fh.seek(n, os.SEEK_CUR)

    def word(self) -> int:
        """Skip one NUL-terminated dictionary word (at most 64 KiB); its length in bytes."""
        chunk = self.fh.read(1 << 16)
        end = chunk.find(b"\0")
        if end < 0:
            raise EOFError
        self.fh.seek(end + 1 - len(chunk), os.SEEK_CUR)
        return end

    def floats(self, n: int) -> bool:
        """Read `n` float32 values in bounded chunks: whether all are finite (no NaN, no inf)."""
        import numpy as np
        if n < 0 or self.fh.tell() + 4 * n > self.size:
            raise EOFError
        finite = True
        while n > 0:
            k = min(n, FLOAT_CHUNK)
            finite = finite and bool(np.isfinite(np.frombuffer(self.fh.read(4 * k), dtype="<f4")).all())
            n -= k
        return finite


def _matrix(r: _Reader, dim: int, rows: int, what: str) -> str | None:
    """Skip one saved matrix (after its `quant` flag); a problem, or None."""
    (quant,) = r.unpack("<?")
    if not quant:
        m, n = r.unpack("<qq")
        if (m, n) != (rows, dim):
            return f"{what} matrix is {m} x {n}, the header and dictionary say {rows} x {dim}"
        return None if r.floats(m * n) else f"{what} matrix holds NaN or infinite weights"
    qnorm, m, n, codesize = r.unpack("<?qqi")
    if (m, n) != (rows, dim) or codesize <= 0:
        return f"quantized {what} matrix is {m} x {n} ({codesize} code bytes), the header and dictionary say {rows} x {dim}"
    r.skip(codesize)
    for subspaces_dim in ([dim, 1] if qnorm else [dim]):
        pq_dim, nsubq, dsub, lastdsub = r.unpack("<iiii")
        if pq_dim != subspaces_dim or not 0 < dsub <= pq_dim or not 0 < nsubq <= pq_dim:
            return f"quantizer of the {what} matrix declares dim {pq_dim}, {nsubq} subspaces of {dsub}"
        if not r.floats(pq_dim * KSUB):
            return f"quantizer of the {what} matrix holds NaN or infinite centroids"
        if qnorm and subspaces_dim == dim:
            r.skip(m)   # norm codes, then the norm quantizer (dim 1)
    return None


def fasttext_problem(path: str) -> str | None:
    """What is wrong with the fastText file at `path` (declared sizes against limits and the file
    size), or None; reads the layout, never the weights."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            r = _Reader(fh, size)
            magic, version = r.unpack("<ii")
            if magic != FASTTEXT_MAGIC:
                return "not a fastText model file (wrong magic number)"
            if version not in (11, 12):
                return f"unknown fastText file version {version}"
            dim, ws, epoch, min_count, neg, word_ngrams, loss, model, bucket, minn, maxn, lr_update = r.unpack("<12i")
            r.unpack("<d")
            if not 0 < dim <= MAX_DIM or not 0 <= bucket <= MAX_BUCKET or not 1 <= model <= 3 or not 1 <= loss <= 4 \
                    or not 0 <= minn <= maxn <= 1000 or word_ngrams < 0:
                return (f"header declares dim {dim}, bucket {bucket}, model {model}, loss {loss}, "
                        f"char n-grams {minn}-{maxn}: not a consistent fastText model")
            n_entries, nwords, nlabels, _, prune = r.unpack("<iiiqq")
            if not (0 <= nwords <= MAX_WORDS and 0 <= nlabels <= MAX_WORDS and n_entries == nwords + nlabels) or prune < -1:
                return f"dictionary declares {n_entries} entries = {nwords} words + {nlabels} labels: inconsistent"
            if n_entries * 10 > size:
                return f"dictionary declares {n_entries:,} entries, more than a {size:,}-byte file can hold"
            ngrams = 0          # character n-grams the loader builds for the words: its memory
            for _ in range(n_entries):
                length = r.word() + 2    # with '<' and '>'
                ngrams += sum(max(0, length - n + 1) for n in range(max(minn, 1), maxn + 1)) if maxn else 0
                r.skip(9)    # int64 count, int8 type
            if ngrams * NGRAM_BYTES > MAX_NGRAM_BYTES:
                return (f"its dictionary's words make {ngrams:,} character n-grams (~{ngrams * NGRAM_BYTES >> 20:,} MiB "
                        f"to load, at most {MAX_NGRAM_BYTES >> 20:,} MiB): words this long are no vocabulary")
            if prune > 0:
                r.skip(prune * 8)
            problem = _matrix(r, dim, nwords + (prune if prune >= 0 else bucket), "input")
            if problem:
                return problem
            problem = _matrix(r, dim, nlabels if model == 3 else nwords, "output")
            if problem:
                return problem
            if fh.tell() != size:
                return f"{size - fh.tell():,} bytes after the output matrix: not one fastText model"
    except EOFError:
        return f"truncated: the layout it declares is longer than the file ({size:,} bytes)"
    except (OSError, struct.error) as e:
        return f"unreadable: {e}"
    return None


def weights_fingerprint(path: Path) -> str:
    """Content hash of a model's weights (and config), a file or a HF directory: a model retrained at the
    same path gets a new fingerprint (the teacher's labels, a judge's scores)."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(
        f for f in path.iterdir() if f.is_file() and f.suffix in (".json", ".safetensors", ".bin", ".gguf"))
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            while block := fh.read(1 << 22):
                h.update(block)
    return h.hexdigest()[:24]


def _run_child(args: list[str], path: str, what: str) -> dict:
    """Load a model in a child (`python -m quipu.scoring.model_files ARGS`): its JSON answer, or a
    ModelFileError for a crash, a timeout or an error, naming the file."""
    limit = CHILD_MEMORY_BYTES + 2 * os.path.getsize(path)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    try:
        p = subprocess.run([sys.executable, "-m", "quipu.scoring.model_files", *args], capture_output=True, text=True,
                           timeout=CHILD_TIMEOUT_S, env=env, preexec_fn=lambda: _limit_memory(limit))
    except subprocess.TimeoutExpired:
        raise ModelFileError(f"{what} {path}: loading it took over {CHILD_TIMEOUT_S} s") from None
    if p.returncode != 0 and ("MemoryError" in p.stderr or "bad_alloc" in p.stderr):
        raise ModelFileError(f"{what} {path}: loading it needs over {limit >> 20:,} MiB: not a model this run can use")
    if p.returncode < 0:
        loader = what.split()[0]
        raise ModelFileError(f"{what} {path} crashed the {loader} loader ({signal.Signals(-p.returncode).name}): "
                             "the file is corrupt; replace it") from None
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        last = (p.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise ModelFileError(f"{what} {path} cannot be loaded: {last}")
    out = json.loads(lines[-1])
    if out.get("error"):
        raise ModelFileError(f"{what} {path}: {out['error']}")
    return out


def _limit_memory(limit: int) -> None:     # runs in the child, before exec
    import resource
    from quipu.catalog.processes import die_with_parent
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    die_with_parent()


@lru_cache(maxsize=16)
def _checked(path: str, mtime_ns: int, size: int, positive: str | None) -> None:
    problem = fasttext_problem(path)
    if problem:
        raise ModelFileError(f"fastText model {path}: {problem}")
    scores = _run_child([path, positive or ""], path, "fastText model").get("scores")
    if scores is not None and not all(math.isfinite(x) for x in scores):
        raise ModelFileError(f"classifier model {path} scores NaN or infinity: its weights are damaged; retrain it")
    if scores is not None and max(scores) - min(scores) < 1e-4:
        raise ModelFileError(f"classifier model {path} gives every probe text the same score ({scores[0]:.4f}): "
                             "truncated or untrained; retrain it")


@lru_cache(maxsize=16)
def _kenlm_checked(path: str, mtime_ns: int, size: int) -> None:
    _run_child(["--kenlm", path], path, "KenLM model")


def check_kenlm(path: str) -> None:
    """ModelFileError unless the KenLM file loads in a child process (KenLM aborts the process on
    some corrupt files). Once per file version and process."""
    st = os.stat(path)
    _kenlm_checked(os.path.abspath(path), st.st_mtime_ns, st.st_size)


def check_fasttext(path: str, positive: str | None = None) -> None:
    """ModelFileError (one line naming the file) unless `path` is a consistent fastText file that
    loads in a child process and, for a classifier with label `positive`, scores the probe set
    differently from text to text. Once per file version and process."""
    st = os.stat(path)
    _checked(os.path.abspath(path), st.st_mtime_ns, st.st_size, positive)


def load_fasttext(path: str, positive: str | None = None):
    """The one loader of fastText files (the language-ID model and every classifier of the family):
    checked first (`check_fasttext`), then loaded in this process; anything wrong with the file is a
    `ModelFileError`, one line naming it."""
    check_fasttext(path, positive)
    import fasttext
    fasttext.FastText.eprint = lambda *a, **k: None   # the load_model deprecation warning
    try:
        return fasttext.load_model(path)
    except Exception as e:   # damaged beyond what the check reads, or changed since
        raise ModelFileError(f"cannot load fastText model {path}: {e}") from None


def _child(path: str, positive: str) -> None:
    import fasttext
    fasttext.FastText.eprint = lambda *a, **k: None
    model = fasttext.load_model(path)
    if not positive:
        print(json.dumps({"labels": len(model.labels)}))
        return
    labels = list(model.labels)
    if positive not in labels:
        print(json.dumps({"error": f"no label {positive} (labels: {', '.join(labels[:10])})"}))
        return
    got, probs = model.f.multilinePredict([t.lower() + "\n" for t in PROBE], len(labels), 0.0, "strict")
    print(json.dumps({"scores": [float(dict(zip(ls, ps)).get(positive, 0.0)) for ls, ps in zip(got, probs)]}))


def _kenlm_child(path: str) -> None:
    import kenlm
    print(json.dumps({"order": kenlm.Model(path).order}))


if __name__ == "__main__":
    if sys.argv[1] == "--kenlm":
        _kenlm_child(sys.argv[2])
    else:
        _child(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")

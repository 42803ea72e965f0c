"""KenLM n-gram perplexity, CCNet style: one normalisation and tokenisation for training and scoring.

CCNet (Wenzek et al. 2020) scores every paragraph of a document with a per-language 5-gram model
trained on normalised text and reports the document perplexity 10^(-sum log10 p / sum tokens).
Normalisation as in cc_net/text_normalizer.py, except accents are kept (they carry meaning in es/pt):
lower case, every digit to 0, Unicode punctuation folded to ASCII, non-printing characters removed.
Tokenisation: words and single punctuation marks separated by spaces (CCNet uses SentencePiece; a
regex needs no extra model and is identical on both sides).

Training shells out to KenLM's `lmplz` and `build_binary` (the Makefile's `kenlm` target builds them
into build/kenlm/bin); scoring uses the `kenlm` Python module. A model is a `<lang>.binary` file
next to a `<lang>.json` sidecar holding the normalisation version and training facts.
"""
from __future__ import annotations

import math
import os
import re
import subprocess
import tempfile
import unicodedata
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Sequence

from quipu.catalog.errors import UserError
from quipu.scoring.resolver import KENLM_KIND, resolve_model
from quipu.catalog.files import atomic_path, read_json, write_json_atomic

NORMALIZATION_VERSION = "ccnet-keep-accents-v1"
KENLM_BIN_DIR = Path(__file__).resolve().parents[1] / "build" / "kenlm" / "bin"
KENLM_BINARY_MAGIC = b"mmap lm http://kheafield.com/code"

UNICODE_PUNCT = {
    "，": ",", "。": ".", "、": ",", "„": '"', "”": '"', "“": '"', "«": '"', "»": '"', "１": '"',
    "」": '"', "「": '"', "《": '"', "》": '"', "´": "'", "∶": ":", "：": ":", "？": "?", "！": "!",
    "（": "(", "）": ")", "；": ";", "–": "-", "—": " - ", "．": ". ", "～": "~", "’": "'", "‘": "'",
    "…": "...", "━": "-", "〈": "<", "〉": ">", "【": "[", "】": "]", "％": "%", "►": "-",
}
_PUNCT_RE = re.compile("[" + "".join(re.escape(c) for c in UNICODE_PUNCT) + "]")
_DIGIT_RE = re.compile(r"\d")
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


class KenLMError(UserError, ValueError):
    """A KenLM model or binary that cannot be used; the message names the path."""


def _strip_nonprinting(text: str) -> str:
    return "".join(c for c in text if c in "\n\t" or unicodedata.category(c)[0] != "C")


def normalize(line: str) -> str:
    """CCNet normalisation with accents kept: lowercase, digits→0, Unicode punctuation folded."""
    line = unicodedata.normalize("NFC", line.strip().lower())
    line = _DIGIT_RE.sub("0", line)
    line = _PUNCT_RE.sub(lambda m: UNICODE_PUNCT[m.group(0)], line)
    return _strip_nonprinting(line)


def tokenize(line: str) -> str:
    """The space-separated tokens KenLM sees (training and scoring alike)."""
    return " ".join(_TOKEN_RE.findall(normalize(line)))


def doc_lines(text: str) -> list[str]:
    """Tokenised non-empty paragraphs (lines) of a document: CCNet scores each line as a sentence."""
    return [t for t in (tokenize(line) for line in (text or "").split("\n")) if t]


# ---- training ---------------------------------------------------------------------------------

def kenlm_binaries(bin_dir: str | Path | None = None) -> tuple[Path, Path]:
    d = Path(bin_dir) if bin_dir else Path(os.environ.get("QUIPU_KENLM_BIN", KENLM_BIN_DIR))
    lmplz, build_binary = d / "lmplz", d / "build_binary"
    if not (os.access(lmplz, os.X_OK) and os.access(build_binary, os.X_OK)):
        raise KenLMError(f"KenLM's lmplz/build_binary not found in {d}: build them with `make kenlm`")
    return lmplz, build_binary


def kenlm_available(bin_dir: str | Path | None = None) -> bool:
    try:
        kenlm_binaries(bin_dir)
        return True
    except KenLMError:
        return False


def train_kenlm(texts: Iterable[str], output: str | Path, order: int = 5, memory: str = "20%",
                prune: Sequence[int] = (), bin_dir: str | Path | None = None) -> dict:
    """Train an order-`order` model on `texts` and write the binary atomically to `output`.

    Returns training facts (documents, lines, tokens, seconds) which also go in the sidecar.
    `--discount_fallback` lets small corpora (tests, the demo) train where Kneser-Ney's discounts
    cannot be estimated from the count-of-counts.
    """
    import time
    lmplz, build_binary = kenlm_binaries(bin_dir)
    output = Path(output)
    t0 = time.perf_counter()
    n_docs = n_lines = n_tokens = 0
    with tempfile.TemporaryDirectory(prefix="quipu-kenlm-") as tmp:
        corpus = Path(tmp) / "corpus.txt"
        with open(corpus, "w", encoding="utf-8") as fh:
            for text in texts:
                lines = doc_lines(text)
                n_docs += 1
                for line in lines:
                    fh.write(line + "\n")
                    n_lines += 1
                    n_tokens += line.count(" ") + 1
        if n_tokens == 0:
            raise KenLMError(f"KenLM training for {output}: no text to train on")
        arpa = Path(tmp) / "model.arpa"
        cmd = [str(lmplz), "-o", str(order), "-S", memory, "-T", tmp, "--discount_fallback"]
        if prune:
            cmd += ["--prune", *map(str, prune)]
        with open(corpus, "rb") as src, open(arpa, "wb") as dst:
            proc = subprocess.run(cmd, stdin=src, stdout=dst, stderr=subprocess.PIPE)
        if proc.returncode != 0:
            raise KenLMError(f"lmplz failed ({proc.returncode}) for {output}: {proc.stderr.decode()[-500:]}")
        with atomic_path(output) as tmp_bin:
            proc = subprocess.run([str(build_binary), str(arpa), str(tmp_bin)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
            if proc.returncode != 0:
                raise KenLMError(f"build_binary failed for {output}: {proc.stderr.decode()[-500:]}")
    facts = {"order": order, "documents": n_docs, "lines": n_lines, "tokens": n_tokens,
             "normalization": NORMALIZATION_VERSION, "seconds": round(time.perf_counter() - t0, 2)}
    write_json_atomic(output.with_suffix(".json"), facts)
    return facts


# ---- scoring ----------------------------------------------------------------------------------

class KenLMScorer:
    """A loaded KenLM binary; `perplexity(texts)` as CCNet computes it (all lines pooled)."""

    def __init__(self, path: str | Path, max_chars: int | None = None):
        self.path = Path(path)
        self.max_chars = max_chars
        if not self.path.is_file():
            raise KenLMError(f"KenLM model not found: {self.path}")
        with open(self.path, "rb") as fh:
            head = fh.read(len(KENLM_BINARY_MAGIC))
        if head != KENLM_BINARY_MAGIC:
            raise KenLMError(f"KenLM model {self.path} is not a KenLM binary (corrupt or wrong file; "
                             "build one with `quipu kenlm train`)")
        sidecar = self.path.with_suffix(".json")
        meta = read_json(sidecar) if sidecar.is_file() else {}
        if meta.get("normalization", NORMALIZATION_VERSION) != NORMALIZATION_VERSION:
            raise KenLMError(f"KenLM model {self.path} was trained with normalisation "
                             f"{meta.get('normalization')!r}, this code uses {NORMALIZATION_VERSION!r}")
        from quipu.scoring.model_files import ModelFileError, check_kenlm
        try:   # a first load in a child: KenLM aborts the process on some corrupt files
            check_kenlm(str(self.path))
        except ModelFileError as e:
            raise KenLMError(str(e)) from None
        import kenlm
        try:
            self.model = kenlm.Model(str(self.path))
        except Exception as e:
            raise KenLMError(f"cannot load KenLM model {self.path}: {e}") from None

    def log_ppl(self, text: str) -> float:
        """Natural-log perplexity of a document; NaN when it has no tokens."""
        if self.max_chars:
            text = text[: self.max_chars]
        log10, n = 0.0, 0
        for line in doc_lines(text):
            log10 += self.model.score(line, bos=True, eos=True)
            n += line.count(" ") + 2          # tokens + </s>
        return -log10 * math.log(10) / n if n else math.nan

    def perplexity(self, texts: Sequence[str]) -> list[float]:
        return [math.exp(v) if not math.isnan(v) else math.nan for v in map(self.log_ppl, texts)]


def model_paths(model: str | Path, languages: Sequence[str]) -> dict[str, Path]:
    """A KenLM model spec → per-language binaries: a directory holding `<lang>.binary`, or one file."""
    p = Path(model)
    if p.is_dir():
        found = {lang: p / f"{lang}.binary" for lang in languages if (p / f"{lang}.binary").is_file()}
        if not found:
            raise KenLMError(f"KenLM model directory {p} holds no <lang>.binary for {', '.join(languages)}")
        return found
    return {"*": p}


@lru_cache(maxsize=16)
def load_kenlm(path: str) -> KenLMScorer:
    """A KenLM binary, loaded once per process (threads share it)."""
    return KenLMScorer(path)


def resolve_kenlm(spec: str | dict[str, str] | None, key: str = "kenlm") -> dict[str, str]:
    """{lang or '*': binary path} from a config's reference: {lang: path}, a directory (every
    `<lang>.binary` in it), one binary for all languages, or a catalog name of a `kenlm` model."""
    if not spec:
        return {}
    if isinstance(spec, dict):
        return {lang: str(Path(p).expanduser()) for lang, p in spec.items()}
    p = Path(spec).expanduser()
    if not p.exists():
        p = Path(resolve_model(KENLM_KIND, spec, key))
    if p.is_dir():
        found = {f.stem: str(f) for f in sorted(p.glob("*.binary"))}
        if not found:
            raise KenLMError(f"{key}: directory {p} holds no <lang>.binary")
        return found
    return {"*": str(p)}

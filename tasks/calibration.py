"""Per-language thresholds from reference text (the FineWeb-2 method), and the report card of a config.

Given text a user trusts in one language (`reference`) and optionally text they want removed
(`junk`), `measure` computes every rule's statistic on every document exactly as the heuristics
stage does in `compat: quipu` (quipu.tasks.language_rules) plus langid's score; `calibrate` sets:

- langid `min_score`: tau = max(0.3, min(0.9, median - sigma)) of the language's LID scores on the
  reference (FineWeb-2, Penedo et al. 2025, section 3);
- every calibrated filter threshold at the same percentile of the reference distribution (the low
  tail for a minimum, the high tail for a maximum), the percentile chosen by bisection so that
  the share `keep` of the reference passes every rule together (not each rule alone: 20 rules
  each keeping 99 % keep far less than 99 % together). Each threshold is then clipped to the
  rule's plausible range (`Rule.bounds`): a reference set with no repeated line at all must not
  make one repeated line fatal, and a tail of a few odd documents must not open a rule up to junk.
  The tight end of each range is datatrove's English default (validated on web text at scale),
  except where quipu's statistic differs from datatrove's (alpha words, line punctuation,
  sentences, stop words: their ends were set on the shared es/pt/en text): clean reference text
  says how far a language needs a rule loosened, while a reference set cleaner than the web would
  otherwise tighten every rule past what other prose of the same language passes (measured:
  Shakespeare's repeated stage lines, bench/calibrate_default.py).

Rules about a document's length (min/max words), and C4's whole-document rules (lorem ipsum,
curly bracket) are policy, not a property of the language: they are applied as configured and
not calibrated. The `keep` share is of the reference documents that langid keeps (at the new tau)
and that the length rules keep; the report shows what every rule removes of all of them.

`evaluate` gives, per rule, the reference and junk distributions (histograms), the threshold and
the share of each removed by the rule alone and by all together: the calibration report. Pure
(no Prefect); deterministic (sorted inputs, no sampling).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from quipu.tasks import language_rules
from quipu.tasks.heuristics import HeuristicsConfig, build_chain
from quipu.tasks.langid import LangIdConfig, default_model_path, load_fasttext, predict_topk
from quipu.tasks.language_rules import Rule
from quipu.tasks.per_language import resolve

MIN_REFERENCE_DOCS = 50      # resolving a 3 % tail needs a few dozen documents; fewer is a guess
MIN_LANGUAGE_SHARE = 0.8     # of the reference identified as the language, or it is another language's
HIST_BINS = 30


# every heuristics threshold, declared by its rule (statistic, direction, plausible range)
RULES: list[Rule] = language_rules.calibrated_rules()
LID = Rule("langid", "min_score", "lang_score", "min", (0.3, 0.9), falsy_off=False)


class CalibrationError(ValueError):
    """A reference set calibration cannot use (empty, too small, another language): one line."""


@dataclass
class Measured:
    """Every document's statistics for one language: one array per statistic."""
    lang: str
    docs: int
    stats: dict[str, np.ndarray]
    lid_labels: list[str]


def rule_objects(heur: HeuristicsConfig, lang: str) -> list[tuple[str, Any]]:
    """The `compat: quipu` filters for `lang` (enabled ones, in order), built by the stage's builder."""
    return build_chain(heur.model_copy(update={"compat": "quipu"}), lang)


def statistics(text: str, rules: list[tuple[str, Any]]) -> dict[str, float]:
    """One document's statistics as the chain sees it: each filter measures the text the one before
    it left (FineWeb measures what C4 kept)."""
    out: dict[str, float] = {}
    for _, rule in rules:
        stats, text = rule.measure(text)
        out.update(stats)
    return out


def lid_scores(texts: list[str], lang: str, langid: LangIdConfig) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Top label, the score of `lang` (0 if not among the top 4) and the best rival's score, per text."""
    model = load_fasttext(langid.model_path or default_model_path())
    texts = [t[: langid.max_chars] for t in texts]
    preds = predict_topk(model, texts, 4) if texts else []
    labels = [p[0][0] if p else "unknown" for p in preds]
    score = np.array([p[0][1] if p and p[0][0] == lang else 0.0 for p in preds])
    targets = set(langid.languages)
    rival = np.array([next((s for code, s in p if code not in targets), 0.0) for p in preds])
    return labels, score, rival


def measure(texts: list[str], lang: str, heur: HeuristicsConfig, langid: LangIdConfig) -> Measured:
    labels, score, rival = lid_scores(texts, lang, langid)
    rules = rule_objects(heur, lang)
    rows = [statistics(t, rules) for t in texts]
    keys = sorted({k for r in rows for k in r})
    stats = {k: np.array([r.get(k, math.nan) for r in rows], float) for k in keys}
    stats["lang_score"], stats["lang_rival"] = score, rival
    return Measured(lang, len(texts), stats, labels)


def check_reference(n_docs: int, lang: str, labels: list[str] | None = None) -> None:
    """Fail with one line: empty, too small, or mostly another language."""
    if n_docs == 0:
        raise CalibrationError(f"reference for {lang}: no documents (calibration needs at least {MIN_REFERENCE_DOCS})")
    if n_docs < MIN_REFERENCE_DOCS:
        raise CalibrationError(f"reference for {lang}: {n_docs} documents, calibration needs at least "
                               f"{MIN_REFERENCE_DOCS} (a 3 % tail cannot be resolved on fewer)")
    if labels is not None:
        same = sum(1 for x in labels if x == lang)
        if same < MIN_LANGUAGE_SHARE * len(labels):
            counts: dict[str, int] = {}
            for x in labels:
                counts[x] = counts.get(x, 0) + 1
            top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
            raise CalibrationError(f"reference for {lang}: only {same} of {len(labels)} documents are identified as "
                                   f"{lang} (most: {', '.join(f'{k} {v}' for k, v in top)}); is --lang right?")


# ---- thresholds --------------------------------------------------------------------------------

def threshold_of(rule: Rule, heur: HeuristicsConfig, langid: LangIdConfig, lang: str):
    """The threshold that applies to `lang` now (None: the rule is off for it)."""
    if rule.filter == "langid":
        return resolve(langid.min_score, lang, 0.0)
    fc = heur.filter_config(rule.filter, lang)
    if not fc.enabled:
        return None
    value = getattr(fc, rule.param)
    if rule.n is not None:
        value = dict((int(n), f) for n, f in value).get(rule.n)
    if rule.param == "filter_curly_bracket":
        return 0.0      # whole-document rules: any hit removes
    if value is None or (rule.falsy_off and not value) or (rule.param == "min_num_sentences" and value == -1):
        return None
    return float(value)


def passes(rule: Rule, values: np.ndarray, threshold: float | None, heur: HeuristicsConfig | None = None,
           lang: str | None = None) -> np.ndarray:
    """Which documents the rule keeps at `threshold` (a statistic of NaN: nothing left to measure, removed)."""
    if threshold is None:
        return np.ones(len(values), bool)
    with np.errstate(invalid="ignore"):
        if rule.kind == "min":
            ok = values >= threshold
            if rule.stat == "line_punct_ratio" and heur is not None and resolve(heur.fineweb.line_punct_exclude_zero, lang, False):
                ok |= values == 0
        else:
            ok = values <= threshold
    if rule.filter == "fineweb":
        ok &= ~np.isnan(values)
    return ok


def lid_passes(m: Measured, langid: LangIdConfig, tau: float) -> np.ndarray:
    max_rival = resolve(langid.max_rival_score, m.lang)
    ok = np.array([x == m.lang for x in m.lid_labels]) & (m.stats["lang_score"] >= tau)
    if max_rival is not None:
        ok &= m.stats["lang_rival"] < max_rival
    return ok


def lid_tau(scores: np.ndarray) -> float:
    """FineWeb-2's LID threshold: max(0.3, min(0.9, median - sigma))."""
    return float(max(0.3, min(0.9, np.median(scores) - np.std(scores))))


def lid_tau_over(where: str) -> str:
    """How a tau computed FineWeb-2's way over `where` (a crawl) is described in a config's comment."""
    return f"max(0.3, min(0.9, median - sigma)) of the LID scores over {where}"


def calibrate(m: Measured, heur: HeuristicsConfig, langid: LangIdConfig, keep: float,
              crawl_lid: tuple[list[str], np.ndarray] | None = None,
              lid_tau_given: tuple[float, str] | None = None) -> dict[str, dict]:
    """New thresholds for `m.lang`: {rule key: {"rule", "value", "percentile", "reference_docs"}}.
    With `crawl_lid` (top labels and `m.lang` scores of a sample of the user's crawl), the LID
    threshold is FineWeb-2's: computed over the crawl documents labelled `m.lang`, not the reference
    (clean reference text puts every language at the 0.9 cap, which loses real prose). `lid_tau_given`
    (value, how it was computed) sets tau outright: e.g. one computed the same way over a crawl the user
    cannot sample here (FineWeb-2 publishes its per-language values); the text is the config's comment."""
    is_lang = np.array([x == m.lang for x in m.lid_labels])
    tau = lid_tau(m.stats["lang_score"][is_lang])
    out = {LID.key: {"rule": LID, "value": round(tau, 3), "percentile": None, "reference_docs": int(is_lang.sum()),
                     "how": "max(0.3, min(0.9, median - sigma)) of the LID scores"}}
    if crawl_lid is not None:
        crawl_is_lang = np.array([x == m.lang for x in crawl_lid[0]], bool)
        if not crawl_is_lang.any():
            raise CalibrationError(f"crawl sample: no document is labelled {m.lang} by langid: LID tau cannot be computed from it")
        tau = lid_tau(crawl_lid[1][crawl_is_lang])
        out[LID.key] = {"rule": LID, "value": round(tau, 3), "percentile": None,
                        "reference_docs": int(crawl_is_lang.sum()),
                        "how": "max(0.3, min(0.9, median - sigma)) of the LID scores of the crawl sample (FineWeb-2)"}
    if lid_tau_given is not None:
        tau, how = lid_tau_given
        out[LID.key] = {"rule": LID, "value": round(float(tau), 3), "percentile": None, "reference_docs": 0,
                        "how": how, "given": True}
    fixed = np.ones(m.docs, bool)            # the length rules, applied as configured
    tunable = []
    for rule in RULES:
        thr = threshold_of(rule, heur, langid, m.lang)
        if rule.stat == "n_words":
            fixed &= passes(rule, m.stats.get(rule.stat, np.zeros(m.docs)), thr, heur, m.lang)
        elif rule.bounds is not None and thr is not None and rule.stat in m.stats:
            tunable.append(rule)
    base = fixed & lid_passes(m, langid, tau)
    n_base = int(base.sum())
    if n_base == 0:
        raise CalibrationError(f"reference for {m.lang}: no document passes langid and the length rules "
                               f"(gopher_quality.min_doc_words / max_doc_words): nothing to calibrate on")

    def at(tail: float) -> dict[Rule, float]:
        chosen = {}
        for rule in tunable:
            v = m.stats[rule.stat][base]
            v = v[~np.isnan(v)]
            q = np.quantile(v, tail if rule.kind == "min" else 1 - tail, method="lower") if len(v) else rule.bounds[0]
            lo, hi = rule.bounds
            q = min(max(float(q), lo), hi)
            chosen[rule] = float(math.floor(q) if rule.kind == "min" else math.ceil(q)) if rule.integer else round(q, 4)
        return chosen

    def kept(chosen: dict[Rule, float]) -> float:
        ok = base.copy()
        for rule, thr in chosen.items():
            ok &= passes(rule, m.stats[rule.stat], thr, heur, m.lang)
        return ok.sum() / n_base

    lo, hi = 0.0, 1.0 - keep           # tails: lo always keeps >= keep (the loosest thresholds)
    for _ in range(30):
        mid = (lo + hi) / 2
        if kept(at(mid)) >= keep:
            lo = mid
        else:
            hi = mid
    chosen = at(lo)
    pct = 100 * lo
    for rule, value in chosen.items():
        p = pct if rule.kind == "min" else 100 - pct
        clipped = " (clipped to the plausible range)" if value in rule.bounds else ""
        out[rule.key] = {"rule": rule, "value": value, "reference_docs": n_base, "percentile": round(p, 2),
                         "how": f"{rule.stat} percentile {p:.1f}{clipped}"}
    return out


def apply(raw: dict, lang: str, calibrated: dict[str, dict]) -> tuple[dict, dict[tuple, str]]:
    """The config dict with `lang`'s calibrated thresholds written in (per-language form) and
    `heuristics.compat: quipu`; and a comment for every written value, by its key path."""
    import copy
    raw = copy.deepcopy(raw)
    comments: dict[tuple, str] = {}
    heur = raw.setdefault("heuristics", {}) or {}
    raw["heuristics"] = heur
    if heur.get("compat") != "quipu":
        heur["compat"] = "quipu"
        comments[("heuristics", "compat")] = "the statistics quipu calibrate measured (quipu.tasks.language_rules)"
    langid_block = raw.get("langid") or {}
    raw["langid"] = langid_block
    kept = list(langid_block.get("languages") or LangIdConfig().languages)
    if lang not in kept:
        langid_block["languages"] = kept + [lang]
        comments[("langid", "languages")] = f"{lang} added by quipu calibrate"
    defaults = {"langid": LangIdConfig(), "heuristics": HeuristicsConfig()}
    for item in calibrated.values():
        rule: Rule = item["rule"]
        block = raw.setdefault("langid", {}) if rule.filter == "langid" else heur.setdefault(rule.filter, {})
        if block is None:
            block = raw["langid"] = {} if rule.filter == "langid" else heur.setdefault(rule.filter, {})
        current = block.get(rule.param)
        if current is None:
            model = defaults["langid"] if rule.filter == "langid" else getattr(defaults["heuristics"], rule.filter)
            current = getattr(model, rule.param)
        per_lang = dict(current) if isinstance(current, dict) else {"default": current}
        value = item["value"]
        if rule.n is not None:
            table = per_lang.get(lang, per_lang["default"])
            table = [[int(n), float(f)] for n, f in table]
            table = [[n, value if n == rule.n else f] for n, f in table]
            value = table
        per_lang[lang] = int(value) if rule.integer else value
        block[rule.param] = per_lang
        path = (("langid",) if rule.filter == "langid" else ("heuristics", rule.filter)) + (rule.param, lang)
        note = (item["how"] if item.get("given") else f"{item['how']}, {item['reference_docs']} {lang} reference docs"
                if rule.n is None else None)
        if rule.n is not None:
            notes = comments.get(path, "")
            note = (notes + "; " if notes else "") + f"n={rule.n}: {item['how']}"
            if not notes:
                note += f" ({item['reference_docs']} {lang} reference docs)"
        comments[path] = note
    return raw, comments


# ---- the report card ---------------------------------------------------------------------------

def evaluate(ref: Measured, junk: Measured | None, heur: HeuristicsConfig, langid: LangIdConfig) -> dict:
    """Per rule: threshold, histograms of reference and junk, share of each removed by the rule
    alone; and by all rules together (langid included)."""
    lang = ref.lang
    tau = threshold_of(LID, heur, langid, lang)
    rows = []
    together = {"reference": lid_passes(ref, langid, tau)}
    if junk is not None:
        together["junk"] = lid_passes(junk, langid, tau)
    rows.append(_row(LID, tau, ref, junk, together["reference"], together.get("junk")))
    for rule in RULES:
        thr = threshold_of(rule, heur, langid, lang)
        if rule.stat not in ref.stats:
            continue
        r_ok = passes(rule, ref.stats[rule.stat], thr, heur, lang)
        j_ok = passes(rule, junk.stats[rule.stat], thr, heur, lang) if junk is not None and rule.stat in junk.stats else None
        together["reference"] &= r_ok
        if j_ok is not None:
            together["junk"] &= j_ok
        rows.append(_row(rule, thr, ref, junk, r_ok, j_ok))
    out = {"lang": lang, "reference_docs": ref.docs, "junk_docs": junk.docs if junk else 0, "rules": rows,
           "reference_removed": round(1 - float(together["reference"].mean()), 4)}
    if junk is not None:
        out["junk_removed"] = round(1 - float(together["junk"].mean()), 4) if junk.docs else None
    return out


def _hist(values: np.ndarray, lo: float, hi: float) -> list[int]:
    v = values[~np.isnan(values)]
    return np.histogram(np.clip(v, lo, hi), bins=HIST_BINS, range=(lo, hi))[0].tolist() if len(v) else [0] * HIST_BINS


def _row(rule: Rule, thr, ref: Measured, junk: Measured | None, r_ok: np.ndarray, j_ok: np.ndarray | None) -> dict:
    rv = ref.stats[rule.stat]
    jv = junk.stats.get(rule.stat) if junk is not None else None
    both = np.concatenate([x[~np.isnan(x)] for x in ([rv] + ([jv] if jv is not None else []))])
    lo, hi = (float(np.quantile(both, 0.005)), float(np.quantile(both, 0.995))) if len(both) else (0.0, 1.0)
    if thr is not None:
        lo, hi = min(lo, thr), max(hi, thr)
    hi = hi if hi > lo else lo + 1.0
    row = {"rule": rule.key, "statistic": rule.stat, "kind": rule.kind, "threshold": thr,
           "calibrated": rule.bounds is not None, "range": [lo, hi],
           "clipped": bool(rule.bounds is not None and rule is not LID and thr is not None and thr in rule.bounds),
           "reference_hist": _hist(rv, lo, hi), "reference_removed": round(1 - float(r_ok.mean()), 4) if len(r_ok) else 0.0}
    if jv is not None and j_ok is not None:
        row["junk_hist"] = _hist(jv, lo, hi)
        row["junk_removed"] = round(1 - float(j_ok.mean()), 4) if len(j_ok) else 0.0
    return row


def crawl_hist(row: dict, crawl_lid: tuple[list[str], np.ndarray], lang: str) -> list[int]:
    """The crawl sample's LID scores (documents labelled `lang`) on the LID row's histogram bins."""
    scores = np.array([s for label, s in zip(*crawl_lid) if label == lang], float)
    return _hist(scores, *row["range"])


# ---- old and new side by side --------------------------------------------------------------------

def side_by_side(calibrated: dict[str, dict], heur: HeuristicsConfig, langid: LangIdConfig, lang: str) -> list[dict]:
    """Per calibrated threshold: the value the config holds now (`old`), the new one, whether the new
    one sits at an end of the rule's plausible range (`clipped`: the reference alone would have gone
    further, so the range, not the reference, set it) and how it was derived."""
    rows = []
    for key, item in calibrated.items():
        rule: Rule = item["rule"]
        new = item["value"]
        clipped = bool(rule.bounds is not None and rule.filter != "langid" and new in rule.bounds)
        rows.append({"rule": key, "old": threshold_of(rule, heur, langid, lang), "new": new,
                     "clipped": clipped, "how": item["how"]})
    return rows


def moved(rows: list[dict]) -> dict:
    """What the reference changed: thresholds whose value differs from the config's, and thresholds the
    reference set inside their plausible range (the rest sit at a clip bound)."""
    heuristic = [r for r in rows if not r["rule"].startswith("langid.")]
    changed = [r["rule"] for r in rows if r["old"] is None or abs(float(r["new"]) - float(r["old"])) > 1e-9]
    return {"changed": changed, "inside_range": [r["rule"] for r in heuristic if not r["clipped"]],
            "clipped": [r["rule"] for r in heuristic if r["clipped"]]}


def score_row(rule: str, statistic: str, threshold: float, reference: list[float], junk: list[float] | None = None,
              crawl: list[float] | None = None) -> dict:
    """A report row for a judge's score (documents below `threshold` removed): histograms of the
    reference, junk and crawl scores on shared bins, and the share of each the cut-off removes."""
    parts = {"reference": np.array(reference, float), "junk": np.array(junk or [], float), "crawl": np.array(crawl or [], float)}
    both = np.concatenate(list(parts.values()))
    lo, hi = (float(np.quantile(both, 0.005)), float(np.quantile(both, 0.995))) if len(both) else (0.0, 1.0)
    lo, hi = min(lo, threshold), max(hi, threshold)
    hi = hi if hi > lo else lo + 1.0
    row = {"rule": rule, "statistic": statistic, "kind": "min", "threshold": threshold, "calibrated": True,
           "clipped": False, "range": [lo, hi]}
    for name, values in parts.items():
        if name == "reference" or len(values):
            row[f"{name}_hist"] = _hist(values, lo, hi)
            row[f"{name}_removed"] = round(float((values < threshold).mean()), 4) if len(values) else 0.0
    return row

"""Dataset versions, mixing inside datasets (`where`, dup_count upsampling), curriculum by source,
the blend table, continual-training configs, url columns and per-domain statistics.

Blends are planned without training (plan_data on tokenized synthetic shards): fast."""
from __future__ import annotations

import json
import random
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quipu.catalog import registry
from quipu.catalog.files import sha256_file
from quipu.catalog.versions import format_datasets, parse_versions
from quipu.flows.config import ConfigError, load_config
from quipu.trainer.data import BlendError, format_blend_report, blend_report, resolve_phase_starts, source_passes
from quipu.trainer.prepare import prepare, resolve_sources
from quipu.trainer.train import TrainConfig, load_sources, plan_data

WORDS = {
    "es": "el gato perro río casa verde pequeño corre ve bajo sobre cerca viejo nuevo pan agua luz ciudad".split(),
    "pt": "o gato cão rio casa verde pequeno corre vê sob sobre perto velho novo pão água luz cidade".split(),
}


def docs(n: int, seed: int, lang: str, long_every: int = 0) -> list[dict]:
    """Synthetic documents; every `long_every`-th is five times longer (so token shares differ from doc shares)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        k = rng.randint(2, 6) * (5 if long_every and i % long_every == 0 else 1)
        text = " ".join(" ".join(rng.choice(WORDS[lang]) for _ in range(rng.randint(3, 8))).capitalize() + "." for _ in range(k))
        out.append({"id": f"{lang}-{seed}-{i}", "text": text, "source": "synthetic", "lang": lang,
                    "url": f"https://www.site{i % 3}.example.{'br' if lang == 'pt' else 'es'}/{i}",
                    # Portuguese easier on average: a curriculum sorted across sources would drift to Spanish
                    "ppl_wayra": float(rng.uniform(5, 250) if lang == "pt" else rng.uniform(100, 500)),
                    "quality_score": round(rng.random(), 3),
                    "dup_count": 1 + i % 5})
    return out


def register_version(base: Path, name: str, rows: list[dict], parts: int = 2) -> None:
    d = base / f"{name}-{uuid.uuid4().hex[:6]}" / "curated"
    d.mkdir(parents=True)
    shards = []
    for i in range(parts):
        p = d / f"part-{i:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows[i::parts]), p)
        shards.append({"path": str(p), "rows": pq.ParquetFile(p).metadata.num_rows, "bytes": p.stat().st_size,
                       "sha256": sha256_file(p)})
    registry.register_dataset(name, "curated", str(d), None, shards)


def config(run: Path, sources: list[dict], **over) -> TrainConfig:
    cfg = {"output": str(run), "tokenizer": {"vocab_size": 400, "train_docs": 3000},
           "data": {"seq_len": 64, "eval_docs_per_source": 4, "phases": [{"name": "general", "sources": sources}]},
           "model": {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "max_seq_len": 64},
           "schedule": {"warmup_steps": 2},
           "train": {"max_steps": 100, "batch_size": 8, "micro_batch": 8, "threads": 1}}
    for k, v in over.items():
        node = cfg
        *path, last = k.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = v
    return load_config(TrainConfig, data=cfg)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """One curated dataset of Portuguese and Spanish documents in three versions, tokenized once."""
    base = tmp_path_factory.mktemp("blend")
    name = "blend-test-mix"      # fixed: the layout's random orders are seeded by the source names
    register_version(base, name, docs(200, 1, "pt", long_every=4) + docs(120, 2, "es"))
    register_version(base, name, docs(60, 3, "pt") + docs(60, 4, "es", long_every=3))
    register_version(base, name, docs(40, 5, "pt") + docs(40, 6, "es"))
    run = base / "run"
    cfg = config(run, [{"dataset": name, "weight": 1.0}])
    prepare(cfg.tokenizer, cfg.data, run)
    return {"name": name, "base": base, "run": run, "prepared": json.loads((run / "prepared.json").read_text())}


# ---- versions ------------------------------------------------------------------------------------

def test_versions_are_selected_and_listed(mixed, tmp_path):
    name = mixed["name"]
    versions = registry.dataset_versions(name)
    assert [v["version"] for v in versions] == [1, 2, 3]
    assert registry.get_dataset(name)["version"] == 3          # the newest row is still there by name
    shards = {v["version"]: [s["path"] for s in v["shards"]] for v in versions}

    def paths(spec):
        cfg = config(tmp_path, [{"dataset": name, "weight": 1.0, **({"versions": spec} if spec is not None else {})}])
        return [s["path"] for s in next(iter(resolve_sources(cfg.data).values()))]
    assert paths(None) == shards[1] + shards[2] + shards[3]      # the union of every increment
    assert paths(2) == shards[2]
    assert paths("2..") == shards[2] + shards[3] and paths("..2") == shards[1] + shards[2]
    with pytest.raises(BlendError, match=r"data.phases\[0\].sources\[0\].versions: dataset .* has no version 7 \(it has \[1, 2, 3\]\)"):
        paths(7)
    with pytest.raises(ConfigError, match=r"versions.*not a version"):
        config(tmp_path, [{"dataset": name, "weight": 1.0, "versions": "two"}])
    assert parse_versions("3..5") == (3, 5) and parse_versions(None) == (None, None)
    # prepared.json names every curated shard read, with its version; catalog ls shows each version
    listed = {(s["version"], s["path"]) for s in mixed["prepared"]["curated_shards"]}
    assert listed == {(v, p) for v, ps in shards.items() for p in ps}
    from quipu.catalog.versions import version_lineage
    assert [(v["version"], v["shards"]) for v in version_lineage(name)] == [(v, shards[v]) for v in (1, 2, 3)]
    table = format_datasets(kind="curated")
    assert f"  {name}" in table and "versions=3" in table
    assert all(f"v{v} " in table for v in (1, 2, 3))


def test_new_version_tokenizes_only_its_own_shards(mixed, tmp_path):
    name = f"grow-{uuid.uuid4().hex[:6]}"
    register_version(tmp_path, name, docs(30, 7, "pt") + docs(30, 8, "es"))
    run = tmp_path / "run"
    cfg = config(run, [{"dataset": name, "weight": 1.0}])
    first = prepare(cfg.tokenizer, cfg.data, run)
    assert not any(s["reused"] for s in first["curated_shards"])
    register_version(tmp_path, name, docs(20, 9, "pt"))
    again = prepare(cfg.tokenizer, cfg.data, run, resume=True)   # the run's tokenizer, every version
    assert [s["version"] for s in again["curated_shards"]] == [1, 1, 2, 2]
    assert [s["reused"] for s in again["curated_shards"]] == [True, True, False, False]
    pinned = prepare(cfg.tokenizer, cfg.data, run, pinned={name: [1]}, resume=True)   # a plain resume keeps its versions
    assert {s["version"] for s in pinned["curated_shards"]} == {1}


# ---- mixing inside a dataset ---------------------------------------------------------------------

def test_where_pt_es_fifty_fifty_constant_along_a_curriculum(mixed, tmp_path):
    name = mixed["name"]
    cfg = config(tmp_path, [{"dataset": name, "where": {"lang": "pt"}, "weight": 0.5},
                            {"dataset": name, "where": {"lang": "es"}, "weight": 0.5}], **{"train.max_steps": 400})
    cfg.data.phases[0].order = "ppl_wayra"
    sources = load_sources(cfg, mixed["prepared"])
    pt, es = sources
    # the filter: every pt document and no es one (tokens differ from documents: pt has long ones)
    langs = pq.read_table([s["path"] for s in mixed["prepared"]["curated_shards"]][0], columns=["lang"])
    assert pt.name == f"{name}[lang=pt]" and len(pt.train_docs) + len(pt.eval_docs) == 300
    assert len(es.train_docs) + len(es.eval_docs) == 220 and langs.num_rows > 0
    (phase,), batcher = plan_data(cfg, sources)
    tokens_per_step = cfg.train.batch_size * cfg.data.seq_len
    # 50 steps = 25,600 tokens; a source's share moves by one document at a time (up to ~400 tokens here)
    window = 50
    shares = []
    for a in range(0, cfg.train.max_steps, window):
        t = phase.source_tokens(a * tokens_per_step, (a + window) * tokens_per_step + 1)
        shares.append(t[0] / t.sum())
    shares = np.array(shares)
    total = phase.source_tokens(0, cfg.train.max_steps * tokens_per_step + 1)
    assert abs(total[0] / total.sum() - 0.5) < 0.01
    print(f"pt token share: overall {total[0] / total.sum():.4f}; per {window}-step window {np.round(shares, 4).tolist()}")
    assert np.all(np.abs(shares - 0.5) < 0.01), shares         # constant along the run
    # the same documents sorted easy -> hard across sources (the old global curriculum) drift
    lens = np.diff(np.concatenate([[0], phase.ends]))
    ppl = np.array([sources[s].train.doc_ppl[i] for s, i in zip(phase.docs_source, phase.docs_index)])
    order = np.argsort(ppl, kind="stable")
    ends, is_pt = np.cumsum(lens[order]), phase.docs_source[order] == 0
    first_window = ends <= window * tokens_per_step
    assert (lens[order][first_window & is_pt].sum() / lens[order][first_window].sum()) > 0.6
    # the curriculum: within each source, each pass goes easy -> hard
    for si, src in enumerate(sources):
        ppl = src.train.doc_ppl[phase.docs_index[phase.docs_source == si]]
        drops = np.flatnonzero(np.diff(ppl) < 0)
        assert len(drops) <= int(phase.report[si]["repetitions"]) + 1   # one restart per epoch
    # repeats of a document are a whole pass apart
    es_seq = phase.docs_index[phase.docs_source == 1]
    first_pos: dict[int, int] = {}
    gaps = []
    for pos, d in enumerate(es_seq.tolist()):
        if d in first_pos:
            gaps.append(pos - first_pos[d])
        first_pos[d] = pos
    n = len(es.train_docs)      # whole passes: exactly a pass apart; the last (cut) pass, a sample: still far
    assert gaps and np.median(gaps) == n and min(gaps) > n // 3, (n, sorted(gaps)[:5])
    table = format_blend_report(blend_report([phase]))
    assert f"{name}[lang=pt]" in table and "0.500" in table


def test_where_operators_and_errors(mixed, tmp_path):
    name = mixed["name"]
    cfg = config(tmp_path, [{"dataset": name, "where": {"quality_score": ">= 0.8", "tld": ["br"]}, "weight": 1.0}])
    (src,) = load_sources(cfg, mixed["prepared"])
    picked = np.concatenate([src.train_docs, src.eval_docs])
    from quipu.trainer.prepare import document_columns
    cols = document_columns(mixed["prepared"]["sources"][name], ["quality_score", "lang", "tld"]).to_pydict()
    expect = [i for i, (q, lang) in enumerate(zip(cols["quality_score"], cols["lang"])) if q >= 0.8 and lang == "pt"]
    assert sorted(picked.tolist()) == expect and expect
    assert set(cols["tld"]) == {"br", "es"}        # derived from the url: these shards predate the column
    with pytest.raises(BlendError, match=r"data.phases\[0\].sources\[0\].where.colour: no column 'colour'"):
        resolve_sources(config(tmp_path, [{"dataset": name, "where": {"colour": "red"}, "weight": 1.0}]).data)
    with pytest.raises(ConfigError, match=r"where.quality_score: '>= high': >= needs a number"):
        config(tmp_path, [{"dataset": name, "where": {"quality_score": ">= high"}, "weight": 1.0}])
    with pytest.raises(ConfigError, match="listed twice"):
        config(tmp_path, [{"dataset": name, "where": {"lang": "pt"}, "weight": 0.5},
                          {"dataset": name, "where": {"lang": "pt"}, "weight": 0.5}])


def test_blend_table_warns_above_four_epochs(mixed, tmp_path):
    name = mixed["name"]
    cfg = config(tmp_path, [{"dataset": name, "versions": 3, "where": {"lang": "es"}, "weight": 0.5},
                            {"dataset": name, "versions": "1..2", "weight": 0.5}], **{"train.max_steps": 200})
    prepared = prepare(cfg.tokenizer, cfg.data, mixed["run"], resume=True)   # the version selections' tokens: all cached
    assert all(s["reused"] for s in prepared["curated_shards"])
    (phase,), _ = plan_data(cfg, load_sources(cfg, prepared))
    table = format_blend_report(blend_report([phase]))
    small, big = phase.report
    assert small["repetitions"] > 4 > big["repetitions"]
    assert "WARNING" in table and f"source '{name}@3[lang=es]'" in table and f"'{name}@1..2'" not in table.split("WARNING")[1]
    for col in ("avail tok", "weight", "share", "epochs"):
        assert col in table.splitlines()[0]


def test_a_language_missing_from_the_data_is_redistributed_or_named(mixed, tmp_path):
    # the shipped blend on a version without English: es and pt share English's weight, and say so
    name = mixed["name"]
    blend = [{"dataset": name, "where": {"lang": "es"}, "weight": 0.4, "when_empty": "redistribute"},
             {"dataset": name, "where": {"lang": "pt"}, "weight": 0.3, "when_empty": "redistribute"},
             {"dataset": name, "where": {"lang": "en"}, "weight": 0.3, "when_empty": "redistribute"}]
    cfg = config(tmp_path, blend)
    sources = load_sources(cfg, mixed["prepared"])
    assert [s.name for s in sources] == [f"{name}[lang=es]", f"{name}[lang=pt]"]
    (phase,), _ = plan_data(cfg, sources)
    es, pt, en = phase.report
    assert es["share"] == pytest.approx(0.4 / 0.7, abs=1e-6) and pt["share"] == pytest.approx(0.3 / 0.7, abs=1e-6)
    assert es["configured_weight"] == 0.4 and en["absent"] and en["share"] == 0 and en["configured_weight"] == 0.3
    table = format_blend_report(blend_report([phase]))
    assert f"NOTE: phase 'general', source '{name}[lang=en]': fewer than 2 documents in this data, trained without it; " \
           "its weight 0.3 goes to the phase's other sources in proportion (when_empty: redistribute)" in table
    # as shipped before: a source that must be there fails naming the fix; a phase left empty fails too
    strict = config(tmp_path, [{**src, "when_empty": "fail"} for src in blend])
    with pytest.raises(BlendError, match=r"\[lang=en\]'. has 0 document\(s\); need at least 2.*when_empty: redistribute"):
        load_sources(strict, mixed["prepared"])
    nothing = config(tmp_path, [{"dataset": name, "where": {"lang": "en"}, "weight": 1.0, "when_empty": "redistribute"}])
    with pytest.raises(BlendError, match=r"data.phases\[0\] \('general'\): none of its sources .* has documents"):
        plan_data(nothing, load_sources(nothing, mixed["prepared"]))


def test_a_run_far_above_its_data_trains_fewer_steps_and_says_so(mixed, tmp_path):
    from quipu.flows.train import fit_steps_to_data
    name = mixed["name"]
    cfg = config(tmp_path, [{"dataset": name, "where": {"lang": "es"}, "weight": 1.0}],
                 **{"train.max_steps": 400, "data.max_epochs": 2, "schedule.kind": "cosine", "schedule.warmup_steps": 50})
    sources = load_sources(cfg, mixed["prepared"])
    distinct = sources[0].train_tokens
    fitted, note = fit_steps_to_data(cfg, sources, 0)
    steps = fitted.train.max_steps
    assert steps == int(400 * 2 / (400 * 8 * 64 / distinct)) and 0 < steps < 400 and fitted.schedule.warmup_steps < steps
    assert note.startswith(f"data.max_epochs 2: 400 steps would repeat source '{name}[lang=es]' ({distinct:,} distinct "
                           f"tokens)") and f"training {steps} step(s), to step {steps}, instead" in note
    (phase,), _ = plan_data(fitted, sources)
    assert 1.5 < phase.report[0]["repetitions"] <= 2
    # a continuation counts from its checkpoint; within the limit, or with none, nothing changes
    again, note = fit_steps_to_data(cfg.model_copy(update={"train": cfg.train.model_copy(update={"max_steps": 110})}),
                                    sources, 100)
    assert note is None and again.train.max_steps == 110
    assert fit_steps_to_data(config(tmp_path, cfg.data.model_dump()["phases"][0]["sources"],
                                    **{"train.max_steps": 400}), sources, 0)[1] is None


def test_a_multi_phase_run_far_above_its_data_shrinks_every_phase_alike(mixed, tmp_path):
    from quipu.flows.train import fit_steps_to_data
    name = mixed["name"]
    es = {"dataset": name, "where": {"lang": "es"}}
    cfg = config(tmp_path, [{**es, "weight": 1.0}], **{"train.max_steps": 400, "data.max_epochs": 2,
                                                      "schedule.kind": "cosine", "schedule.warmup_steps": 50})
    phases = [{"name": "general", "sources": [{**es, "weight": 1.0}]},
              {"name": "target", "start_lr_fraction": 0.5,   # es again, beside pt: its repetitions add up
               "sources": [{**es, "weight": 0.5}, {"dataset": name, "where": {"lang": "pt"}, "weight": 0.5}]}]
    cfg = cfg.model_validate(cfg.model_dump(mode="json") | {"data": cfg.data.model_dump(mode="json") | {"phases": phases}})
    sources = load_sources(cfg, mixed["prepared"])
    start = resolve_phase_starts(cfg.data, 400, lambda s: cfg.schedule.fraction(s, 400))
    fitted, note = fit_steps_to_data(cfg, sources, 0)
    steps = fitted.train.max_steps
    planned = plan_data(fitted, sources)[0]
    new_start = resolve_phase_starts(fitted.data, steps, lambda s: fitted.schedule.fraction(s, steps))
    es_reps = sum(r["repetitions"] for p in planned for r in p.report if r["source"] == f"{name}[lang=es]")
    assert 0 < steps < 400 and 1.5 < es_reps <= 2 and fitted.schedule.warmup_steps < steps
    # both phases shrink by the same factor: the target phase still starts at the same share of the run
    assert abs(new_start[1] / steps - start[1] / 400) < 0.02 and fitted.data.phases[1].start_step == new_start[1]
    assert f"training {steps} step(s), to step {steps}, instead" in note
    assert note.endswith(f"; phases start at general step 0, target step {new_start[1]}")
    # a continuation from the second phase's start shrinks only that phase; the first keeps its start
    again, note = fit_steps_to_data(cfg, sources, start[1])
    assert again.data.phases[1].start_step == start[1] < again.train.max_steps < 400
    assert "instead" in note and "phases start at" not in note


def test_dup_count_upsampling_with_cap(mixed, tmp_path):
    name = mixed["name"]
    cfg = config(tmp_path, [{"dataset": name, "dup_upsample_cap": 3, "weight": 1.0}])
    (src,) = load_sources(cfg, mixed["prepared"])
    from quipu.trainer.prepare import document_columns
    dup = np.array(document_columns(mixed["prepared"]["sources"][name], ["dup_count"]).column(0).to_pylist())
    assert np.array_equal(src.copies, np.minimum(dup[src.train_docs], 3))
    one_epoch = source_passes(src, src.epoch_tokens, "shuffle", 0, 0)
    counts = np.bincount(one_epoch, minlength=src.train.num_docs)[src.train_docs]
    assert np.array_equal(counts, src.copies)                     # each document min(dup_count, 3) times
    assert src.epoch_tokens == int((src.train.doc_len[src.train_docs] * src.copies).sum())
    # a dataset without the column: the error names the key
    other = f"nodup-{uuid.uuid4().hex[:6]}"
    register_version(tmp_path, other, [{k: v for k, v in d.items() if k != "dup_count"} for d in docs(10, 1, "pt")])
    with pytest.raises(BlendError, match=r"data.phases\[0\].sources\[0\].dup_upsample_cap: .* has no dup_count column"):
        resolve_sources(config(tmp_path, [{"dataset": other, "dup_upsample_cap": 2, "weight": 1.0}]).data)


# FineWeb-2's published schedule (huggingface/fineweb-2 README, "Deduplication"), written out by hand
# per cluster size: no duplicates 1 time, N = 2 or 3 N times, N = 4 3 times, 5 <= N < 100 5 times,
# 100 <= N < 1000 8 times, N >= 1000 1 time.
FINEWEB2_TIMES = {1: 1, 2: 2, 3: 3, 4: 3, 5: 5, 37: 5, 99: 5, 100: 8, 250: 8, 999: 8, 1000: 1, 4321: 1}


def stream_appearances(phase, src, tokens: int) -> dict[int, float]:
    """Per document of `src`: how many times its tokens occur in the first `tokens` of the phase's
    token stream (tokens in the stream / the document's length)."""
    begins = np.concatenate([[0], phase.ends[:-1]])
    overlap = np.clip(np.minimum(phase.ends, tokens) - begins, 0, None)
    seen = np.bincount(phase.docs_index, weights=overlap, minlength=src.train.num_docs)
    return {int(d): seen[d] / src.train.doc_len[d] for d in src.train_docs}


def test_rehydration_fineweb2_schedule_in_the_token_stream(tmp_path):
    name = f"rehydrate-{uuid.uuid4().hex[:6]}"
    rows = docs(4 * len(FINEWEB2_TIMES), 11, "pt")
    for i, row in enumerate(rows):
        row["dup_count"] = list(FINEWEB2_TIMES)[i % len(FINEWEB2_TIMES)]
    register_version(tmp_path, name, rows)
    run = tmp_path / "run"
    cfg = config(run, [{"dataset": name, "dup_upsample_cap": "fineweb2", "weight": 1.0}],
                 **{"data.eval_docs_per_source": 2})
    prepared = prepare(cfg.tokenizer, cfg.data, run)
    (src,) = load_sources(cfg, prepared)
    (phase,), _ = plan_data(cfg, [src])
    from quipu.trainer.prepare import document_columns
    dup = document_columns(prepared["sources"][name], ["dup_count"]).column(0).to_pylist()
    epoch = int(sum(FINEWEB2_TIMES[dup[d]] * src.train.doc_len[d] for d in src.train_docs))
    assert phase.num_tokens >= 2 * epoch
    for epochs in (1, 2):                    # every epoch repeats each document as often as its cluster size says
        seen = stream_appearances(phase, src, epochs * epoch)
        by_size = {}
        for d, times in seen.items():
            by_size.setdefault(dup[d], set()).add(times)
        assert by_size == {size: {epochs * times} for size, times in FINEWEB2_TIMES.items()}, epochs
    # the same schedule as a table (keys: a size, a range, an open range) gives the same stream
    table = {1: 1, 2: 2, "3-4": 3, "5-99": 5, "100-999": 8, "1000+": 1}
    cfg2 = config(run, [{"dataset": name, "dup_upsample_cap": table, "weight": 1.0}], **{"data.eval_docs_per_source": 2})
    (phase2,), _ = plan_data(cfg2, load_sources(cfg2, prepared))
    assert np.array_equal(phase2.docs_index, phase.docs_index)
    for bad, why in (({1: 1, "3+": 2}, "cluster size 2 has no entry"), ({1: 1, "2-5": 2, "4+": 1}, "covered twice"),
                     ({1: 1, 2: 2}, r"from 3 on have no entry; end with an open range \(3\+\)"),
                     ({1: 1, "2+": 0}, "0 copies"), ("fineweb-2", "no such preset"), (0, "cap must be >= 1")):
        with pytest.raises(ConfigError, match=r"sources.0.dup_upsample_cap.*" + why):
            config(run, [{"dataset": name, "dup_upsample_cap": bad, "weight": 1.0}])


# ---- continual training ----------------------------------------------------------------------------

def test_continue_with_appends_or_starts_a_phase(tmp_path):
    from quipu.trainer.continual import NewVersion, continue_with
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    cfg = config(run, [{"dataset": "web", "weight": 0.6}, {"dataset": "books", "weight": 0.4}],
                 **{"data.continual": {"policy": "append", "steps": 50}, "train.max_steps": 100})
    assert continue_with(cfg, run, NewVersion(dataset="web", version=2), None) == (cfg, False)   # no checkpoint: start
    (run / "checkpoints" / "step-0000100.pt").write_bytes(b"")
    out, resume = continue_with(cfg, run, NewVersion(dataset="web", version=2), {"web": [1], "books": [1]})
    assert resume and out.train.max_steps == 150
    assert [(p.name, p.start_step) for p in out.data.phases] == [("general", None), ("general+web-v2", 100)]
    assert [s.key for s in out.data.phases[1].sources] == ["web", "books"]
    skipped, why = continue_with(cfg, run, NewVersion(dataset="code", version=1), None)
    assert skipped is None and "not in this run's blend" in why
    skipped, why = continue_with(cfg, run, NewVersion(dataset="web", version=1), {"web": [1]})
    assert skipped is None and "already" in why
    cfg2 = cfg.model_copy(update={"data": cfg.data.model_copy(update={"continual": cfg.data.continual.model_copy(
        update={"policy": "new_phase", "new_version_weight": 0.5})})})
    out, _ = continue_with(cfg2, run, NewVersion(dataset="web", version=2), {"web": [1]})
    assert [(s.key, s.weight) for s in out.data.phases[1].sources] == [("web", 0.3), ("books", 0.2), ("web-v2", 0.5)]
    assert out.data.phases[1].sources[2].versions == 2


# ---- url columns and per-domain statistics ---------------------------------------------------------

def test_curated_rows_get_domain_and_tld(tmp_path):
    from quipu.tasks.output import OutputConfig, write_curated
    from quipu.tasks.stage import Shard
    p = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c", "d"], "text": ["x", "y", "z", "w"], "source": ["s"] * 4,
                             "url": ["https://news.bbc.co.uk/a", "http://www.folha.uol.com.br/b", None, "http://10.0.0.1/x"]}), p)
    (part,) = write_curated([Shard(name="in", path=str(p), sha256=sha256_file(p), rows=4, bytes=p.stat().st_size)],
                            tmp_path / "curated", OutputConfig())
    t = pq.read_table(part.path).to_pydict()
    assert t["domain"] == ["bbc.co.uk", "uol.com.br", None, "10.0.0.1"]
    assert t["tld"] == ["uk", "br", None, None]


def test_stage_report_has_top_domains_kept_and_removed(tmp_path):
    from quipu.tasks.pipeline import run_local
    from quipu.tasks.stage import Shard
    from quipu.tasks.urls import UrlsConfig
    block = tmp_path / "block.txt"
    block.write_text("spam.example.com\n")
    urls = [f"https://spam.example.com/{i}" for i in range(5)] + [f"https://a{i}.site.com.br/" for i in range(7)] + \
           ["https://www.bbc.co.uk/x", None]
    p = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [str(i) for i in range(len(urls))], "text": ["t"] * len(urls), "url": urls}), p)
    shard = Shard(name="in", path=str(p), sha256=sha256_file(p), rows=len(urls), bytes=p.stat().st_size)
    _, report = run_local("urls", UrlsConfig(blocklist=False, banned_words=False, block_lists=[str(block)]), [shard], tmp_path / "out")
    d = report["domains"]
    assert d["kept_docs"] == 9 and d["removed_docs"] == 5 and d["exact"]
    assert d["top_domains_kept"][0] == {"domain": "site.com.br", "kept": 7, "removed": 0, "removed_fraction": 0.0}
    assert d["top_domains_removed"] == [{"domain": "example.com", "kept": 0, "removed": 5, "removed_fraction": 1.0}]
    assert [t["tld"] for t in d["top_tlds_kept"]] == ["br", "uk"] and d["no_domain"] == {"kept": 1, "removed": 0}


def test_domain_counts_memory_is_bounded(tmp_path):
    from quipu.tasks.domain_stats import StageDomains
    p = tmp_path / "in.parquet"
    urls = [f"https://site{i}.com/" for i in range(1000)] + ["https://big.org/"] * 50
    pq.write_table(pa.table({"url": urls}), p)
    removed = tmp_path / "removed.parquet"
    pq.write_table(pa.table({"url": ["https://big.org/"] * 10}), removed)
    from types import SimpleNamespace
    counts = StageDomains([str(p)], max_tracked=100)
    r = counts.after([SimpleNamespace(removed=SimpleNamespace(path=str(removed)))])   # a stage's shard result
    assert len(counts.domains) <= 100 and not r["exact"] and r["max_error"] == 1
    assert r["kept_docs"] == 1040 and r["removed_docs"] == 10
    assert r["top_domains_kept"][0] == {"domain": "big.org", "kept": 40, "removed": 10, "removed_fraction": 0.2}


def test_version_tokens_are_counted_exactly_or_on_a_sample(tmp_path):
    """The tokens `quipu catalog ls` and the curate event report: SmolLM2's tokenizer, every document
    of a small version, an even sample (scaled by text bytes) of a large one."""
    from quipu.trainer.tokenize import count_tokens, reference_tokenizer
    rows = docs(60, 11, "es") + docs(60, 12, "pt", long_every=5)
    p = tmp_path / "v.parquet"
    pq.write_table(pa.Table.from_pylist(rows), p)
    exact = count_tokens([str(p)])
    tok = reference_tokenizer()
    assert exact["exact"] and exact["tokens"] == sum(len(tok.encode(r["text"], add_special_tokens=False).ids) for r in rows)
    sampled = count_tokens([str(p)], sample_docs=20)
    assert not sampled["exact"] and sampled["sampled_docs"] == 20 and sampled["documents"] == 120
    assert abs(sampled["tokens"] - exact["tokens"]) / exact["tokens"] < 0.1

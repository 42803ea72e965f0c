"""Synthetic corpora made from known text, below flows/: the demo corpus (corpus.py, from the text of
sources.py), junk and fluent junk (junk.py, fluent_junk.py), PDFs (pdfs.py) and the ablation's raw
mix (ablate_mix.py). `quipu demo`, `quipu ablate`, calibration's junk, the tests and the benchmarks
build their inputs here; nothing in it orchestrates (no Prefect)."""

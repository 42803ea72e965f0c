"""The scoring models the curation stages load, below tasks/: the fastText classifier family
(fasttext_classifier.py), HF sequence-classification judges (hf_classifier.py), KenLM (kenlm_model.py),
the Wayra perplexity student (wayra.py), the checks a model file passes before a native loader sees
it (model_files.py) and the one resolver of a model reference (resolver.py). It imports only
quipu.catalog and third-party packages; their training lives in quipu.trainer. docs/architecture.md
draws the layers."""

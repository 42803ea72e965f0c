"""Every model quipu trains or scores with: the Llama-style language model (tokenizer, token shards,
the training loop, checkpoints, export) and the scoring models the stages load (fastText classifiers,
the Wayra perplexity student and its SmolLM2 teacher, KenLM) with their training, file checks and one
resolver (models.py); text_source.py reads their training and evaluation text. docs/training.md,
docs/quality.md and docs/perplexity.md describe them."""

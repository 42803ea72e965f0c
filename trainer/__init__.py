"""Training: the Llama-style language model (llama.py: the model; tokenizer, token shards, the
training loop, checkpoints, export), the training of the scoring models the stages load (classifier_train.py,
wayra_train.py; the models themselves, their file checks and resolver are in quipu.scoring, below
tasks/), the SmolLM2 teacher and its labels (teacher.py), and text_source.py, which reads their
training and evaluation text with the curation's readers: training consumes curated data, so this
package sits above tasks/. docs/training.md, docs/quality.md and docs/perplexity.md describe them."""

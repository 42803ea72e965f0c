"""`quipu demo`'s steps: build the demo corpus (quipu.synthetic.corpus), curate it, train the quality
classifier and the perplexity student, train a small LM; run from the `quipu demo` command only."""

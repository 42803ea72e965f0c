"""Tokenize curated shards and train a Llama-style decoder on them (see README, "Training")."""

"""The demo: an embedded corpus built from installed packages, and `quipu demo`'s steps (not flows)."""

"""Prefect flows that compose the stage tasks, and the `quipu` command line."""

"""One module per curation stage: its config model, its per-batch logic, its Prefect task.

Tasks never import flows.
"""

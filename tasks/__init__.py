"""The curation stages: the stage contract (stage.py), its driver (driver.py), the pipeline
definition (pipeline.py) and one module per stage (its config model, its per-batch logic, its
stats). No Prefect here: the flows in quipu.flows run the driver's phases as Prefect tasks.

Tasks never import flows.
"""

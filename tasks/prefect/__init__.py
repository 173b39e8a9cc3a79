"""Prefect task wrappers of the stage functions in :mod:`tasks.stages` (a few lines each: retries,
caching, names, logging) and the live training progress shown in the Prefect UI."""

"""Recipes: the TOML schema written once (``schema``, built from ``fields``; ``messages`` turns its
errors into one-line RecipeErrors), reading, overrides and the JSON Schema (``load``), and the host
files a recipe names (``datafiles``: data generation with ``[data].make``, npz loading and checks)."""

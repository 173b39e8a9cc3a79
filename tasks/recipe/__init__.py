"""Recipes: the TOML schema (``schema``), parsing and overrides (``load``), and the host files a
recipe names (``datafiles``: data generation with ``[data].make``, npz loading and checks)."""

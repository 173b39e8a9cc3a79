"""Prefect flows of the ODL pipeline and the ``odl`` command line."""

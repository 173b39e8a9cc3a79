"""Pipeline stages as plain typed functions (export, artifacts, validate, deploy, train, retrieve,
evaluate, registry) and their thin Prefect task wrappers."""

"""A trivial flow for tests/e2e/test_postgres_stack.py (deployment pg/ping of tests/e2e/pg_prefect.yaml)."""

from prefect import flow


@flow(name="pg", log_prints=True)
def ping() -> int:
    print("pong")
    return 1

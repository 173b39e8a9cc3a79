"""Shared test configuration. Fixtures live in one plugin module per area so that areas can
use each other's fixtures (a prepared recipe, the board venv, a local or virtual board) without copies.

Tests mirror the source packages (``recipe/``, ``prepare/``, ``board/``, ``judge/``, ``prefect/``,
``flow/``, ``cli/``, ``agent/``); everything that needs root, a real sshd, a Prefect server or a
browser lives in ``e2e/`` and carries the ``e2e`` marker (applied here by folder).
"""

import logging
import sys
from pathlib import Path

import pytest

from tasks.recipe.host_runtime import why_no_ort_training

pytest_plugins = [
    "tests.fixtures_prepare",
    "tests.fixtures_agent",
    "tests.fixtures_board",
    "tests.fixtures_flow",
    "tests.fixtures_postgres",
    "tests.fixtures_store",
    "tests.fixtures_hosts",
    "tests.e2e.faultkit",
]

E2E = Path(__file__).parent / "e2e"
# the fixtures that prepare recipes for the ORT-training runtime (tests.fixtures_prepare pins it: the
# default is autograd): a test that uses one needs onnxruntime-training on the host
ORT_TRAINING_FIXTURES = {"digits_recipe", "prepared_digits", "prepared_embedded", "prepared_two_head",
                         "prepared_mobilenet"}  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test of ``tests/e2e/`` as ``e2e``; on a host without onnxruntime-training (Python
    >= 3.12 has no wheel of it) skip, with that reason, the tests marked ``ort_training`` and those
    that use an ORT-training preparation."""
    why = why_no_ort_training()
    for item in items:
        if E2E in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)
        uses = ORT_TRAINING_FIXTURES & set(getattr(item, "fixturenames", ()))
        if why and (uses or item.get_closest_marker("ort_training")):
            item.add_marker(pytest.mark.skip(reason=f"needs onnxruntime-training: {why}"))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop Prefect's temporary API servers while pytest's streams are still open. Left to their
    ``atexit`` handler, each logs "Stopping temporary server" into a stream pytest has closed, and
    ~40 lines of ``--- Logging error ---`` become the last thing ``make test`` prints."""
    server_module = sys.modules.get("prefect.server.api.server")
    if server_module is None:  # no test started Prefect
        return
    prefect_logger = logging.getLogger("prefect")
    level = prefect_logger.level
    prefect_logger.setLevel(logging.WARNING)
    try:
        for server in list(server_module.SubprocessASGIServer._instances.values()):
            server.stop()
    finally:
        prefect_logger.setLevel(level)

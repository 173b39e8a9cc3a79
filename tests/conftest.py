"""Shared test configuration. Fixtures live in one plugin module per area so that areas can
use each other's fixtures (a prepared recipe, the board venv, a local or virtual board) without copies.

Tests mirror the source packages (``recipe/``, ``prepare/``, ``board/``, ``judge/``, ``prefect/``,
``flow/``, ``cli/``, ``agent/``); everything that needs root, a real sshd, a Prefect server or a
browser lives in ``e2e/`` and carries the ``e2e`` marker (applied here by folder).
"""

import contextlib
import logging
import os
import signal
import subprocess
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
# flow tests marked ``vboard`` run once, on the virtual board (real sshd, own user) where
# tests/e2e/test_flow_vboard.py collects them; their local-transport copy in tests/flow is
# deselected (that transport's flow is covered by the tests of tests/flow left unmarked)
VBOARD_MODULE = "tests.e2e.test_flow_vboard"
# the fixtures that prepare recipes for the ORT-training runtime (tests.fixtures_prepare pins it: the
# default is autograd): a test that uses one needs onnxruntime-training on the host
ORT_TRAINING_FIXTURES = {"digits_recipe", "prepared_digits", "prepared_embedded", "prepared_two_head",
                         "prepared_mobilenet"}  # fmt: skip


# recipes whose ``[data].make`` trains for minutes (a teacher, base weights), made in the background
# from the start of a run that will use them, at the lowest CPU priority: the CPU that tests waiting on
# a server, a lease or a board leave idle makes them before their first test needs them (that test
# waits on the make's file lock if not). Keyed by the test modules that use them.
WARM_DATA = {
    "ssdlite_teacher_small.toml": ("tests/flow/test_teacher_detection.py",),  # ~110 s: a teacher trained
    "mobilenet_v2.toml": ("tests/prepare/test_artifacts.py",),  # ~26 s: features pretrained on textures
}

WARMER = pytest.StashKey[subprocess.Popen]()


def _warm_data(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Start the background make of the recipes in WARM_DATA that the selected tests use."""
    if config.option.collectonly:
        return
    paths = {item.nodeid.split("::")[0] for item in items}
    wanted = [name for name, users in WARM_DATA.items() if paths & set(users)]
    if not wanted:
        return
    code = ("import sys\nfrom tasks import stages\nfrom tasks.recipe.load import load_recipe\n"
            "for path in sys.argv[1:]:\n    stages.prepare_data(load_recipe(path))\n")  # fmt: skip
    recipes = [str(Path(__file__).parents[1] / "recipes" / name) for name in wanted]
    config.stash[WARMER] = subprocess.Popen(  # noqa: S603 - this interpreter, the project's recipes
        [sys.executable, "-c", code, *recipes], cwd=Path(__file__).parents[1],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=lambda: os.nice(19),
    )  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of ``tests/e2e/`` as ``e2e``; deselect the local copies of the ``vboard`` flow
    tests; on a host without onnxruntime-training (Python >= 3.12 has no wheel of it) skip, with
    that reason, the tests marked ``ort_training`` and those that use an ORT-training preparation."""
    local_copies = [
        item
        for item in items
        if item.get_closest_marker("vboard") and getattr(item.module, "__name__", "") != VBOARD_MODULE
    ]
    if local_copies:
        config.hook.pytest_deselected(items=local_copies)
        items[:] = [item for item in items if item not in local_copies]
    _warm_data(config, items)
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
    ~40 lines of ``--- Logging error ---`` become the last thing ``make test`` prints. A background
    make still running (its tests deselected or failed early) is stopped."""
    warmer = session.config.stash.get(WARMER, None)
    if warmer is not None and warmer.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(warmer.pid, signal.SIGKILL)
        warmer.wait()
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

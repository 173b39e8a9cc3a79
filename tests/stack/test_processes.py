"""The stack's services stopped together: each is signalled as :func:`stop_service` does (SIGTERM
twice, then SIGKILL), their waits overlap, and only those that ran are named."""

from __future__ import annotations

import sys
from pathlib import Path

from tasks.stack.processes import running_pid, spawn, stop_services

# ignores SIGTERM (as a busy worker may): only the SIGKILL after the timeout ends it; "prefect" in
# its command line is what running_pid takes for one of the stack's processes
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)  # prefect"


def test_services_that_ignore_sigterm_are_killed_and_only_the_running_ones_named(tmp_path: Path) -> None:
    env = {"ODL_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    for name in ("worker", "worker-2"):
        spawn(env, name, [sys.executable, "-c", STUBBORN])
        assert running_pid(tmp_path, name) is not None
    services = [(tmp_path, "worker"), (tmp_path, "never-started"), (tmp_path, "worker-2")]
    assert stop_services(services, timeout=0.3) == ["worker", "worker-2"]
    assert running_pid(tmp_path, "worker") is None and running_pid(tmp_path, "worker-2") is None
    assert not (tmp_path / "run" / "worker.pid").exists()
    assert stop_services([], timeout=0.3) == []

"""The local Prefect stack of one project home: server, pool, deployments, workers, PostgreSQL.

``server`` starts and stops the stack (Prefect server, process work pool, deployments, workers)
and gives every process its environment; ``postgres`` runs the private PostgreSQL cluster the
server may use; ``processes`` holds what both need: the pidfiles, liveness and stopping of the
services they start. Every failure is a :class:`StackError`.
"""

from __future__ import annotations

from tasks.errors import HostExit, PipelineError


class StackError(PipelineError):
    """The local Prefect stack could not be started, deployed or stopped."""

    exit_code = HostExit.STACK

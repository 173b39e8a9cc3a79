"""How a run of the flow ends in Prefect: a state of the standard name ``Completed``, the verdict in
its message, in a tag and in the run's last log line.

Prefect's UI lists a deployment's runs by the standard state names (Completed, Failed, ...); a
Completed state named "Promoted" or "Not promoted" was listed nowhere ("No runs found"). The verdict
stays visible: the runs list shows the tag ``verdict:promoted`` / ``verdict:not-promoted`` beside the
state, the run's page shows the message, and ``prefect deployment run odl/full --watch``, which
prints the logs but only the final state's name, ends on the log line "Not promoted: v0004: ...
report: <link>"."""

from __future__ import annotations

from typing import Any

from tasks.prefect.params import tag_run


def verdict_text(promoted: bool, message: str, report: str) -> str:
    """ "Promoted: <version: headline>" (then the failing checks' lines), then "report: <where>"."""
    return f"{'Promoted' if promoted else 'Not promoted'}: {message}\nreport: {report}"


def verdict_tag(promoted: bool) -> str:
    """The run's verdict tag, shown beside its state in the UI's runs lists."""
    return "verdict:promoted" if promoted else "verdict:not-promoted"


def verdict_state(data: Any, promoted: bool, message: str, report: str) -> Any:
    """The flow's final state (Completed, the verdict in its message); tags the run with the verdict
    and logs the verdict as the run's last line."""
    from prefect.logging import get_run_logger  # Prefect only inside a flow run
    from prefect.states import Completed  # Prefect only inside a flow run

    text = verdict_text(promoted, message, report)
    tag_run([verdict_tag(promoted)])
    get_run_logger().info("%s", text)
    return Completed(data=data, message=text)

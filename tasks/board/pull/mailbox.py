"""The host's side of pull mode: what each board may fetch and what it sent, and each job's state.

A pull-mode board cannot be reached, so the host never runs anything on it: a run *submits* a job
(its ``job.json`` and blobs) to the board's mailbox and follows what the board reports. The
endpoint (:mod:`tasks.board.pull.endpoint`) answers the board's check-ins from the same mailbox.
Without a shared store it lives in ``$ODL_HOME/pull/``: ``mailbox.sqlite3`` (SQLite in WAL mode:
the endpoint and the runs of this host read and write it at once) and ``blobs/<sha256>`` (what a
board may fetch and the outputs it sent, content-addressed, written under a temporary name and
renamed once verified). With one (``ODL_STORE_URL``) its tables are the store's ``odl_pull_*`` and
its blobs the store's (:mod:`tasks.board.pull.records`, :mod:`tasks.board.pull.blobs`): a run on
any host hands a job to the one endpoint, on whichever host, and reads what the board sent.

A job's state is an explicit machine that only moves forward::

    pending --(a check-in hands it out)--> offered --(its first event)--> running
    pending | offered | running --(stop asked)--> stopping
    any open state --(result.json, verified)--> finished | failed | cancelled
    any open state --(its deadline passes first)--> expired

A final state is never left: a result after it is answered as before when it is the same result,
refused otherwise, so nothing is applied twice. Boards: ``invited`` (an operator made a one-time
code), ``pending`` (a board asked without a code: ``odl board accept``), ``accepted``, ``revoked``.
"""

from __future__ import annotations

from tasks.board.pull.boards import Boards
from tasks.board.pull.jobs import Jobs
from tasks.board.pull.records import FINAL, OPEN, BoardRecord, JobRecord, Refused, pull_home
from tasks.board.pull.reports import Reports

__all__ = ["FINAL", "OPEN", "BoardRecord", "JobRecord", "Mailbox", "Refused", "pull_home"]


class Mailbox(Boards, Jobs, Reports):
    """Pull mode's state on the host: its boards, its jobs, what the boards report."""

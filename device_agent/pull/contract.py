"""The pull-mode wire contract: what a board that can only dial out and the host endpoint say.

A pull-mode board opens every connection itself (HTTPS, the endpoint's certificate pinned by its
sha256) and the host answers; the job contract is the SSH path's own (``job.json`` by the
:class:`~device_agent.jobspec.JobSpec`, blobs by sha256, ``events.jsonl`` from a byte offset,
``result.json`` and its outputs verified by sha256). Both sides import this module: the board's
client (:mod:`device_agent.pull.client`) and the host's endpoint. Standard library only.

Every request but the certificate fetch is signed with the board's own key (ECDSA P-256, made on
the board by ``openssl``; the private key never leaves it). The headers :data:`H_BOARD`,
:data:`H_TIME`, :data:`H_NONCE` and :data:`H_SIGNATURE` carry the board's name, the request's Unix
time, a random nonce and the base64 DER signature of :func:`signed_text`: the method, the path with
its query, the board, the time, the nonce and the body's sha256. The host refuses an unknown or
revoked board, a time off by more than :data:`MAX_SKEW_S`, a nonce it has seen and a bad signature,
each with a status and a one-line ``{"error": ...}``.

Routes under :data:`PREFIX` (``POST`` bodies are JSON unless said otherwise):

- ``POST enrol`` ``{"name", "public_key" (PEM), "code" (one-time, optional), "info"}``: signed by the
  key it sends. Answers ``{"state": "accepted"}``, or 202 ``{"state": "pending", "sleep_s"}`` until
  an operator accepts it (``odl board accept NAME``).
- ``POST poll`` ``{"info", "jobs": {job_id: state}, "wait_s"}``: the check-in (``info`` the agent's
  :class:`~device_agent.messages.BoardInfo`, ``jobs`` the state of each job the board holds).
  With ``wait_s`` (at most :data:`LONG_POLL_S`) a board with nothing open lets the host hold the
  request until work for it arrives or ``wait_s`` passes (a long poll: a job is taken within a
  second of its submission, at one request per ``wait_s`` from an idle board).
  Answers ``{"sleep_s", "work"}``, ``work`` a list of :data:`WORK_KINDS` items, each with an ``id``:
  ``{"kind": "train", "id": job_id, "spec", "blobs": {sha256: size}, "upload": [output names]}``
  (train the job, send back the outputs named, e.g. ``["inference"]``); ``{"kind": "stop", "id":
  job_id}`` (cancel it); ``{"kind": "install-model", "id", "recipe", "version", "files": {name:
  sha256}, "blobs": {sha256: size}}`` (the agent's ``install-model``; its answer goes to ``POST
  work/<id>``); ``{"kind": "list-dataset", "id", "path", "format"}`` (the agent's ``dataset``
  listing of a folder under its root, answered the same way). The host sets ``sleep_s`` within
  :data:`SLEEP_BOUNDS_S`, shorter while a job runs.
- ``GET blobs/<sha256>``: a blob of one of the board's own jobs; ``Range: bytes=N-`` resumes (206).
- ``POST jobs/<job_id>/events?offset=N``: the raw bytes of ``events.jsonl`` from byte N. Answers
  ``{"offset"}``, the host's length after the append; 409 ``{"offset"}`` when N is not it.
- ``GET jobs/<job_id>/files/<sha256>``: ``{"offset"}``, how many bytes of that output the host has.
- ``PUT jobs/<job_id>/files/<sha256>?offset=N&size=S``: bytes from N of an output of ``size`` S;
  answers ``{"offset", "complete"}``; a complete file whose sha256 differs is dropped (422).
- ``POST jobs/<job_id>/result``: ``result.json`` itself, accepted once every output the ``train`` item's
  ``upload`` names is complete and verified (its sha256 the one ``result.json`` lists); a job's final state is never applied twice (the same result again is
  answered as before, another one refused with 409).
- ``POST work/<id>``: the answer of a work item that is not a job (``install-model``'s JSON, or
  ``{"error": "one line"}``).

An overloaded endpoint answers 429 with ``Retry-After``, and 503 while the host's shared store is out of
reach (or a blob of it fails its check: nothing unverified is served); the board waits that long plus jitter.
"""

from __future__ import annotations

import hashlib
import re

CONTRACT = "odl-pull-1"
PREFIX = "/odl/v1/"
H_BOARD = "X-ODL-Board"
H_TIME = "X-ODL-Time"
H_NONCE = "X-ODL-Nonce"
H_SIGNATURE = "X-ODL-Signature"
MAX_SKEW_S = 300  # a request's time may differ from the host's clock by this much
NONCE_RE = re.compile(r"^[0-9a-f]{32}$")
SLEEP_BOUNDS_S = (1.0, 3600.0)  # what the host may tell a board to sleep between check-ins
LONG_POLL_S = 25.0  # an idle board's check-in the host may hold this long, answering as work arrives
WORK_KINDS = ("train", "stop", "install-model", "list-dataset")
CHUNK = 1 << 20  # bytes a board sends or asks for in one request
PIN_RE = re.compile(r"^sha256:[0-9a-f]{64}$")  # the endpoint certificate's pin, as operators type it


def signed_text(method: str, path: str, board: str, ts: str, nonce: str, body: bytes) -> bytes:
    """The bytes a request's signature covers (``path`` with its query string, as sent)."""
    digest = hashlib.sha256(body).hexdigest()
    return "\n".join((CONTRACT, method.upper(), path, board, ts, nonce, digest)).encode()


def cert_pin(der: bytes) -> str:
    """The pin of a certificate: ``sha256:`` and the hex digest of its DER bytes."""
    return "sha256:" + hashlib.sha256(der).hexdigest()

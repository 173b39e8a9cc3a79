"""Pull-mode boards and their credentials: the one-time codes an operator makes, enrolment,
acceptance, revocation, the nonces a board used and its check-ins."""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from tasks.board.pull.records import CODE_TTL_S, NONCE_KEEP_S, OPEN, BoardRecord, Refused, Store, code_hash
from tasks.errors import BoardError

# a board's whole row, replaced when the name is there already (every column set, as a new row has it)
SET_BOARD = (
    "INSERT INTO boards (name, state, public_key, code_hash, code_expires, since, last_seen, info)"
    " VALUES ({values}) ON CONFLICT (name) DO UPDATE SET state=excluded.state,"
    " public_key=excluded.public_key, code_hash=excluded.code_hash, code_expires=excluded.code_expires,"
    " since=excluded.since, last_seen=excluded.last_seen, info=excluded.info"
)


class Boards(Store):
    """The boards' part of the mailbox."""

    def invite(self, name: str, now: float | None = None) -> str:
        """A one-time enrolment code for ``name`` (stored hashed, lapses after a day)."""
        now = time.time() if now is None else now
        # hex: never read as an option (a leading "-") on the board's command line
        code = secrets.token_hex(8)
        with self.tx() as db:
            row = db.execute("SELECT state FROM boards WHERE name=?", (name,)).fetchone()
            if row and row[0] == "accepted":
                raise BoardError(f"board {name} is enrolled already: `odl board revoke {name}` first")
            db.execute(
                SET_BOARD.format(values="?, 'invited', NULL, ?, ?, ?, NULL, NULL"),
                (name, code_hash(code), now + CODE_TTL_S, now),
            )
        return code

    def enrol(self, name: str, public_key: str, code: str | None, info: dict[str, Any] | None) -> str:
        """A board's enrolment: ``accepted`` with a valid one-time code, else ``pending`` until an
        operator accepts it. The same key asking again is answered as before; another key is refused."""
        now = time.time()
        with self.tx() as db:
            row = db.execute(
                "SELECT state, public_key, code_hash, code_expires FROM boards WHERE name=?", (name,)
            ).fetchone()
            state, key, stored, expires = row if row else (None, None, None, None)
            if state == "revoked":
                raise Refused(403, f"board {name} is revoked: it cannot enrol again under this name")
            if key is not None and key != public_key:
                raise Refused(403, f"board {name} is enrolled with another key")
            if state in ("accepted", "pending"):
                return state
            if code is not None:
                if state != "invited" or stored != code_hash(code) or now > (expires or 0):
                    raise Refused(403, f"board {name}: the enrolment code is wrong, used or expired")
                new = "accepted"
            else:
                new = "pending"
            db.execute(
                SET_BOARD.format(values="?, ?, ?, NULL, NULL, ?, ?, ?"),
                (name, new, public_key, now, now, json.dumps(info) if info else None),
            )
        return new

    def accept(self, name: str) -> BoardRecord:
        """Accept a board that enrolled without a code."""
        return self._set_state(name, ("pending",), "accepted")

    def revoke(self, name: str) -> BoardRecord:
        """Revoke a board: every request of it is refused from the next one on; its open jobs expire."""
        record = self._set_state(name, ("invited", "pending", "accepted"), "revoked")
        with self.tx() as db:
            db.execute(
                f"UPDATE jobs SET state='expired', ended=?, verdict=? WHERE board=? AND state IN {OPEN}",
                (time.time(), f"board {name} was revoked", name),
            )
        return record

    def _set_state(self, name: str, sources: tuple[str, ...], state: str) -> BoardRecord:
        with self.tx() as db:
            row = db.execute("SELECT state FROM boards WHERE name=?", (name,)).fetchone()
            if row is None:
                raise BoardError(f"board {name} has not enrolled (no pull-mode board of that name)")
            if row[0] not in sources:
                raise BoardError(f"board {name} is {row[0]}: expected one of {', '.join(sources)}")
            db.execute("UPDATE boards SET state=?, since=? WHERE name=?", (state, time.time(), name))
        return self.board(name)  # type: ignore[return-value]

    def board(self, name: str) -> BoardRecord | None:
        """The board's record, None when it never enrolled nor was invited."""
        with self.read() as db:
            row = db.execute(
                "SELECT name, state, public_key, since, last_seen, info FROM boards WHERE name=?", (name,)
            ).fetchone()
        if row is None:
            return None
        return BoardRecord(*row[:5], json.loads(row[5]) if row[5] else None)

    def remember_nonce(self, board: str, nonce: str, ts: float) -> bool:
        """Record a request's nonce; False when the board used it already (a replay)."""
        with self.tx() as db:
            db.execute("DELETE FROM nonces WHERE ts < ?", (time.time() - NONCE_KEEP_S,))
            cur = db.execute(
                "INSERT INTO nonces (board, nonce, ts) VALUES (?, ?, ?) ON CONFLICT (board, nonce) DO NOTHING",
                (board, nonce, ts),
            )
        return cur.rowcount == 1

"""Small named documents in the shared store (the inventory, the boards' pinned host keys).

Table ``odl_documents``: name, content, its sha256 and a revision that grows by one per change. A
change is a read-modify-write under a transaction-scoped advisory lock on the name
(:meth:`Documents.update`), so two hosts editing the inventory at once both land, one after the other.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tasks.store.connection import Store


@dataclass
class Document:
    """A document as read (``content`` None when absent); set ``content`` inside :meth:`Documents.update`."""

    name: str
    content: bytes | None
    revision: int = 0


class Documents:
    """The named documents of one store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def get(self, name: str) -> Document:
        """The document ``name`` as committed now."""
        with self.store.transaction() as conn:
            row = conn.execute(
                "SELECT content, revision FROM odl_documents WHERE name = %s", (name,)
            ).fetchone()
        return Document(name, bytes(row[0]), row[1]) if row else Document(name, None)

    def stamp(self, name: str, prefix: str) -> tuple[int, int, int]:
        """What changes whenever document ``name`` or a document under ``prefix`` changes, in ~100
        bytes: ``name``'s revision, and the count and summed revisions of those under ``prefix`` (a
        reader asks this first and reads the documents only when it moved)."""
        with self.store.transaction() as conn:
            row = conn.execute(
                "SELECT coalesce(max(revision) FILTER (WHERE name = %s), 0),"
                " count(*) FILTER (WHERE starts_with(name, %s)),"
                " coalesce(sum(revision) FILTER (WHERE starts_with(name, %s)), 0)"
                " FROM odl_documents WHERE name = %s OR starts_with(name, %s)",
                (name, prefix, prefix, name, prefix),
            ).fetchone()
        return int(row[0]), int(row[1]), int(row[2])

    def get_many(self, prefix: str) -> dict[str, bytes]:
        """Every document whose name starts with ``prefix``: name -> content."""
        with self.store.transaction() as conn:
            rows = conn.execute(
                "SELECT name, content FROM odl_documents WHERE starts_with(name, %s)", (prefix,)
            ).fetchall()
        return {name: bytes(content) for name, content in rows}

    @contextmanager
    def update(self, name: str) -> Iterator[Document]:
        """Hold the lock on ``name``, yield it as committed; write back what the block leaves in ``content``
        (a new revision only when it changed). Other hosts' updates of ``name`` wait meanwhile."""
        with self.store.transaction() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"odl_documents:{name}",))
            row = conn.execute(
                "SELECT content, revision FROM odl_documents WHERE name = %s", (name,)
            ).fetchone()
            doc = Document(name, bytes(row[0]), row[1]) if row else Document(name, None)
            before = doc.content
            yield doc
            if doc.content is None or doc.content == before:
                return
            conn.execute(
                "INSERT INTO odl_documents (name, content, sha256, revision, updated_by) "
                "VALUES (%s, %s, %s, 1, %s) ON CONFLICT (name) DO UPDATE SET content = EXCLUDED.content, "
                "sha256 = EXCLUDED.sha256, revision = odl_documents.revision + 1, "
                "updated_by = EXCLUDED.updated_by, updated_at = now()",
                (name, doc.content, hashlib.sha256(doc.content).hexdigest(), self.store.host),
            )

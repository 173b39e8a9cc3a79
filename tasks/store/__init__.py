"""The shared store: what must outlive a run and be seen by every host, on PostgreSQL.

Unset ``ODL_STORE_URL`` and nothing here is used: the registry, the inventory and the pinned host
keys stay in the local ``$ODL_HOME`` (one host, the embedded default). Set it
(``postgresql://USER@HOST:PORT/DB``, the password in the file named by ``ODL_STORE_PASSWORD_FILE``
or in ``~/.pgpass``) and every host pointed at the same database shares them:

- ``config``: the store a host is configured for (:func:`store_config`), refused in one line when wrong;
- ``connection``: the process's connection, its transactions, the tables (:func:`open_store`);
- ``blobs``: file contents by sha256 (:class:`BlobStore`, :class:`PgBlobStore`);
- ``documents``: small named documents with revisions (the inventory, the pinned host keys).

The registry's tables and the way it numbers versions are :mod:`tasks.judge.registry_shared`'s.
"""

from __future__ import annotations

from tasks.store.blobs import BlobStore, PgBlobStore
from tasks.store.config import PASSWORD_VAR, URL_VAR, StoreConfig, store_config
from tasks.store.connection import Store, open_store
from tasks.store.documents import Document, Documents

__all__ = ["PASSWORD_VAR", "URL_VAR", "BlobStore", "Document", "Documents", "PgBlobStore", "Store",
           "StoreConfig", "configured_store", "open_store", "store_config"]  # fmt: skip


def configured_store() -> Store | None:
    """The shared store of this host's environment, None when ``ODL_STORE_URL`` is unset."""
    cfg = store_config()
    return open_store(cfg) if cfg else None

"""The one way callers obtain the model registry: the shared one when ``ODL_STORE_URL`` is set, else
the local folder ``$ODL_HOME/registry`` (the embedded default, one host)."""

from __future__ import annotations

from pathlib import Path

from tasks.judge.registry import Registry
from tasks.judge.registry_base import ModelRegistry
from tasks.judge.registry_cache import cache_root
from tasks.judge.registry_shared import SharedRegistry
from tasks.paths import odl_home
from tasks.store import open_store, store_config


def open_registry(home: Path | None = None) -> ModelRegistry:
    """The registry this host is configured for. With ``ODL_STORE_URL`` set the store is reached at once,
    so a host without valid credentials is refused here, in one line (StoreError), before any work."""
    home = Path(home) if home is not None else odl_home()
    cfg = store_config()
    if cfg is None:
        root = home / "registry"
        root.mkdir(parents=True, exist_ok=True)
        return Registry(root)
    store = open_store(cfg)
    store.check()
    return SharedRegistry(store, cache_root(cfg, home))

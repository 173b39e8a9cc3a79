"""Prepared folders in the shared store (issue 45, tasks/prepare/shared.py): a second home with the
same store gets the first one's prepared folder without preparing, byte for byte; a folder is never
present half uploaded, nor half fetched."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import psycopg
import pytest

from tasks import stages
from tasks.errors import StoreError, StoreUnreachable
from tasks.hashing import file_sha256
from tasks.paths import PROJECT_ROOT
from tasks.prepare.shared import StorePrepared, folder_files
from tasks.recipe.load import load_recipe
from tasks.store import PgBlobStore, Store, configured_store, store_config
from tests.store.kit import waiting_pid

pytestmark = pytest.mark.slow
PREPARING = (
    "tasks.prepare.export",
    "tasks.prepare.runtimes",
    "tasks.prepare.validation",
    "tasks.stages.rehearse",
)


def _contents(folder: Path) -> dict[str, bytes]:
    return {rel: path.read_bytes() for rel, path in folder_files(folder).items()}


def test_a_second_home_fetches_the_prepared_folder_instead_of_preparing(
    shared_store, tmp_path, monkeypatch, caplog
):
    recipe = load_recipe(PROJECT_ROOT / "recipes" / "digits_fleet.toml")
    stages.prepare_data(recipe)
    monkeypatch.setenv("ODL_HOME", str(tmp_path / "a"))
    inp = stages.inputs(recipe)
    first = stages.prepare(inp)
    listing = StorePrepared(configured_store()).listing(inp.key)
    assert listing["steps"] == ["export", "artifacts", "validate"] and ".done-validate" in listing["files"]
    assert set(listing["files"]) == set(folder_files(first.out_dir))

    monkeypatch.setenv("ODL_HOME", str(tmp_path / "b"))
    caplog.clear()
    caplog.set_level(logging.INFO)
    second = stages.prepare(stages.inputs(recipe))
    assert second.out_dir == tmp_path / "b" / "prepared" / first.out_dir.name
    assert (
        f"prepared {first.out_dir.name}: fetched from the shared store ({len(listing['files'])} files"
        in caplog.text
    )
    assert not [
        r.getMessage() for r in caplog.records if r.name.startswith(PREPARING)
    ]  # nothing prepared here
    assert _contents(second.out_dir) == _contents(first.out_dir)  # validation.json's timings included
    assert second.manifest == first.manifest and second.validation == first.validation

    # a damaged copy in the store: the fetch stops in one line and leaves no folder, whole or partial
    store = configured_store()
    with store.transaction() as conn:
        conn.execute(
            "UPDATE odl_blob_chunks SET data = 'x' WHERE sha256 = %s", (listing["files"]["model.onnx"],)
        )
    monkeypatch.setenv("ODL_HOME", str(tmp_path / "c"))
    with pytest.raises(StoreError, match="damaged") as caught:
        stages.prepare(stages.inputs(recipe))
    assert "\n" not in str(caught.value)
    assert list((tmp_path / "c" / "prepared").iterdir()) == []


def test_a_folder_half_published_is_absent_for_the_other_hosts(shared_store, tmp_path):
    """The publisher's blobs are committed, its listing waits (the test holds the listing's lock), and
    then its session dies: no other host sees the folder; the next publish makes it whole."""
    key = "ab" * 32
    folder = tmp_path / "a" / "prepared" / f"r-{key[:12]}"
    (folder / "artifacts").mkdir(parents=True)
    for rel, text in {"model.onnx": "m", "artifacts/checkpoint": "c", "manifest.json": "{}"}.items():
        (folder / rel).write_text(text * 1000)
    for step in ("export", "artifacts"):
        (folder / f".done-{step}").write_text(key + "\n")
    (folder / ".manifest.json.tmp").write_text("a writer's temporary file: not shared")
    cfg = store_config()
    reader, elsewhere = StorePrepared(configured_store()), tmp_path / "b" / "prepared" / folder.name
    caught: list[BaseException] = []

    def publish() -> None:
        try:
            StorePrepared(Store(cfg)).publish(folder, key)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            caught.append(exc)

    with psycopg.connect(**cfg.connect_kwargs(), autocommit=True) as admin:
        admin.execute("SELECT pg_advisory_lock(hashtext(%s))", (f"odl_documents:prepared/{key}",))
        thread = threading.Thread(target=publish)
        thread.start()
        pid = waiting_pid(cfg, "SELECT pg_advisory_xact_lock")
        shas = {file_sha256(p) for p in folder_files(folder).values()}  # hashed here, not put
        assert (
            PgBlobStore(configured_store()).present(shas) == shas and len(folder_files(folder)) == 5
        )  # all in
        assert not reader.fetch(elsewhere, key, "export") and not elsewhere.exists()  # the folder is not
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        thread.join(timeout=30)
        admin.execute("SELECT pg_advisory_unlock(hashtext(%s))", (f"odl_documents:prepared/{key}",))
    assert isinstance(caught[0], StoreUnreachable)
    assert reader.listing(key) is None and not reader.fetch(elsewhere, key, "export")
    StorePrepared(configured_store()).publish(folder, key)
    assert not reader.fetch(elsewhere, key, "validate")  # not done there: this host would validate
    assert reader.fetch(elsewhere, key, "artifacts") and _contents(elsewhere) == _contents(folder)
    assert not (elsewhere / ".manifest.json.tmp").exists()

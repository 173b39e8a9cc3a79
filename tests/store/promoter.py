"""One simulated host for the registry concurrency test: ``python -m tests.store.promoter TAG N GO``
waits for the file GO, then records N promoted candidates of recipe ``digits`` on board ``lab`` in the
registry its environment names (its own ODL_HOME, the shared ODL_STORE_URL), each model unique."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from tasks.judge.registry_open import open_registry
from tests.store.kit import model_file, verdict


def main(tag: str, count: int, go: Path) -> None:
    reg = open_registry()
    reg.current("digits", "lab")  # connected: the store is reached before the start
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(count):
            model = model_file(Path(tmp), f"{tag}-{i}".encode() * 1000)
            version = reg.record("digits", "lab", model, {"accuracy": i}, verdict(True, i),
                                 info={"writer": tag, "i": i})  # fmt: skip
            print(version.name, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))

"""Board releases are named by version and content: a host whose registry started over installs
its own v0001 beside the old one instead of rewriting the release in service."""

from __future__ import annotations

from tests.agent.test_board_nightly import put


def test_a_registry_that_started_over_installs_its_v0001_beside_the_old_one(agent_board, tmp_path):
    root, models = agent_board.root, agent_board.root / "models" / "digits"
    old, new = put(root, b"the first host's v0001"), put(root, b"another registry's v0001")
    assert agent_board.run("install-model", "digits", "v0001", f"model.onnx={old}").code == 0
    res = agent_board.run("install-model", "digits", "v0001", f"model.onnx={new}")
    assert res.code == 0, res.err
    assert res.last["current"]["files"] == {"model.onnx": new} and res.last["previous"]["files"] == {
        "model.onnx": old
    }
    assert (models / "current.onnx").read_bytes() == b"another registry's v0001"
    assert sorted(p.name for p in (models / "releases").iterdir()) == sorted(
        [f"v0001-{old[:12]}", f"v0001-{new[:12]}"]
    )

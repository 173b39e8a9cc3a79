"""The board's pull service against a local HTTPS endpoint (:mod:`tests.agent.pull_kit`): a train
item becomes a real job (fetched, written, started once however often it is offered), its events
and result reach the host; a restarted service resumes an interrupted job and sends its events from
the host's offset; a spec in conflict and a stop are answered with a result of the board's making;
``install-model`` is answered once; ``enrol`` pins, makes the key and asks again while pending."""

from __future__ import annotations

import hashlib
import json
import stat
import time
from pathlib import Path

import pytest

from device_agent.cli import main
from device_agent.protocol import ExitCode, JobSpec
from device_agent.pull.config import load_config, save_config
from device_agent.pull.jobs import Record, create_job
from device_agent.pull.service import serve
from tests.agent import pull_kit
from tests.agent.pull_kit import BOARD, Board, Endpoint, train_item

key_root, endpoint, board = pull_kit.key_root, pull_kit.endpoint, pull_kit.board  # the kit's fixtures


def check_in_until(board: Board, done: object, seconds: float = 25.0) -> int:
    """Run one check-in at a time (``serve --once``) until ``done()``; how many it took."""
    deadline = time.monotonic() + seconds
    for n in range(1, 1000):
        assert serve(board.root, 1, client=board.client, sleep=board.slept.append) == ExitCode.OK
        if done() or time.monotonic() > deadline:  # type: ignore[operator]
            return n
        time.sleep(0.2)
    return 0


def service_log(board: Board) -> str:
    return (board.root / "pull" / "service.log").read_text()


def test_a_train_item_is_started_once_and_its_events_and_result_reach_the_host(
    board: Board, endpoint: Endpoint
) -> None:
    item = train_item(endpoint, "j1")
    endpoint.work = [item | {"again": True}]  # offered at every check-in, as the host does until it runs
    check_in_until(board, lambda: "j1" in endpoint.results)
    folder = board.root / "jobs" / "j1"
    assert JobSpec.from_json((folder / "job.json").read_text()).to_dict() == item["spec"]
    assert all((board.root / "blobs" / sha).stat().st_size == size for sha, size in item["blobs"].items())
    result = json.loads((folder / "result.json").read_text())
    assert endpoint.results["j1"] == [result] and result["exit_code"] == ExitCode.ARTIFACT_INVALID
    assert bytes(endpoint.events["j1"]) == (folder / "events.jsonl").read_bytes() != b""
    assert service_log(board).count("job j1: started") == 1 and "resumed" not in service_log(board)
    endpoint.work = []
    check_in_until(board, lambda: True)
    assert len(endpoint.results["j1"]) == 1, "a result the host holds is not sent again"
    polls = [json.loads(s.body) for s in endpoint.seen if s.route == "poll"]
    assert polls[-1]["jobs"] == {"j1": "failed"} and polls[-1]["info"]["root"] == str(board.root)


def test_a_restarted_service_resumes_a_job_and_sends_events_from_the_hosts_offset(
    board: Board, endpoint: Endpoint
) -> None:
    item = train_item(endpoint, "j2")
    board.root.joinpath("blobs").mkdir()
    for sha, data in endpoint.blobs.items():
        (board.root / "blobs" / sha).write_bytes(data)
    job = create_job(board.root, JobSpec.from_dict(item["spec"]))
    first = b'{"data": {}, "job_id": "j2", "protocol_version": 2, "seq": 0, "ts": 1.0, "type": "labels"}\n'
    job.events.write_bytes(first)  # what the run before the reboot wrote, and the host has
    endpoint.events["j2"] = bytearray(first)
    (board.root / "pull" / "jobs").mkdir()
    (board.root / "pull" / "jobs" / "j2.json").write_text(
        json.dumps({"job_id": "j2", "upload": [], "started": True})
    )
    check_in_until(board, lambda: "j2" in endpoint.results)
    assert "job j2: resumed" in service_log(board)
    assert bytes(endpoint.events["j2"]) == job.events.read_bytes() and job.events.read_bytes().startswith(
        first
    )
    record = Record(**json.loads((board.root / "pull" / "jobs" / "j2.json").read_text()))
    assert record.resumes == 1 and record.closed


def test_another_spec_under_a_known_id_is_refused_for_that_job(board: Board, endpoint: Endpoint) -> None:
    item = train_item(endpoint, "j3")
    other = JobSpec.from_dict(item["spec"] | {"recipe_name": "another"})
    job = create_job(board.root, other)
    endpoint.work = [item]
    check_in_until(board, lambda: "j3" in endpoint.results)
    (result,) = endpoint.results["j3"]
    assert result["status"] == "failed" and result["exit_code"] == ExitCode.INVALID_SPEC
    assert "another spec" in result["error"] and "\n" not in result["error"]
    assert JobSpec.from_json(job.spec_file.read_text()) == other and not job.result_file.exists()
    assert not job.events.exists(), "the job on the board is not touched"


def test_a_stop_for_a_job_never_taken_is_answered_cancelled(board: Board, endpoint: Endpoint) -> None:
    endpoint.work = [{"kind": "stop", "id": "j4"}]
    check_in_until(board, lambda: "j4" in endpoint.results)
    (result,) = endpoint.results["j4"]
    assert result["status"] == "cancelled" and result["exit_code"] == ExitCode.CANCELLED


def test_install_model_is_answered_and_never_applied_twice(board: Board, endpoint: Endpoint) -> None:
    model = b"not really onnx, but installed by its hash"
    sha = hashlib.sha256(model).hexdigest()
    endpoint.blobs[sha] = model
    item = {"kind": "install-model", "id": "w1", "recipe": "digits", "version": "v0003",
            "files": {"model.onnx": sha}, "blobs": {sha: len(model)}}  # fmt: skip
    endpoint.work = [item]
    check_in_until(board, lambda: "w1" in endpoint.answers)
    answer = endpoint.answers.pop("w1")
    assert answer["current"]["version"] == "v0003" and answer["changed"] is True
    assert (board.root / "models" / "digits" / "current.onnx").read_bytes() == model
    endpoint.work = [item, {**item, "id": "w2", "version": "bad"}]  # offered again (the host lost the answer)
    check_in_until(board, lambda: "w2" in endpoint.answers)
    assert endpoint.answers["w1"] == answer, "the same answer again: nothing installed twice"
    assert "version" in endpoint.answers["w2"]["error"] and set(endpoint.answers["w2"]) == {"error"}


def test_enrol_makes_the_key_pins_the_endpoint_and_a_pending_board_asks_again(
    tmp_path: Path, endpoint: Endpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "b"
    endpoint.enrol_state = "pending"
    argv = ["--root", str(root), "enrol", "--endpoint", endpoint.url, "--pin", endpoint.pin, "--name", BOARD]
    assert main([*argv, "--code", "c0de"]) == ExitCode.OK
    answer = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert answer["state"] == "pending" and answer["key_made"] is True
    (enrol,) = endpoint.seen
    body = json.loads(enrol.body)
    assert (
        enrol.verified and body["code"] == "c0de" and body["name"] == BOARD and body["info"]["cpu_count"] >= 1
    )
    config = root / "pull" / "config.json"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600 and load_config(root).state == "pending"  # type: ignore[union-attr]
    assert main(["--root", str(root), "pull", "--once"]) == ExitCode.OK
    assert endpoint.routes() == ["enrol", "enrol"], "pending: it asks enrol again, it does not poll"
    endpoint.enrol_state = "accepted"
    assert main(["--root", str(root), "pull", "--once"]) == ExitCode.OK
    assert endpoint.routes()[2:] == ["enrol", "poll"] and load_config(root).state == "accepted"  # type: ignore[union-attr]
    save_config(root, load_config(root).with_state("pending"))  # type: ignore[union-attr]
    wrong = [*argv[:6], "sha256:" + "1" * 64, *argv[7:]]
    assert main(wrong) == ExitCode.UNTRUSTED and len(endpoint.seen) == 4


def test_the_outputs_named_go_up_before_the_result(board: Board, endpoint: Endpoint) -> None:
    item = train_item(endpoint, "j5", upload=("inference",))
    job = create_job(board.root, JobSpec.from_dict(item["spec"]))
    model, ckpt = b"trained model bytes" * 1000, b"checkpoint"
    (job.path / "inference.onnx").write_bytes(model)
    (job.path / "final.ckpt").write_bytes(ckpt)
    outputs = {name: {"path": path, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
               for name, path, data in (("inference", "inference.onnx", model), ("checkpoint", "final.ckpt", ckpt))}  # fmt: skip
    result = {"job_id": "j5", "status": "finished", "exit_code": 0, "steps": 3, "epochs_done": 1, "duration_s": 1.0,
              "peak_rss_mb": 10.0, "metrics": {}, "history": [], "outputs": outputs}  # fmt: skip
    job.result_file.write_text(json.dumps(result))
    (board.root / "pull" / "jobs").mkdir()
    (board.root / "pull" / "jobs" / "j5.json").write_text(
        json.dumps({"job_id": "j5", "upload": ["inference"]})
    )
    check_in_until(board, lambda: "j5" in endpoint.results)
    assert bytes(endpoint.files[outputs["inference"]["sha256"]]) == model
    assert outputs["checkpoint"]["sha256"] not in endpoint.files, "only the outputs the item names"
    routes = endpoint.routes()
    assert routes.index("jobs/j5/result") > max(
        i for i, r in enumerate(routes) if r.startswith("jobs/j5/files/")
    )
    assert endpoint.results["j5"] == [result] and "job j5: started" not in service_log(board), (
        "an ended job is not started"
    )

"""The odl flow under Prefect (test harness) on the local transport: artifacts, both promotion
outcomes, a failing run. tests/e2e/test_flow_vboard.py runs these same tests on the virtual board."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tasks.judge.decision import decision_from_dict, headline

pytestmark = pytest.mark.slow


def _run(board: str, **kw):
    from flows.odl import OdlParams, odl

    state = odl(OdlParams(board=board, **kw), return_state=True)
    assert state.is_completed(), state.message
    outcome = state.result()
    # a standard state name (the UI's deployment page lists runs by those); the verdict in its message
    assert state.name == "Completed"
    verdict = "Promoted: " if outcome.promoted else "Not promoted: "
    assert state.message.startswith(verdict + outcome.version + ": "), state.message
    assert re.search(r"^report: \S+", state.message, re.M), state.message
    return state.state_details.flow_run_id, outcome


def _artifacts(run_id):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
        )
    return {a.key: a for a in found}


def _logs(run_id) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()  # the run's last lines may still be queued in this process
    found: list[str] = []
    with get_client(sync_client=True) as client:
        while True:  # every page: the server returns 200 lines a call by default
            page = client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])),
                limit=200,
                offset=len(found),
            )
            found += [rec.message for rec in page]
            if len(page) < 200:
                return found


def _assert_no_key_in_prefect(run_id, key_path, arts) -> None:
    """The board's private key appears in no artifact and no log line of the run."""
    from tests.e2e.test_secrets import _key_fragments

    logs = _logs(run_id)
    texts = [str(a.data) + str(a.description) for a in arts.values()] + logs
    assert len(logs) > 5 and any("board" in t for t in texts)  # the logs were really read
    for fragment in _key_fragments(Path(key_path)):
        assert not any(fragment in t for t in texts)


def _task_states(run_id):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
    return {r.name: r.state.name for r in runs}


@pytest.fixture(scope="module")
def promoted_run(prefect_harness, flow_home, flow_board):
    return _run(flow_board.name)


def test_first_run_is_promoted_with_report_and_progress(promoted_run, flow_board, flow_home):
    from tasks.judge.registry import Registry

    run_id, out = promoted_run
    board = flow_board.name
    assert out.promoted and out.version == "v0001"
    arts = _artifacts(run_id)
    report = arts[f"odl-report-digits-{board}"].data
    assert "**Promoted**" in report and "## Before / after on the host test set `test.npz`" in report
    assert "data:image/png;base64," in report and "### Extra test set `clean`" in report
    assert arts[f"odl-progress-digits-{board}"].data == 100
    epochs = arts[f"odl-epochs-digits-{board}"].data
    assert "train_loss" in epochs
    base, cand = out.metrics["base"]["accuracy"], out.metrics["candidate"]["accuracy"]
    assert cand > base  # fine-tuning on the shifted domain gains accuracy
    current = Registry(flow_home / "registry").current("digits", board)
    assert current.name == "v0001" and current.info["flow_run_id"] == str(run_id)
    assert current.info["job_id"] == out.job_id and out.job_id.startswith(
        f"digits-{current.info['input_key'][:12]}-"
    )
    assert (out.run_dir / "inference.onnx").is_file()
    if flow_board.key is not None:  # an SSH board: its key must not leak into Prefect
        _assert_no_key_in_prefect(run_id, flow_board.key, arts)
    assert set(current.info["input_hashes"]) >= {"recipe", "data.train", "data.test"}
    _assert_readable_run(run_id, f"digits@{board}", ["recipe:digits", f"board:{board}", "kind:full"])
    epochs = [m for m in _logs(run_id) if m.startswith(f"board {board}: epoch ")]
    assert epochs and len(epochs) == len(set(epochs)), epochs  # each epoch's line once


# the standard state names but Scheduled: the filter the Prefect UI's deployment page lists runs with
# (prefect/server/ui-v2/assets/deployment._id-*.js, its default state filter from flow-runs-list-*.js)
UI_STATE_NAMES = ["Late", "Resuming", "AwaitingRetry", "AwaitingConcurrencySlot", "Pending", "Submitting",
                  "InfrastructurePending", "Paused", "Suspended", "Running", "Retrying", "Completed", "Cached",
                  "Cancelled", "Cancelling", "Crashed", "Failed", "TimedOut"]  # fmt: skip


def test_the_run_is_listed_by_the_deployment_page_with_its_verdict(promoted_run):
    """The issue: the deployment page said "No runs found" after three runs ended "Promoted" /
    "Not promoted". The run is found with the UI's own filter, its verdict in a tag and its message."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        FlowRunFilterState,
        FlowRunFilterStateName,
    )

    run_id, out = promoted_run
    names = FlowRunFilterState(name=FlowRunFilterStateName(any_=UI_STATE_NAMES))
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id]), state=names)
        )
    assert len(runs) == 1 and "verdict:promoted" in runs[0].tags, runs
    assert runs[0].state.message.startswith(f"Promoted: {out.version}: ")


def test_every_stage_logs_a_line_and_the_run_ends_on_its_verdict(promoted_run, flow_board):
    """deploy, retrieve, evaluate, promote and rollout logged nothing in the run's Logs tab; a watched
    run (`prefect deployment run --watch` prints logs, then only the state's name) ended without the
    verdict: its last line is now the verdict with the report's link."""
    run_id, out = promoted_run
    logs = _logs(run_id)
    board = flow_board.name
    for start in (f"deployed job {out.job_id} to {board}: ", "retrieved ", "evaluated base, candidate on the test set",
                  f"recorded {out.version} in the registry, promoted: now current",
                  f"{board} serves {out.version} as models/digits/current"):  # fmt: skip
        assert any(m.startswith(start) for m in logs), (start, logs)
    verdict = [m for m in logs if m.startswith("Promoted: ")]
    assert (
        verdict
        and verdict[-1].startswith(f"Promoted: {out.version}: accuracy ")
        and "\nreport: " in verdict[-1]
    )


def test_the_runs_events_carry_its_recipe_board_and_kind_tags(promoted_run, flow_board):
    """Events of a `prefect deployment run` carried only the deployment's tag: the tags the run takes
    at its start reach the events of its tasks and the board's events."""
    import time

    from prefect.client.orchestration import get_client

    run_id, _ = promoted_run
    want = {f"prefect.tag.{t}" for t in ("recipe:digits", f"board:{flow_board.name}", "kind:full")}
    run = {"id": [f"prefect.flow-run.{run_id}"]}
    kinds = ({"prefix": ["odl."]}, {"name": ["prefect.task-run.Completed"]})  # 50 events a page at most
    deadline, ours = time.monotonic() + 30, []
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:  # events reach the database in batches
            ours = [e for kind in kinds for e in client.request("POST", "/events/filter", json={
                "filter": {"any_resource": run, "event": kind}, "limit": 50}).json()["events"]]  # fmt: skip
            if any(e["event"] == "odl.model.promoted" for e in ours):
                break
            time.sleep(1)
    assert any(e["event"] == "odl.model.promoted" for e in ours), [e["event"] for e in ours]
    assert sum(e["event"] == "prefect.task-run.Completed" for e in ours) >= 5
    for e in ours:
        tags = {r["prefect.resource.id"] for r in e["related"] if r.get("prefect.resource.role") == "tag"}
        assert want <= tags, (e["event"], e["resource"].get("prefect.resource.name"), tags)


def _assert_readable_run(run_id, prefix: str, tags: list[str]) -> None:
    """The run is named ``<recipe>@<board> <date> <time>`` and tagged; task runs carry no hash suffix."""
    import datetime

    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
    assert re.fullmatch(
        rf"{re.escape(prefix)} {datetime.date.today().isoformat()} \d\d:\d\d:\d\d", run.name
    ), run.name
    assert set(tags) <= set(run.tags)
    names = set(_task_states(run_id))
    assert {"export", "generate artifacts", "validate recipe", "evaluate", "promote"} <= names, names


def test_run_forced_to_lose_keeps_current_and_reuses_cache(promoted_run, flow_board, flow_home):
    from tasks.judge.registry import Registry

    board = flow_board.name
    reg = Registry(flow_home / "registry")
    before = reg.current("digits", board).model.read_bytes()
    recorded = [v.promoted for v in reg.versions("digits", board)]  # other tests of the module may run first
    run_id, out = _run(board, promotion_min_gain=1.0)
    assert not out.promoted and out.version == f"v{len(recorded) + 1:04d}"
    assert "**Not promoted**" in _artifacts(run_id)[f"odl-report-digits-{board}"].data
    current = reg.current("digits", board)
    assert current.name == "v0001" and current.model.read_bytes() == before
    assert [v.promoted for v in reg.versions("digits", board)] == [*recorded, False] and recorded[0]
    states = _task_states(run_id)
    assert states["export"] == "Cached" and states["generate artifacts"] == "Cached"
    assert states["validate recipe"] == "Cached" and states[f"train on {board}"] == "Completed"


def test_failing_run_loses_nothing_promoted(promoted_run, flow_board, flow_home, tmp_path):
    """Training that fails on the board (its dataset path is wrong) fails the run before promotion;
    the registry keeps its versions and the bytes of the current model."""
    import shutil

    from flows.odl import OdlParams, odl
    from tasks.judge.registry import Registry
    from tasks.paths import PROJECT_ROOT

    recipes = PROJECT_ROOT / "recipes"
    for module in ("models.py", "datasets.py"):
        shutil.copy(recipes / module, tmp_path / module)
    text = (recipes / "digits.toml").read_text().replace('"data/', f'"{recipes}/data/')
    text = text.replace(
        f'train = "{recipes}/data/digits/train.npz"', 'board_train = "/nonexistent/train.npz"'
    )
    (tmp_path / "digits.toml").write_text(text)
    board = flow_board.name
    reg = Registry(flow_home / "registry")
    versions = [v.name for v in reg.versions("digits", board)]
    current = reg.current("digits", board)
    before = (current.name, current.model.read_bytes())
    state = odl(OdlParams(recipe=str(tmp_path / "digits.toml"), board=board), return_state=True)
    assert state.is_failed()
    assert "/nonexistent/train.npz" in state.message, state.message
    states = _task_states(state.state_details.flow_run_id)
    assert states[f"train on {board}"] == "Failed" and "promote" not in states, states
    assert [v.name for v in reg.versions("digits", board)] == versions
    now = reg.current("digits", board)
    assert (now.name, now.model.read_bytes()) == before


@pytest.mark.vboard
def test_detector_with_its_loss_in_the_graph_completes(prepared_ssd_flow):
    """An embedded-loss detector (SSD-Lite at 96 px) trains on the board, is evaluated on the host
    through its eval graph and with COCO mAP (pycocotools), judged on mAP@0.5; the registry keeps
    its priors beside the model and the report shows the detection sections."""
    run_id, out, board = prepared_ssd_flow
    base, cand = out.metrics["base"], out.metrics["candidate"]
    assert base["loss_kind"] == cand["loss_kind"] == "embedded"
    assert cand["loss"] < base["loss"]
    for m in (base, cand):
        assert 0.0 <= m["map"] <= m["map50"] <= 1.0 and len(m["per_class_ap50"]) == 3
    assert (out.run_dir / "inference.onnx").is_file()
    from tasks import stages

    version = next(v for v in stages.registry().versions("ssdlite-small", board) if v.name == out.version)
    assert version.info["decision"]["metric"] == "map50"
    test = version.info["decision"]["significance"]  # a paired bootstrap over the test images
    assert test["test"].startswith("paired bootstrap over 64 test images") and test["low"] <= test["high"]
    assert out.promoted == (cand["map50"] > base["map50"] and test["low"] > 0)
    assert (version.path / "priors.npy").is_file() and (version.path / "model.onnx").is_file()
    report = _artifacts(run_id)[f"odl-report-ssdlite-small-{board}"].data
    for text in (
        "mAP@0.5",
        "per-class AP",
        "![precision-recall](data:image/png",
        "![test image 0](data:image/png",
    ):
        assert text in report


@pytest.fixture
def prepared_ssd_flow(prefect_harness, flow_home, flow_board):
    from tasks.paths import PROJECT_ROOT

    run_id, out = _run(flow_board.name, recipe=str(PROJECT_ROOT / "recipes" / "ssdlite_small.toml"))
    return run_id, out, flow_board.name


@pytest.mark.vboard
def test_foreign_onnx_model_is_fine_tuned_and_quantized(prefect_harness, flow_home, flow_board):
    """recipes/digits_onnx.toml: a foreign eval-mode ONNX file (BN folded, opset 13) cut before its
    classifier, a new head trained on the board from its last conv, accuracy up; the candidate
    quantized to static int8 QDQ (batch 1), evaluated beside it and stored beside it."""
    from tasks import stages
    from tasks.paths import PROJECT_ROOT

    run_id, out = _run(flow_board.name, recipe=str(PROJECT_ROOT / "recipes" / "digits_onnx.toml"))
    base, cand, int8 = out.metrics["base"], out.metrics["candidate"], out.metrics["candidate int8"]
    assert cand["accuracy"] > base["accuracy"] + 0.2 and out.promoted
    assert abs(cand["accuracy"] - int8["accuracy"]) <= 0.03
    assert int8["model_size_bytes"] < cand["model_size_bytes"] / 2
    version = next(
        v for v in stages.registry().versions("digits-onnx", flow_board.name) if v.name == out.version
    )
    assert (version.path / "model.int8.onnx").is_file()
    verdict = version.metrics["int8"]["quantization"]["verdict"]
    assert verdict["holds"] and verdict["metric"] == "accuracy" and verdict["max_drop"] == 0.03
    import onnx

    q = onnx.load(str(version.path / "model.int8.onnx"))
    assert q.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1
    assert any(n.op_type == "QuantizeLinear" for n in q.graph.node)
    report = _artifacts(run_id)[f"odl-report-digits-onnx-{flow_board.name}"].data
    assert "int8 model for the NPU" in report and "holds up" in report


def test_rerun_is_judged_by_the_promotion_gate(promoted_run, flow_board, flow_home):
    """The issue's nightly case (a rerun with epochs=3, lr=0.01 against the current version):
    whatever its accuracy does, the decision carries the paired test (McNemar on the test set) and
    the loss guardrail of recipes/digits.toml, and the report shows both."""
    from tasks.judge.registry import Registry

    board = flow_board.name
    run_id, out = _run(board, epochs=3, lr=0.01)
    version = Registry(flow_home / "registry").versions("digits", board)[-1]
    decision = version.info["decision"]
    assert decision["reference_name"] == "v0001"
    assert decision["significance"]["test"] == "McNemar exact (one-sided)"
    rails = {r["rule"]: r for r in decision["guardrails"]}
    assert set(rails) == {"loss", "clean.accuracy"}  # the recipe's and the clean set's default guard
    rail = rails["loss"]
    assert rail["tolerance"] == 0.05 and rails["clean.accuracy"]["tolerance"] == 0.02
    cand, cur = out.metrics["candidate"], out.metrics["current"]
    assert rail["candidate"] == cand["loss"] and rail["reference"] == cur["loss"]
    significant, holds = decision["significance"]["significant"], all(r["holds"] for r in rails.values())
    assert out.promoted == (cand["accuracy"] > cur["accuracy"] and significant and holds)
    report = _artifacts(run_id)[f"odl-report-digits-{board}"].data
    assert "| gate check | verdict | figures |" in report
    assert "| guardrail loss |" in report and "| guardrail clean.accuracy |" in report
    recorded = decision_from_dict(decision)
    assert headline(recorded) in report  # the report leads with the registry entry's verdict, failing first
    assert all(c["text"] in report for c in recorded.checks)  # and gives each check's sentence


def test_a_bad_input_run_logs_one_error_line_and_no_traceback(
    prefect_harness, flow_home, flow_board, tmp_path
):
    """The issue's case: a recipe path that does not exist wrote two tracebacks at ERROR into the
    run's logs. Now one ERROR line names the problem; the traceback is at DEBUG."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    from flows.odl import OdlParams, odl

    missing = tmp_path / "no-such-recipe.toml"
    state = odl(OdlParams(board=flow_board.name, recipe=str(missing)), return_state=True)
    assert state.is_failed() and str(missing) in state.message
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()  # the run's logs reach the API in batches
    with get_client(sync_client=True) as client:
        logs = client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[state.state_details.flow_run_id]))
        )
    shown = [rec for rec in logs if rec.level >= 20]
    assert not [rec.message for rec in shown if "Traceback" in rec.message]
    errors = [rec.message for rec in logs if rec.level >= 40]
    assert len(errors) == 1 and str(missing) in errors[0], [(r.level, r.message[:200]) for r in logs]

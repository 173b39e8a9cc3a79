"""How the agent's modules stand: ``protocol`` re-exports its lower modules' names unchanged, the
ORT type -> numpy dtype map is one public function, and the commands polled over SSH load neither
numpy nor onnxruntime (only ``validate``, ``run`` and ``dataset`` import ``data_cmds``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from device_agent import board_cmds, cli, data_cmds, jobspec, messages, names, prefix_spec, protocol, wire
from device_agent.data.checks import np_dtype
from tasks.paths import PROJECT_ROOT

EXPORTS = {
    "AGENT_VERSION", "ARTIFACT_KEYS", "RUNTIME_ARTIFACTS", "BLOBS_DIR", "BLOB_TMP_PREFIX", "BLOB_TMP_RE", "BOARD_PATH_ALLOWED", "EVENT_TYPES",
    "EXIT_HELP", "NAME", "NAME_PATTERN", "NEVER_RETRY", "PROTOCOL_VERSION", "SHA256_RE", "STALE_TMP_S", "TASKS",
    "V1_VERSION_KEYS", "VERSION_KEY", "BadName", "BlobListing", "BlobRef", "BoardInfo", "DataFile", "DataRef", "Event",
    "ExitCode", "FileRef", "JobResult", "JobSpec", "KeypointsScoring", "NameRule", "PrefixSpec", "SpecError", "TeacherSpec", "TrainParams", "blob_tmp_name",
    "board_path_ok", "check_board_path", "check_version", "file_sha256", "get_field", "parse_json", "read_version", "reject_unknown", "typed_fields",
    "valid_blob_name", "valid_job_id",
}  # fmt: skip

PROBE = """
import contextlib, io, json, sys
from device_agent.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "loaded": [m for m in ("numpy", "onnxruntime", "device_agent.data_cmds")
                                           if m in sys.modules]}))
"""


def test_protocol_re_exports_every_name_of_the_modules_below_it() -> None:
    assert set(protocol.__all__) == EXPORTS
    assert all(hasattr(protocol, name) for name in EXPORTS)
    assert protocol.SpecError is wire.SpecError and protocol.get_field is wire.get_field
    assert protocol.PROTOCOL_VERSION == wire.PROTOCOL_VERSION == 2
    assert protocol.BlobRef is wire.BlobRef is jobspec.BlobRef and protocol.JobSpec is jobspec.JobSpec
    assert protocol.TASKS is jobspec.TASKS and protocol.ARTIFACT_KEYS is jobspec.ARTIFACT_KEYS
    assert protocol.Event is messages.Event and protocol.PrefixSpec is prefix_spec.PrefixSpec
    assert protocol.NAME is names.NAME and protocol.valid_job_id is names.valid_job_id


def test_a_prefix_spec_reads_its_model_as_a_blob_ref() -> None:
    d = {"model": {"sha256": "a" * 64, "size": 3}, "inputs": ["x"], "output": "feat"}
    spec = protocol.PrefixSpec.from_dict(d)
    assert spec.model == protocol.BlobRef("a" * 64, 3) and spec.dtype == "float32" and spec.store == "auto"
    with pytest.raises(protocol.SpecError, match=r"prefix\.model\.sha256"):
        protocol.PrefixSpec.from_dict(d | {"model": {"sha256": "nope", "size": 3}})


@pytest.mark.parametrize(
    ("ort_type", "dtype"),
    [("tensor(float)", np.float32), ("tensor(float16)", np.float16), ("tensor(int64)", np.int64),
     ("tensor(uint8)", np.uint8), ("tensor(bool)", np.bool_), ("tensor(string)", np.float32)],
)  # fmt: skip
def test_np_dtype_maps_ort_types_and_falls_back_to_float32(ort_type: str, dtype: type) -> None:
    assert np_dtype(ort_type) == np.dtype(dtype)


def test_each_command_runs_its_function_and_its_help_is_its_docstring() -> None:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    helps = {c.dest: c.help for c in sub._choices_actions}
    assert set(helps) == set(cli.COMMANDS) | set(cli.DATA_COMMANDS)
    assert set(cli.DATA_COMMANDS) == set(data_cmds.COMMANDS) and not set(cli.COMMANDS) & set(
        data_cmds.COMMANDS
    )
    for name in helps:
        func = cli.command(name)
        assert func is (data_cmds.COMMANDS[name] if name in cli.DATA_COMMANDS else cli.COMMANDS[name])
        if name != "info":  # info's help is its own text
            assert helps[name] == (func.__doc__ or "").split("\n")[0], name
    assert board_cmds.DATASET_HELP == (data_cmds.cmd_dataset.__doc__ or "").split("\n")[0]


def _probe(python: Path, root: Path, *argv: str) -> dict[str, object]:
    proc = subprocess.run(
        [str(python), "-c", PROBE, "--root", str(root), *argv],
        capture_output=True, text=True, env={"PYTHONPATH": str(PROJECT_ROOT), "PATH": "/usr/bin:/bin"},
        timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_light_commands_load_neither_numpy_nor_onnxruntime(board_python: Path, tmp_path: Path) -> None:
    root = tmp_path / "odl"
    job = root / "jobs" / "j1"
    job.mkdir(parents=True)
    (job / "job.json").write_text("{}")
    (root / "datasets" / "d").mkdir(parents=True)
    for argv in (["blobs"], ["put-blob", str(root / "blobs" / "x"), "0" * 64], ["start", str(job)],
                 ["status", str(job)], ["cancel", str(job)], ["jobs"], ["models", "r"],
                 ["install-model", "r", "v1", "model.onnx=" + "a" * 64], ["add-file", "datasets/new", "f.npz"]):  # fmt: skip
        assert _probe(board_python, root, *argv)["loaded"] == [], argv
    assert _probe(board_python, root, "dataset", "datasets/d") == {
        "code": 0, "loaded": ["numpy", "device_agent.data_cmds"]
    }  # fmt: skip
    assert _probe(board_python, root, "validate", str(job))["loaded"] == ["numpy", "device_agent.data_cmds"]

"""Wire types of protocol.py: one spelling of the protocol version, BoardInfo and BlobListing parsed
with the bad field named, unknown fields of an answer ignored."""

from __future__ import annotations

import json

import pytest

from device_agent.protocol import (
    PROTOCOL_VERSION,
    BlobListing,
    BoardInfo,
    Event,
    JobResult,
    SpecError,
    blob_tmp_name,
)

INFO = {
    "protocol_version": PROTOCOL_VERSION, "agent_version": "0.2.0", "python_version": "3.11.2",
    "numpy_version": "2.1.0", "ort_version": "1.19.2", "training_api": True, "training_api_error": "",
    "mem_total_mb": 3900.5, "mem_available_mb": 2100.0, "disk_free_mb": 800.0, "root": "/home/odl/odl",
    "cpu_count": 2, "machine": "aarch64", "torch_loaded": False, "mem_limit_mb": 3072.0,
}  # fmt: skip
RESULT = {"job_id": "j", "status": "finished", "exit_code": 0, "steps": 3, "epochs_done": 1, "duration_s": 1.0,
          "peak_rss_mb": 100.0, "metrics": {}, "outputs": {}}  # fmt: skip


def test_board_info_round_trip_ignores_unknown_fields() -> None:
    info = BoardInfo.from_dict(INFO | {"gpu": "none", "future_field": {"x": 1}})
    assert info.to_dict() == INFO and info.mem_available_mb == 2100.0 and info.training_api is True
    older = {k: v for k, v in INFO.items() if k != "mem_limit_mb"}  # an agent from before the field
    assert BoardInfo.from_dict(older).mem_limit_mb is None
    assert BoardInfo.from_dict(INFO | {"mem_limit_mb": None}).mem_limit_mb is None  # no cgroup limit


@pytest.mark.parametrize(
    ("key", "value", "text"),
    [
        ("mem_available_mb", "lots", "field 'info.mem_available_mb': expected int or float"),
        ("ort_version", KeyError, "field 'info.ort_version': expected a value of type str"),
        ("training_api", "yes", "field 'info.training_api': expected bool"),
        ("cpu_count", True, "field 'info.cpu_count': expected int"),
        ("cpu_count", 0, "field 'info.cpu_count': expected an integer >= 1"),
        ("disk_free_mb", -1.0, "field 'info.disk_free_mb': expected a number >= 0"),
        ("mem_limit_mb", "4G", "field 'info.mem_limit_mb': expected int or float"),
        ("mem_limit_mb", -1, "field 'info.mem_limit_mb': expected a number >= 0"),
        ("protocol_version", "2", "field 'info.protocol_version': expected int"),
    ],
)
def test_board_info_names_the_bad_field(key: str, value: object, text: str) -> None:
    raw = {k: v for k, v in INFO.items() if k != key} if value is KeyError else INFO | {key: value}
    with pytest.raises(SpecError, match=text) as err:
        BoardInfo.from_dict(raw)
    assert err.value.field == f"info.{key}"


def test_board_info_of_another_protocol_parses_so_the_host_can_name_it() -> None:
    assert BoardInfo.from_dict(INFO | {"protocol_version": 99}).protocol_version == 99


def test_blob_listing() -> None:
    sha = "a" * 64
    listing = BlobListing.from_dict({"blobs": {sha: 10}, "free": 2**30, "extra": 1})
    assert listing == BlobListing({sha: 10}, 2**30) and listing.to_dict() == {
        "blobs": {sha: 10},
        "free": 2**30,
    }
    for bad, field in (({"../x": 1}, "blobs.blobs"), ({sha: -1}, f"blobs.blobs.{sha}")):
        with pytest.raises(SpecError) as err:
            BlobListing.from_dict({"blobs": bad, "free": 0})
        assert err.value.field == field
    with pytest.raises(SpecError, match="blobs.free"):
        BlobListing.from_dict({"blobs": {}, "free": -5})


def test_protocol_version_has_one_spelling_on_the_wire(digits_job) -> None:
    spec, _ = digits_job("spelling")
    event = json.loads(Event("step", "j", 0, {"step": 1}).to_json())
    result = JobResult.from_dict(RESULT).to_dict()
    for wire in (spec.to_dict(), event, result, INFO):
        assert wire["protocol_version"] == PROTOCOL_VERSION
        assert not {"protocol", "v"} & set(wire)


def test_protocol_1_files_read_as_version_1() -> None:
    old = '{"v": 1, "type": "step", "ts": 1.0, "job_id": "j", "seq": 0, "data": {}}'
    assert Event.from_json(old).protocol_version == 1
    assert JobResult.from_dict(RESULT | {"v": 1}).protocol_version == 1
    assert JobResult.from_dict(RESULT).protocol_version == PROTOCOL_VERSION


def test_blob_tmp_name() -> None:
    sha = "0" * 64
    assert blob_tmp_name(sha, "0123abcd") == f".tmp-{sha}-0123abcd"
    with pytest.raises(SpecError, match="sha256"):
        blob_tmp_name("../" + sha[3:], "0123abcd")
    with pytest.raises(SpecError, match="nonce"):
        blob_tmp_name(sha, "x/y")

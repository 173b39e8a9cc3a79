"""What the files of an autograd job leave out, appended to them again on the board.

An autograd job uploads each weight once (``tasks.prepare.runtimes.autograd.shared``): the train
step holds its frozen tensors (a frozen-prefix job's prefix model those before the cut), the
checkpoint the trainable ones, and the inference template and the eval step leave out what an
earlier file holds (the eval step its nodes the template holds too). ``step.json``'s ``shared``
table gives, for each file that leaves something out (by artifact key), ``ranges``: ``[source,
offset, length]``, bytes of the artifact ``source`` that are whole nodes and initializers of its
graph, appended as they are; and ``tensors``: ``[name, ONNX data type, dims, source, offset,
length]``, a tensor whose data are ``length`` bytes at ``offset`` of ``source`` (:data:`STATE`: the
training state's tensor of that name, little-endian float32). ``files`` names each artifact the
table involves relative to ``step.json``'s folder, which a prepared folder on the host resolves
them by (the board by the job's blobs).

A protobuf parser merges a message field that occurs twice and appends to a repeated one: a model's
bytes followed by a second ``graph`` field holding nodes and initializers only are the model with
those nodes and initializers (ONNX Runtime sorts the nodes). So the board writes them without
onnx: the ranges as they are, each tensor a ``TensorProto`` of dims, data type, name and raw data
in a few varints (:func:`assembled`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

STATE = "checkpoint"  # a source: the training state's tensor (the trainable ones)
MODEL_GRAPH, GRAPH_INITIALIZER = 7, 5  # ModelProto.graph, GraphProto.initializer
TENSOR_DIMS, TENSOR_TYPE, TENSOR_NAME, TENSOR_RAW = 1, 2, 8, 9  # TensorProto's fields
VARINT, BYTES = 0, 2  # wire types


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _head(field: int, length: int) -> bytes:
    """The key and length of a length-delimited field."""
    return _varint(field << 3 | BYTES) + _varint(length)


def tensor_head(name: str, data_type: int, dims: Iterable[int], length: int) -> bytes:
    """A ``TensorProto``'s bytes up to its raw data (which ``length`` bytes follow)."""
    parts = [_varint(TENSOR_DIMS << 3 | VARINT) + _varint(int(d)) for d in dims]
    parts.append(_varint(TENSOR_TYPE << 3 | VARINT) + _varint(int(data_type)))
    encoded = name.encode()
    parts.append(_head(TENSOR_NAME, len(encoded)) + encoded)
    parts.append(_head(TENSOR_RAW, length))
    return b"".join(parts)


def _read(files: Mapping[str, Any], source: str, offset: int, length: int, handles: dict[str, Any],
          what: str) -> bytes:  # fmt: skip
    if source not in files:
        raise ValueError(f"{what}: no artifact {source!r} to read from")
    if source not in handles:
        handles[source] = open(files[source], "rb")  # noqa: SIM115 - closed by assembled
    handles[source].seek(int(offset))
    raw = handles[source].read(int(length))
    if len(raw) != int(length):
        raise ValueError(f"{what}: {len(raw)} bytes of {source} where {length} are expected")
    return raw


def _tensor(entry: list[Any], files: Mapping[str, Any], state: Mapping[str, np.ndarray] | None,
            handles: dict[str, Any]) -> list[bytes]:  # fmt: skip
    """A ``tensors`` entry as an initializer field: its key and length, its head, its data."""
    name, data_type, dims, source, offset, length = entry
    if source == STATE:
        if state is None or name not in state:
            raise ValueError(f"{name}: no tensor of that name in the training state")
        raw = np.ascontiguousarray(state[name], dtype="<f4").tobytes()
        if len(raw) != int(length):
            raise ValueError(f"{name}: {len(raw)} bytes in the training state where {length} are expected")
    else:
        raw = _read(files, source, offset, length, handles, name)
    head = tensor_head(name, int(data_type), dims, len(raw))
    return [_head(GRAPH_INITIALIZER, len(head) + len(raw)), head, raw]


def assembled(path: str | Path, table: Mapping[str, Any], files: Mapping[str, Any],
              state: Mapping[str, np.ndarray] | None = None) -> bytes:  # fmt: skip
    """The model at ``path`` with what its ``table`` says it leaves out appended, read from the
    artifacts ``files`` (by key) or taken from ``state``."""
    handles: dict[str, Any] = {}
    try:
        parts = [_read(files, *r, handles, f"{Path(path).name}'s range") for r in table.get("ranges", [])]
        for entry in table.get("tensors", []):
            parts += _tensor(entry, files, state, handles)
    finally:
        for fh in handles.values():
            fh.close()
    model = Path(path).read_bytes()
    if not parts:
        return model
    return b"".join([model, _head(MODEL_GRAPH, sum(len(p) for p in parts)), *parts])


def shared_files(step_json: str | Path, spec: Mapping[str, Any]) -> dict[str, Path]:
    """The artifacts ``spec``'s ``shared`` table involves, as files beside ``step_json`` (a
    prepared folder on the host)."""
    folder = Path(step_json).parent
    return {key: folder / rel for key, rel in spec.get("shared", {}).get("files", {}).items()}


def left_out(spec: Mapping[str, Any], key: str) -> dict[str, Any]:
    """What the artifact ``key`` leaves out: its ``shared`` table (empty when it leaves out nothing)."""
    return spec.get("shared", {}).get(key) or {}


def graph_source(path: str | Path, key: str, spec: Mapping[str, Any], files: Mapping[str, Any],
                 state: Mapping[str, np.ndarray] | None = None) -> str | bytes:  # fmt: skip
    """What an ONNX Runtime session of the artifact ``key`` at ``path`` loads: its path when it leaves
    nothing out, else its bytes with what it leaves out (:func:`assembled`)."""
    table = left_out(spec, key)
    return assembled(path, table, files, state) if table else str(path)


def whole_model(path: str | Path) -> bytes:
    """The model file ``path`` of a prepared folder with the tensors it leaves out, as the board
    loads it: the ``step.json`` beside it names them (none for a file it does not list, or a folder
    without one: ONNX Runtime's artifacts)."""
    path = Path(path)
    step = path.parent / "step.json"
    spec = json.loads(step.read_text()) if step.is_file() else {}
    files = shared_files(step, spec)
    key = next((k for k, p in files.items() if p.resolve() == path.resolve()), None)
    source = graph_source(path, key, spec, files) if key is not None else str(path)
    return source if isinstance(source, bytes) else path.read_bytes()

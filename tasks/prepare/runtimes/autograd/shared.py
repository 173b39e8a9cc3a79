"""Each weight an autograd job uploads, once.

The files of a job held the same tensors several times: every frozen tensor was an initializer of
the train step, of the eval step and of the inference template (a frozen-prefix job's prefix model
holds those before the cut), every trainable one was in the checkpoint and the template, and the
eval step repeated the template's nodes. smp's U-Net on MobileNetV2 (6.6 M parameters, all
trained) uploaded 55.8 MB of artifacts where ONNX Runtime's took 27.8.

So a job's files are written in order (the prefix model, the train step, the template, the eval
step) and each leaves out what an earlier one holds: an initializer (of at least :data:`THRESHOLD`
bytes) or, in the eval step, a node whose serialised bytes are the same as one there (kept as byte
ranges of that file, runs of adjacent entries joined; the eval step's tensors named as the
template's first), a tensor of the same type, shape and data
under another name (its data's offset), and the template every trainable tensor (the state's: the
checkpoint's at first). ``step.json``'s ``shared`` table says what each file leaves out and where;
the board appends it as it loads the file (:mod:`device_agent.runtimes.weights`; ONNX Runtime sorts
the nodes). The prefix model and the train step of a full job leave nothing out: each loads alone;
the template leaves out no node: the inference model the board writes stays a whole, sorted model.
The template serves the full and the split jobs: it leaves out what both find elsewhere.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from device_agent.runtimes.weights import STATE
from tasks.errors import ArtifactError
from tasks.prepare.manifest import file_entry
from tasks.prepare.runtimes.autograd.graph_eval import SCOPE

# bytes: a smaller initializer stays in its file (a tensor entry costs ~60 bytes of step.json:
# name, type, dims, source, offset, length; its TensorProto ~30 bytes besides its data)
THRESHOLD = 64
OWNERS = ("prefix_model", "train_step")  # each job's files before the template; the eval step after it
TEMPLATE, EVAL = "inference_template", "eval_step"
NODE, INITIALIZER, RAW = 1, 5, 9  # GraphProto.node, GraphProto.initializer, TensorProto.raw_data
Content = tuple[int, tuple[int, ...], bytes]


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at


def _fields(data: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, field start, value start, end) of each field of the message in
    ``data[start:end]``."""
    at = start
    while at < end:
        first = at
        key, at = _varint(data, at)
        wire = key & 7
        if wire == 0:
            _, nxt = _varint(data, at)
        elif wire == 1:
            nxt = at + 8
        elif wire == 2:
            length, at = _varint(data, at)
            nxt = at + length
        elif wire == 5:
            nxt = at + 4
        else:
            raise ArtifactError(f"a serialised ONNX model with protobuf wire type {wire}")
        yield key >> 3, wire, first, at, nxt
        at = nxt


def graph_entries(data: bytes) -> list[tuple[int, int, int, int]]:
    """(field number, field start, value start, end) of each node and initializer of the serialised
    model ``data``, in order (each kind in its graph's order)."""
    found = []
    for number, wire, _, start, end in _fields(data, 0, len(data)):
        if number == 7 and wire == 2:  # ModelProto.graph
            found += [(n, first, s, e) for n, w, first, s, e in _fields(data, start, end)
                      if w == 2 and n in (NODE, INITIALIZER)]  # fmt: skip
    return found


def raw_offsets(data: bytes) -> list[tuple[int, int] | None]:
    """``(offset, length)`` of each initializer's raw data in the serialised model ``data``, in the
    graph's order (None for one stored otherwise)."""
    found: list[tuple[int, int] | None] = []
    for number, _, start, end in graph_entries(data):
        if number == INITIALIZER:
            raw = [(s, e - s) for n, w, _, s, e in _fields(data, start, end) if n == RAW and w == 2]
            found.append(raw[-1] if raw else None)
    return found


def _content(init: Any) -> Content | None:
    if init.data_location == onnx.TensorProto.EXTERNAL or len(init.raw_data) < THRESHOLD:
        return None
    return init.data_type, tuple(init.dims), init.raw_data


@dataclass
class _Held:
    """What a job's files written so far hold: each node's and large initializer's serialised bytes
    (-> its field's source, start, end) and each large tensor's data (-> source, offset, length)."""

    entries: dict[tuple[int, bytes], tuple[str, int, int]] = field(default_factory=dict)
    data: dict[Content, tuple[str, int, int]] = field(default_factory=dict)

    def add(self, key: str, data: bytes, model: Any) -> None:
        inits = iter(model.graph.initializer)
        raws = iter(raw_offsets(data))
        for number, first, start, end in graph_entries(data):
            init, raw = (next(inits), next(raws)) if number == INITIALIZER else (None, None)
            if number == NODE or (init is not None and _content(init) is not None):
                self.entries.setdefault((number, data[start:end]), (key, first, end))
            if init is not None and raw is not None and _content(init) is not None:
                self.data.setdefault(_content(init), (key, *raw))


@dataclass
class _Out:
    """What one file leaves out, by (field number, index) of its nodes and initializers: a byte range
    of another file (the whole node or initializer), or a tensor to encode (another file's data
    under this file's name, or the state's)."""

    items: dict[tuple[int, int], tuple[str, Any]] = field(default_factory=dict)

    def indices(self, number: int) -> set[int]:
        return {i for n, i in self.items if n == number}

    def only(self, inits: set[int]) -> _Out:
        """The initializers ``inits`` of what it leaves out (and its nodes)."""
        return _Out({(n, i): v for (n, i), v in self.items.items() if n == NODE or i in inits})

    def table(self) -> dict[str, Any]:
        spans = sorted(v for kind, v in self.items.values() if kind == "span")
        ranges: list[list[Any]] = []
        for source, start, end in spans:  # runs of adjacent entries: one range each
            if ranges and ranges[-1][0] == source and ranges[-1][1] + ranges[-1][2] == start:
                ranges[-1][2] = end - ranges[-1][1]
            else:
                ranges.append([source, start, end - start])
        return {"ranges": ranges, "tensors": [v for kind, v in self.items.values() if kind == "tensor"]}


def _left_out(data: bytes, model: Any, held: _Held, state: set[str], nodes: bool) -> _Out:
    """What the file serialised as ``data`` (parsed: ``model``) may leave out of what ``held``
    holds (its nodes too when ``nodes``), and its tensors in ``state``."""
    out, inits, count = _Out(), list(model.graph.initializer), {NODE: 0, INITIALIZER: 0}
    for number, _, start, end in graph_entries(data):
        index, count[number] = count[number], count[number] + 1
        init = inits[index] if number == INITIALIZER else None
        key = (number, data[start:end])
        if init is not None and init.name in state:
            out.items[number, index] = ("tensor", [init.name, init.data_type, list(init.dims), STATE, 0,
                                                   len(init.raw_data)])  # fmt: skip
        elif (number == NODE and not nodes) or (init is not None and _content(init) is None):
            continue
        elif key in held.entries:
            out.items[number, index] = ("span", held.entries[key])
        elif init is not None and _content(init) in held.data:
            out.items[number, index] = ("tensor", [init.name, init.data_type, list(init.dims),
                                                   *held.data[_content(init)]])  # fmt: skip
    return out


def _rewritten(path: Path, model: Any, out: _Out) -> bytes:
    """Write ``model`` without what ``out`` leaves out to ``path``; its bytes."""
    for kind, gone in (
        (model.graph.node, out.indices(NODE)),
        (model.graph.initializer, out.indices(INITIALIZER)),
    ):
        kept = [x for i, x in enumerate(kind) if i not in gone]
        del kind[:]
        kind.extend(kept)
    data = model.SerializeToString()
    path.write_bytes(data)
    return data


def _named_as(model: Any, template: Any) -> None:
    """The eval step's tensors named as the template names them where they are the template's (the
    eval step from the inference export scopes them as the train step: ``/m/layer/Conv_output_0``
    for the template's ``/layer/Conv_output_0``, :data:`.graph_eval.SCOPE`): its nodes are then the
    template's, byte for byte. A name the eval step already has stays."""
    theirs = {o for n in template.graph.node for o in n.output}
    ours = {t for n in model.graph.node for t in [*n.input, *n.output]} | {i.name for i in model.graph.input}
    renamed = {o: o[len(SCOPE) :] for n in model.graph.node for o in n.output
               if o.startswith(SCOPE + "/") and o[len(SCOPE) :] in theirs and o[len(SCOPE) :] not in ours}  # fmt: skip
    if not renamed:
        return
    _read_as(model.graph.node, renamed)
    for node in model.graph.node:
        node.output[:] = [renamed.get(o, o) for o in node.output]
    for value in [*model.graph.value_info, *model.graph.output]:
        value.name = renamed.get(value.name, value.name)


def _read_as(nodes: Any, renamed: dict[str, str]) -> None:
    """``nodes`` reading each name of ``renamed`` under its new name, in the graphs of their
    attributes too (an If's branches read the outer scope's tensors)."""
    for node in nodes:
        node.input[:] = [renamed.get(i, i) for i in node.input]
        for attr in node.attribute:
            for inner in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                _read_as(inner.node, renamed)
                for out in inner.output:  # a branch may return an outer tensor as it is
                    out.name = renamed.get(out.name, out.name)


def _load(path: Path) -> tuple[bytes, Any]:
    data = path.read_bytes()
    return data, onnx.load_from_string(data)


def share(out_dir: Path, jobs: list[dict[str, Any]], trainable: list[str]) -> None:
    """Rewrite the files of each job (its manifest ``files`` entries: the full job's, then the split
    one's, which share the template) so that each weight is held once, and write each job's
    ``shared`` table into its ``step.json``; the entries of the files rewritten are updated."""
    out_dir = Path(out_dir)
    held, tables = [_Held() for _ in jobs], [{} for _ in jobs]
    for files, have, table in zip(jobs, held, tables, strict=True):
        for key in (k for k in OWNERS if k in files):
            path = out_dir / files[key]["path"]
            data, model = _load(path)
            out = _left_out(data, model, have, set(), nodes=False)
            if out.items:  # e.g. a tensor the prefix and the train step both hold: its entry follows
                data, table[key] = _rewritten(path, model, out), out.table()
                files[key] = file_entry(path, files[key]["path"])
            have.add(key, data, model)
    rel = jobs[0][TEMPLATE]["path"]
    data, template = _load(out_dir / rel)
    each = [_left_out(data, template, have, set(trainable), nodes=False) for have in held]
    common = set.intersection(*(out.indices(INITIALIZER) for out in each))  # what every job finds elsewhere
    if not set(trainable) <= {template.graph.initializer[i].name for i in common}:
        raise ArtifactError("inference template: a trainable tensor is not one of its initializers")
    for table, out in zip(tables, each, strict=True):
        table[TEMPLATE] = out.only(common).table()
    data = _rewritten(out_dir / rel, template, each[0].only(common))
    for files, have, table in zip(jobs, held, tables, strict=True):
        files[TEMPLATE] = file_entry(out_dir / rel, rel)
        have.add(TEMPLATE, data, template)
        path = out_dir / files[EVAL]["path"]
        _, model = _load(path)
        _named_as(model, template)
        eval_data = model.SerializeToString()
        out = _left_out(eval_data, model, have, set(), nodes=True)
        if out.items:
            _rewritten(path, model, out)
            files[EVAL], table[EVAL] = file_entry(path, files[EVAL]["path"]), out.table()
        _write_table(out_dir, files, table)


def _write_table(out_dir: Path, files: dict[str, Any], table: dict[str, Any]) -> None:
    """The job's ``shared`` table into its step.json (read by the board alone: no indentation)."""
    step = out_dir / files["step"]["path"]
    used = set(table) | {r[0] for t in table.values() for r in t["ranges"]}
    used |= {e[3] for t in table.values() for e in t["tensors"]} - {STATE}
    where = {
        k: Path(os.path.relpath(out_dir / files[k]["path"], step.parent)).as_posix() for k in sorted(used)
    }
    spec = {**json.loads(step.read_text()), "shared": {**table, "files": where}}
    step.write_text(json.dumps(spec, separators=(",", ":")))
    files["step"] = file_entry(step, files["step"]["path"])

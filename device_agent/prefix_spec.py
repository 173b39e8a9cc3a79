"""``job.json``'s ``prefix``: the frozen prefix a job runs once per sample (frozen-prefix caching).

The job's artifacts are then the training artifacts of the suffix, whose first input is the
prefix's output; the agent feeds it from the cache (:mod:`device_agent.data.prefix_cache`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from device_agent.wire import BlobRef, SpecError, get_field, reject_unknown

CACHE_DTYPES = ("float32", "float16")
CACHE_STORES = ("auto", "ram", "disk")


@dataclass(frozen=True)
class PrefixSpec:
    """The prefix model (a blob), its inputs, its one output (the suffix's input), and how the
    agent keeps the outputs: ``dtype`` float32 | float16, ``store`` auto | ram | disk."""

    model: BlobRef
    inputs: tuple[str, ...]
    output: str
    dtype: str = "float32"
    store: str = "auto"

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model.to_dict(), "inputs": list(self.inputs), "output": self.output,
                "dtype": self.dtype, "store": self.store}  # fmt: skip

    @classmethod
    def from_dict(cls, d: object, where: str = "prefix") -> PrefixSpec:
        if not isinstance(d, dict):
            raise SpecError(where, "an object with model, inputs, output, dtype and store", d)
        reject_unknown(d, {"model", "inputs", "output", "dtype", "store"}, where)
        inputs = get_field(d, "inputs", list, where)
        if not inputs or not all(isinstance(i, str) and i for i in inputs):
            raise SpecError(f"{where}.inputs", "a non-empty list of input names", inputs)
        output = get_field(d, "output", str, where)
        if not output:
            raise SpecError(f"{where}.output", "the name of the prefix's output", output)
        dtype = get_field(d, "dtype", str, where, "float32")
        if dtype not in CACHE_DTYPES:
            raise SpecError(f"{where}.dtype", " or ".join(repr(x) for x in CACHE_DTYPES), dtype)
        store = get_field(d, "store", str, where, "auto")
        if store not in CACHE_STORES:
            raise SpecError(f"{where}.store", " or ".join(repr(x) for x in CACHE_STORES), store)
        return cls(BlobRef.from_dict(d.get("model"), f"{where}.model"), tuple(inputs), output, dtype, store)

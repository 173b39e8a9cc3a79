"""Foreign-ONNX benchmark: files exported by other tools, through an ONNX-in recipe's ``prepare``.

Three small models (torchvision mobilenet_v3_small and resnet18, timm's mobilenetv3_small_100;
random init, BatchNorm statistics calibrated) are exported the ways users' files are made:
``torch.onnx.export`` (TorchScript) in eval mode at opset 13 and 17 with BatchNorm folded (constant
folding on) and not, the dynamo exporter (opset 18) with a fixed batch and with a dynamic one, and
onnxslim's output of the folded opset-17 file. Each is cut before its classifier (the input of the last Gemm/MatMul, found in the file),
given a new 10-class head, trained from its last feature layer (``last-conv+classifier``), and
prepared with validation and the join rehearsal; the prefix cache stays on.

    .venv/bin/python bench/foreign_onnx.py          # 21 files, ~3 min on 2 cores
    .venv/bin/python bench/foreign_onnx.py --runtime autograd   # the same files, the autograd runtime
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import table, write_results  # noqa: E402
from tests.corpus.generator import outcome  # noqa: E402

SIZE = 64
MODELS = ("tv:mobilenet_v3_small", "tv:resnet18", "timm:mobilenetv3_small_100")
# the smoke test's: one small model (~2 s of prepare a file) in four files (not-folded, folded, slimmed, fixed batch)
QUICK = (("tv:mobilenet_v3_small",), ("ts13", "ts17-folded", "dynamo18", "onnxslim17"))
EXPORTS = ("ts13-folded", "ts13", "ts17-folded", "ts17", "dynamo18", "dynamo18-dynamic", "onnxslim17")


def build(name: str, data: Path):
    """The model, random init with BatchNorm statistics of ``data``'s images."""
    from bench.zoo import calibrate_module

    source, model_name = name.split(":")
    if source == "tv":
        import torchvision

        model = torchvision.models.get_model(model_name, weights=None, num_classes=1000)
    else:
        import timm

        model = timm.create_model(model_name, pretrained=False)
    calibrate_module(model, data, data.with_suffix(".pt"))
    return model.eval()


def export(model, how: str, out: Path) -> Path:
    """``model`` exported as ``how`` says (see EXPORTS) to ``out``."""
    import onnx
    import torch

    x = torch.randn(1, 3, SIZE, SIZE)
    if how.startswith("dynamo18"):
        shapes = {"x": {0: torch.export.Dim("batch", min=1, max=1024)}} if how.endswith("dynamic") else None
        torch.onnx.export(model, (x,), str(out), dynamo=True, opset_version=18, input_names=["input"],
                          dynamic_shapes=shapes)  # fmt: skip
        return out
    opset = 13 if how.startswith("ts13") else 17
    folded = how.endswith("folded") or how == "onnxslim17"
    buf = io.BytesIO()
    torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=opset, do_constant_folding=folded,
                      training=torch.onnx.TrainingMode.EVAL, input_names=["input"])  # fmt: skip
    proto = onnx.load_from_string(buf.getvalue())
    if how == "onnxslim17":
        import onnxslim

        proto = onnxslim.slim(proto)
    onnx.save(proto, str(out))
    return out


def classifier_input(path: Path) -> str:
    """The data input of the last Gemm/MatMul with a weight: where the new head goes."""
    import onnx

    graph = onnx.load(str(path)).graph
    inits = {i.name for i in graph.initializer}
    last = [n for n in graph.node if n.op_type in ("Gemm", "MatMul") and any(i in inits for i in n.input)][-1]
    return next(i for i in last.input if i not in inits)


def prepare_file(path: Path, work: Path, runtime: str = "ort-training") -> dict:
    """An ONNX-in recipe for ``path`` (cut at its classifier input, new head) through prepare under
    ``runtime``."""
    import numpy as np

    from tasks.errors import PipelineError
    from tasks.prepare.pipeline import prepare
    from tasks.recipe.load import load_recipe

    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        np.savez(work / f"{split}.npz", x=rng.standard_normal((16, 3, SIZE, SIZE), dtype=np.float32),
                 y=rng.integers(0, 10, 16))  # fmt: skip
    cut = classifier_input(path)
    (work / "recipe.toml").write_text(
        f'name = "foreign"\ntask = "classification"\n[model]\nonnx = "{path}"\ncut_at = ["{cut}"]\n'
        f'input_shape = [3, {SIZE}, {SIZE}]\ninput_names = ["input"]\noutput_names = ["logits"]\n'
        '[head]\nnum_classes = 10\n[trainable]\nstrategy = "last-conv+classifier"\n[loss]\nkind = "cross-entropy"\n'
        f'[training]\nruntime = "{runtime}"\nbatch_size = 4\nepochs = 1\n[data]\ntrain = "train.npz"\ntest = "test.npz"\n'
    )
    start = time.perf_counter()
    try:
        done = prepare(load_recipe(work / "recipe.toml"), work / "prepared")
    except PipelineError as exc:
        kind, message = outcome(exc)
        return {"result": kind, "message": message, "seconds": round(time.perf_counter() - start, 1)}
    cache = done.manifest["prefix_cache"]
    return {
        "result": "pass",
        "trainable": done.manifest["trainable_count"],
        "prefix_cache": "on" if cache.get("enabled") else f"off: {cache.get('reason', '')[:60]}",
        "join": "rehearsed" if isinstance(done.validation["checks"].get("join_matches_full"), dict) else "-",
        "seconds": round(time.perf_counter() - start, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="result JSON (default bench/results/foreign_onnx.json)")
    ap.add_argument("--quick", action="store_true", help=f"{QUICK[0][0]} as {', '.join(QUICK[1])} only (CI)")
    ap.add_argument(
        "--runtime",
        choices=("ort-training", "autograd"),
        default="ort-training",
        help="training.runtime of the recipes (default ort-training)",
    )
    args = ap.parse_args()
    models, exports = QUICK if args.quick else (MODELS, EXPORTS)
    import numpy as np

    rows = []
    with tempfile.TemporaryDirectory(prefix="odl-foreign-") as tmp:
        root = Path(tmp)
        calib = root / "calib.npz"
        np.savez(calib, x=np.random.default_rng(1).standard_normal((8, 3, SIZE, SIZE), dtype=np.float32))
        for name in models:
            model = build(name, calib)
            for how in exports:
                work = root / f"{name.replace(':', '-')}-{how}"
                work.mkdir()
                row = {"model": name, "export": how}
                try:
                    path = export(model, how, work / "model.onnx")
                except Exception as exc:  # noqa: BLE001 - an exporter that fails here is a row, not ours
                    row.update(
                        result="export failed",
                        message=f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}",
                    )
                else:
                    row.update(prepare_file(path, work, args.runtime))
                rows.append(row)
                print(
                    f"{name:28s} {how:12s} {row['result']:14s} {row.get('message', row.get('prefix_cache', ''))[:110]}",
                    flush=True,
                )
    counts = {k: sum(r["result"] == k for r in rows) for k in ("pass", "specific", "raw", "export failed")}
    name = "foreign_onnx" if args.runtime == "ort-training" else f"foreign_onnx_{args.runtime}"
    path = write_results(
        name, {"runtime": args.runtime, "files": len(rows), **counts, "rows": rows}, args.out
    )
    for r in rows:
        r["short"] = (r.get("message") or "")[:90]
    print(table(rows, [("model", "model"), ("export", "exported as"), ("result", "result"), ("trainable", "trainable"),
                       ("prefix_cache", "prefix cache"), ("join", "join"), ("seconds", "s"), ("short", "message")]))  # fmt: skip
    print(f"figures: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

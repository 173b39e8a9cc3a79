"""Preparation cost of the two training runtimes: every case of the corpora prepared under
``ort-training`` and under ``autograd``, each in its own child process (nothing shared or warm
between them), with the wall time of the whole ``prepare`` (validation included), validation's
board peak estimate (``board_peak_estimate_mb``) and pass / specific / raw under each; the ratios
autograd/ORT per model, their median and worst over the models both pass, the models over 120 s
under autograd and the models one runtime passes and the other does not.

The cases are the corpus benchmarks' own, written by their own writers (generated: the first
examples of tests/corpus/generator.py and tests/corpus/families.py at seed 1; sequences; tokens;
segmentation; keypoints; detection: the SSD-Lite recipes at 96 px, recipes/ssdlite_small.toml and
the wiki-style loss of recipes/ssdlite_wiki_small.toml; timm: a family's smallest model at the smallest size its forward takes;
transformers, skipped when ``transformers`` is not installed); the runtime is the override
``training.runtime=R`` of ``odl prepare --set``. ``--measure K`` also trains K passing models a few
steps with the board agent in the board venv (bench/memory.py's way) and records its peak RSS.

    .venv/bin/python bench/prepare_cost.py --quick 12 --seed 0     # a seeded sample across corpora
    .venv/bin/python bench/prepare_cost.py --corpora sequences      # one corpus, every case
    .venv/bin/python bench/prepare_cost.py --corpora detection --models ssdlite-wiki
    .venv/bin/python bench/prepare_cost.py --corpora sequences --models conv1d-bn,gru-mean --measure 1
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import BOARD_VENV, child_json, install_job, run_agent, table, write_results  # noqa: E402
from bench._corpus import prepared_row, write_sequence_case  # noqa: E402
from bench._sides import RUNTIMES, summary  # noqa: E402

CHILD_TIMEOUT_S = 1200
SLOW_S = 120
GENERATED_EXAMPLES, GENERATED_SEED = 10, 1
MEASURE_STEPS = 8
SHORT = {"ort-training": "ort", "autograd": "ag"}
# detection: SSD-Lite MobileNetV2 at 96 px with its multibox loss in forward, as recipes/ssdlite.py
# writes it (argsort ranks, a float mask) and as the STM32 wiki writes it (boolean-mask selection,
# -inf written by indexing, a sort of the sort: recipes/ssdlite_wiki.py)
DETECTORS = {"ssdlite": "ssdlite_small.toml", "ssdlite-wiki": "ssdlite_wiki_small.toml"}


def _corpus_cases() -> dict[str, Callable[[], list[str]]]:
    """Corpus -> its case names (imported when asked: each corpus module is a script)."""

    def names(module: str, attr: str = "CORPUS") -> Callable[[], list[str]]:
        return lambda: list(getattr(importlib.import_module(f"bench.{module}"), attr))

    return {
        "generated": lambda: [f"#{i + 1}" for i in range(GENERATED_EXAMPLES)],
        "generated-sequences": lambda: [f"#{i + 1}" for i in range(GENERATED_EXAMPLES)],
        "sequences": names("sequence_corpus"),
        "tokens": names("token_corpus"),
        "segmentation": names("segmentation_corpus"),
        "keypoints": names("keypoints_corpus"),
        "detection": lambda: list(DETECTORS),
        "timm": lambda: [row[0] for row in importlib.import_module("bench.zoo_timm").families()],
        "transformers": names("hf_zoo", "NAMES"),
    }


CORPORA = tuple(_corpus_cases())


def write_case(corpus: str, name: str, work: Path) -> tuple[Path, int]:
    """The case's recipe folder in ``work``, written by its corpus benchmark's writer; (recipe, input size)."""
    if corpus in ("generated", "generated-sequences"):
        from bench.generated import specs
        from tests.corpus.generator import write_spec

        index = int(name.lstrip("#"))
        kind = "images" if corpus == "generated" else "sequences"
        return write_spec(specs(index, GENERATED_SEED, kind)[index - 1], work), 0
    if corpus in ("sequences", "tokens"):
        module = importlib.import_module(f"bench.{corpus[:-1]}_corpus")
        zoo = "sequence_zoo" if corpus == "sequences" else "token_zoo"
        return write_sequence_case(zoo, name, *module.CORPUS[name], work), 0
    if corpus in ("segmentation", "keypoints"):
        module = importlib.import_module(f"bench.{corpus}_corpus")
        return module.write_case(name, work), module.CORPUS[name][2]
    if corpus == "detection":  # the reference recipe itself (its shapes set made beside it once)
        from tasks.paths import PROJECT_ROOT

        return PROJECT_ROOT / "recipes" / DETECTORS[name], 96
    if corpus == "timm":
        from bench.zoo_timm import _size
        from bench.zoo_timm import write_case as write_timm

        size, kwargs = _size(name)
        return write_timm(name, size, kwargs, work), size
    from bench.hf_corpus import write_case as write_hf

    return write_hf(name, "ort-training", work), 0


def child(case: str, runtime: str, work: Path, measure_steps: int = 0) -> dict:
    """Prepare ``case`` (``corpus/name``) under ``runtime`` in ``work``; its row. With
    ``measure_steps``, a passing case then trains that many steps with the board agent."""
    corpus, name = case.split("/", 1)
    written: list[tuple[Path, int]] = []

    def write() -> Path:
        written.append(write_case(corpus, name, work))
        return written[-1][0]

    overrides = {"training.runtime": runtime}
    row = prepared_row(name, 0, write, work / "prepared", overrides)
    row["size"] = written[0][1] if written else 0
    if measure_steps and row["kind"] == "pass":
        row.update(agent_measure(written[0][0], work / "prepared", overrides, measure_steps))
    return row


def agent_measure(recipe_path: Path, out: Path, overrides: dict, steps: int) -> dict:
    """The board agent's peak RSS training ``steps`` steps of the prepared recipe in ``out``
    (bench/memory.py's local agent run, with the board venv's python)."""
    from tasks.prepare.board_job import build_job_spec
    from tasks.prepare.pipeline import prepare
    from tasks.recipe.load import load_recipe

    recipe = load_recipe(recipe_path, overrides)
    prepared = prepare(recipe, out.with_name("prepared-agent"))
    root = out.parent / "agent-root"
    spec, files = build_job_spec(recipe, prepared, "bench-prepare-cost", max_steps=steps)
    try:
        result = run_agent(BOARD_VENV / "bin" / "python", root, install_job(root, spec, files))
    except SystemExit as exc:
        return {"agent_peak_mb": None, "agent_message": str(exc).splitlines()[0][:200]}
    return {"agent_peak_mb": round(float(result["peak_rss_mb"]), 1), "agent_steps": result.get("steps")}


def run_one(case: str, runtime: str, timeout: float, measure_steps: int = 0) -> dict:
    """:func:`child` in a subprocess with a throw-away work folder; a crash or a timeout is a raw row."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="odl-cost-") as tmp:
        argv = [sys.executable, __file__, "--child", case, "--runtime", runtime, "--work", tmp]
        row, failure = child_json([*argv, "--measure-steps", str(measure_steps)], timeout)
    row = row or {"kind": "raw", "message": failure}
    row.setdefault("prepare_seconds", round(time.perf_counter() - start, 1))
    return row


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` to 3 decimals, None when either is missing or ``b`` is 0."""
    return round(a / b, 3) if a and b else None


def case_row(case: str, sides: dict[str, dict]) -> dict:
    """One model's row: seconds, board estimate, kind and message under each runtime, the ratios."""
    row: dict = {"case": case, "corpus": case.split("/")[0], "model": case.split("/", 1)[1]}
    for rt, side in sides.items():
        s = SHORT[rt]
        row.update({f"{s}_s": side.get("prepare_seconds"), f"{s}_mb": side.get("board_peak_mb"),
                    f"{s}_kind": side["kind"], f"{s}_message": side.get("message", "")})  # fmt: skip
        if "agent_peak_mb" in side:
            row[f"{s}_agent_mb"] = side["agent_peak_mb"]
    both = all(side["kind"] == "pass" for side in sides.values())
    row["ratio_s"] = ratio(row["ag_s"], row["ort_s"]) if both else None
    row["ratio_mb"] = ratio(row["ag_mb"], row["ort_mb"]) if both else None
    return row


def figures(rows: list[dict]) -> dict:
    """The summary: median and worst ratios over the models both runtimes pass, the models over
    SLOW_S under autograd, counts and the models one runtime passes and the other does not."""
    both = [r for r in rows if r["ratio_s"] is not None]
    side_rows = [{"name": r["case"], "runtime": rt, "result": r[f"{SHORT[rt]}_kind"],
                  "message": r[f"{SHORT[rt]}_message"]} for r in rows for rt in RUNTIMES]  # fmt: skip
    sides, text = summary(side_rows, RUNTIMES)

    def spread(key: str) -> dict:
        values = [r[key] for r in both if r[key] is not None]
        return {"median": round(statistics.median(values), 3), "worst": max(values)} if values else {}

    return {"models": len(rows), "both_pass": len(both), "ratio_seconds": spread("ratio_s"),
            "ratio_peak": spread("ratio_mb"), "over_120s_autograd": [r["case"] for r in rows if (r["ag_s"] or 0) > SLOW_S],
            **sides, "sides_text": text}  # fmt: skip


def pick_cases(ap: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The cases to run: the chosen corpora's (``corpus/name``), narrowed by ``--models`` and ``--quick``."""
    listing = _corpus_cases()
    corpora = args.corpora.split(",") if args.corpora else list(CORPORA)
    if set(corpora) - set(CORPORA):
        ap.error(f"--corpora: unknown {sorted(set(corpora) - set(CORPORA))} (known: {', '.join(CORPORA)})")
    if "transformers" in corpora and importlib.util.find_spec("transformers") is None:
        print("transformers: skipped (the optional `transformers` package is not installed)", flush=True)
        corpora.remove("transformers")
    cases = [f"{c}/{n}" for c in corpora for n in listing[c]()]
    if args.models:
        wanted = args.models.split(",")
        chosen = [c for c in cases if c in wanted or c.split("/", 1)[1] in wanted]
        unknown = [w for w in wanted if not any(w in (c, c.split("/", 1)[1]) for c in chosen)]
        if unknown:
            ap.error(f"--models: unknown cases {unknown} in corpora {', '.join(corpora)}")
        cases = chosen
    return sorted(spread_sample(cases, args.quick, args.seed)) if args.quick else cases


def spread_sample(cases: list[str], n: int, seed: int) -> list[str]:
    """``n`` cases drawn with ``seed`` in turn from each corpus (so a large corpus, timm's, does
    not fill the sample)."""
    rng, pools = random.Random(seed), {}
    for case in cases:
        pools.setdefault(case.split("/")[0], []).append(case)
    for pool in pools.values():
        rng.shuffle(pool)
    picked: list[str] = []
    while len(picked) < min(n, len(cases)):
        for pool in pools.values():
            if pool and len(picked) < n:
                picked.append(pool.pop())
    return picked


COLUMNS = [("case", "model"), ("ort_s", "ORT s"), ("ag_s", "autograd s"), ("ratio_s", "s ratio"),
           ("ort_mb", "ORT MB"), ("ag_mb", "autograd MB"), ("ratio_mb", "MB ratio"), ("ort_kind", "ORT"),
           ("ag_kind", "autograd"), ("short", "message")]  # fmt: skip


def print_report(rows: list[dict], fig: dict, path: Path) -> None:
    """The table, the ratios, the slow models and the side-by-side counts."""
    for r in rows:
        text = r["ag_message"] or r["ort_message"]
        r["short"] = text if len(text) < 90 else text[:87] + "..."
    columns = COLUMNS + [(k, h) for k, h in (("ort_agent_mb", "ORT agent MB"), ("ag_agent_mb", "ag agent MB"))
                         if any(k in r for r in rows)]  # fmt: skip
    print(table(rows, columns))
    for key, label in (("ratio_seconds", "preparation seconds"), ("ratio_peak", "board peak estimate")):
        f = fig[key]
        print(f"autograd/ORT {label}: median {f.get('median', '-')}, worst {f.get('worst', '-')} "
              f"over {fig['both_pass']} models both pass")  # fmt: skip
    print(f"over {SLOW_S} s under autograd: {len(fig['over_120s_autograd'])} {fig['over_120s_autograd']}")
    print(f"{fig['sides_text']}\nfigures: {path}")


def measure(rows: list[dict], k: int, seed: int, timeout: float) -> None:
    """For ``k`` models both runtimes pass (seeded), the board agent's peak RSS under each; skipped
    when the board venv is absent."""
    if not (BOARD_VENV / "bin" / "python").exists():
        print(f"--measure: skipped (no board venv at {BOARD_VENV})", flush=True)
        return
    passing = [r for r in rows if r["ratio_s"] is not None]
    for r in random.Random(seed).sample(passing, min(k, len(passing))):
        for rt in RUNTIMES:
            side = run_one(r["case"], rt, timeout, MEASURE_STEPS)
            r[f"{SHORT[rt]}_agent_mb"] = side.get("agent_peak_mb")
            print(f"{r['case']:40s} {rt:12s} agent peak {side.get('agent_peak_mb')} MB "
                  f"{side.get('agent_message', '')}", flush=True)  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpora", help=f"comma-separated (default: all of {', '.join(CORPORA)})")
    ap.add_argument(
        "--quick", type=int, help="a seeded sample of this many cases, drawn in turn from each corpus"
    )
    ap.add_argument("--seed", type=int, default=0, help="--quick's and --measure's sample")
    ap.add_argument("--models", help="comma-separated cases (name or corpus/name)")
    ap.add_argument("--timeout", type=float, default=CHILD_TIMEOUT_S, help="seconds per child")
    ap.add_argument(
        "--measure", type=int, default=0, help="agent-measured peak RSS for this many passing models"
    )
    ap.add_argument("--out", type=Path, help="result JSON (default bench/results/prepare_cost.json)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--runtime", choices=RUNTIMES, help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--measure-steps", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.runtime, args.work, args.measure_steps)))
        return 0
    rows, start = [], time.perf_counter()
    for case in pick_cases(ap, args):
        sides = {rt: run_one(case, rt, args.timeout) for rt in RUNTIMES}
        rows.append(case_row(case, sides))
        r = rows[-1]
        print(f"{case:40s} ORT {r['ort_s']:6.1f}s {r['ort_kind']:8s} autograd {r['ag_s']:6.1f}s "
              f"{r['ag_kind']:8s} {r['ag_message'] or r['ort_message']}", flush=True)  # fmt: skip
    if args.measure:
        measure(rows, args.measure, args.seed, args.timeout)
    fig = figures(rows)
    path = write_results(
        "prepare_cost", {**fig, "wall_s": round(time.perf_counter() - start), "rows": rows}, args.out
    )
    print_report(rows, fig, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``odl prepare | export | artifacts | validate``: the host's offline stages from the command line
(their arguments are declared in :mod:`flows.cli.parser`)."""

from __future__ import annotations

import argparse
import json

from tasks.prepare.datasets import ensure_datasets
from tasks.prepare.pipeline import checked_generate, prepare
from tasks.prepare.runtimes import export_model
from tasks.prepare.validation.validate import validate
from tasks.recipe.load import load_recipe, parse_override
from tasks.recipe.schema import Recipe
from tasks.stages.rehearse import rehearse_judging


def _recipe(args: argparse.Namespace) -> Recipe:
    overrides = dict(parse_override(text) for text in args.set or [])
    return load_recipe(args.recipe, overrides)


def cmd_prepare(args: argparse.Namespace) -> int:
    """Export, generate artifacts and validate; exit 0 only when validation passed."""
    result = prepare(
        _recipe(args), args.out, validate=not args.no_validate, cache=False, rehearse=rehearse_judging
    )
    v = result.validation
    print(f"prepared {result.out_dir}")
    print(trainable_table(result.manifest))
    if v is not None:
        print(
            f"validation passed: {v['time_per_step_s']:.4f} s/step at batch {v['batch_size']}, "
            f"{v['steps_per_epoch']} steps/epoch, board peak estimate {v['board_peak_estimate_mb']:.0f} MB"
        )
    return 0


TABLE_ROWS = 12


def trainable_table(manifest: dict) -> str:
    """What trains, in a short table: layer, operators, parameters, and the share of the model."""
    count, total = manifest["trainable_count"], manifest.get("model_params") or manifest["trainable_count"]
    rows = manifest.get("trainable_layers", [])
    lines = [
        f"trains {count:,} of {total:,} parameters ({100 * count / max(total, 1):.1f} % of the model) in {len(rows)} layers:"
    ]
    width = max([5, *(len(r["layer"]) for r in rows[:TABLE_ROWS])])
    lines.append(f"  {'layer':<{width}}  {'ops':<24} {'params':>10}")
    for row in rows[:TABLE_ROWS]:
        lines.append(f"  {row['layer']:<{width}}  {'+'.join(row['ops']):<24} {row['params']:>10,}")
    if len(rows) > TABLE_ROWS:
        rest = sum(r["params"] for r in rows[TABLE_ROWS:])
        lines.append(f"  ... {len(rows) - TABLE_ROWS} more layers, {rest:,} parameters")
    return "\n".join(lines)


def cmd_export(args: argparse.Namespace) -> int:
    """Export the recipe's model to OUT/model.onnx."""
    recipe = _recipe(args)
    ensure_datasets(recipe)
    print(export_model(recipe, args.out))
    return 0


def cmd_artifacts(args: argparse.Namespace) -> int:
    """Generate OUT/artifacts and OUT/manifest.json from an exported model."""
    recipe = _recipe(args)
    ensure_datasets(recipe)
    manifest = checked_generate(recipe, args.model, args.out)
    print(json.dumps({k: manifest[k] for k in ("trainable_count", "frozen_count", "loss", "opset")}))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Validate OUT (written by `odl artifacts`) offline; exit 0 only when every check passed."""
    report = validate(_recipe(args), args.out, steps=args.steps)
    print(
        f"validation passed: board peak estimate {report['board_peak_estimate_mb']:.0f} MB, "
        f"{report['time_per_step_s']:.4f} s/step"
    )
    return 0

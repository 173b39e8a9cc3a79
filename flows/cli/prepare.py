"""``odl prepare | export | artifacts | validate``: the host's offline stages from the command line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _recipe(args: argparse.Namespace):
    from tasks.recipe.load import load_recipe, parse_override

    overrides = dict(parse_override(text) for text in args.set or [])
    return load_recipe(args.recipe, overrides)


def _add(sub: argparse._SubParsersAction, name: str, help_text: str, func) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_text, description=help_text)
    p.add_argument("recipe", type=Path, help="recipe TOML file")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a recipe field (TOML value)")
    p.set_defaults(func=func)
    return p


def cmd_prepare(args: argparse.Namespace) -> int:
    """Export, generate artifacts and validate; exit 0 only when validation passed."""
    from tasks.prepare import prepare

    result = prepare(_recipe(args), args.out, validate=not args.no_validate)
    v = result.validation
    print(f"prepared {result.out_dir}: {result.manifest['trainable_count']} trainable parameters")
    if v is not None:
        print(
            f"validation passed: {v['time_per_step_s']:.4f} s/step at batch {v['batch_size']}, "
            f"{v['steps_per_epoch']} steps/epoch, board peak estimate {v['board_peak_estimate_mb']:.0f} MB"
        )
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Export the recipe's model to OUT/model.onnx."""
    from tasks.prepare.export import export_model
    from tasks.recipe.datafiles import ensure_datasets

    recipe = _recipe(args)
    ensure_datasets(recipe)
    print(export_model(recipe, args.out))
    return 0


def cmd_artifacts(args: argparse.Namespace) -> int:
    """Generate OUT/artifacts and OUT/manifest.json from an exported model."""
    from tasks.prepare.artifacts import generate

    manifest = generate(_recipe(args), args.model, args.out)
    print(json.dumps({k: manifest[k] for k in ("trainable_count", "frozen_count", "loss", "opset")}))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Validate OUT (written by `odl artifacts`) offline; exit 0 only when every check passed."""
    from tasks.prepare.validate import validate

    report = validate(_recipe(args), args.out, steps=args.steps)
    print(
        f"validation passed: board peak estimate {report['board_peak_estimate_mb']:.0f} MB, "
        f"{report['time_per_step_s']:.4f} s/step"
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the prepare/export/artifacts/validate subcommands to the ``odl`` parser."""
    p = _add(sub, "prepare", "export, generate training artifacts and validate a recipe", cmd_prepare)
    p.add_argument("--no-validate", action="store_true", help="skip the offline validation")
    _add(sub, "export", "export the recipe's model to OUT/model.onnx (training mode)", cmd_export)
    p = _add(sub, "artifacts", "generate ORT training artifacts and manifest.json", cmd_artifacts)
    p.add_argument("--model", type=Path, required=True, help="the exported model.onnx")
    p = _add(sub, "validate", "validate prepared artifacts offline (writes validation.json)", cmd_validate)
    p.add_argument("--steps", type=int, default=5, help="training steps of the probe")

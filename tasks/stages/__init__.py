"""The one stage API: every stage of a run as a typed function returning a dataclass.

Both orchestrations compose exactly these, so they cannot disagree: ``odl run`` (the command
line, no Prefect) and the Prefect flow ``odl`` (whose tasks in :mod:`tasks.prefect.tasks` only add
names, retries, caching and logging)::

    inp = inputs(recipe)                      # sha256 of everything the job is built from
    prep = prepare(inp)                       # export -> artifacts -> validate, cached by inp.key
    spec, files = job_spec(inp, prep, job_id(inp))
    deploy(board, spec, files)                # -> Deployment
    trained = train(board, spec, files)       # -> Training (result + events)
    got = retrieve(board, trained, out_dir)   # -> Retrieved (verified files)
    ref = choose_reference(recipe.name, board.name)
    ev = evaluate(recipe, prep, got.inference, ref)   # -> Evaluation
    promote(recipe, board.name, ev, got.inference, prep, info)   # -> Promotion
"""

from tasks.stages.board import Deployment, Retrieved, Training, deploy, retrieve, train
from tasks.stages.judge import (
    Evaluation,
    Promotion,
    Reference,
    base_model,
    choose_reference,
    evaluate,
    promote,
    registry,
)
from tasks.stages.prepare import (
    Inputs,
    export,
    generate_artifacts,
    inputs,
    job_id,
    job_spec,
    one_build,
    prepare,
    prepare_data,
    prepared,
    step_done,
    validate,
)

__all__ = [
    "Deployment",
    "Evaluation",
    "Inputs",
    "Promotion",
    "Reference",
    "Retrieved",
    "Training",
    "base_model",
    "choose_reference",
    "deploy",
    "evaluate",
    "export",
    "generate_artifacts",
    "inputs",
    "job_id",
    "job_spec",
    "one_build",
    "prepare",
    "prepare_data",
    "prepared",
    "promote",
    "registry",
    "retrieve",
    "step_done",
    "train",
    "validate",
]

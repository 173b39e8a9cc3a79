"""``[data]`` of a recipe: the training source (a host file, a file on the board, or a board folder
that grows), the host's test sets, the data make and the feeds."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from tasks.recipe.fields import BoardPath, FilePath, Number, Ref, present, recipe_table
from tasks.recipe.messages import Expect, expected

BoardFormat = Literal["npz-shards", "image-folder"]


@recipe_table("data")
class DataSpec:
    """``[data]``: exactly one training source (``train``, ``board_train`` or ``board_dataset``) and the
    host's test set."""

    test: FilePath = Field(description="host test set for the before/after evaluation")
    train: FilePath | None = Field(None, description="host file uploaded to the board (content-addressed)")
    board_train: BoardPath | None = Field(None, description="or a file already on the board")
    eval: FilePath | None = Field(None, description="evaluated on the board each epoch")
    extra_tests: dict[str, FilePath] = Field(
        default_factory=dict, description="named extra host test sets (e.g. clean = ...)"
    )
    make: Ref | None = Field(
        None, description="module:callable(out_dir: Path) writing the npz files above when they are missing"
    )
    feeds: Annotated[dict[str, str], Expect("a table of model input name = npz key (strings)")] = Field(
        default_factory=dict, description="model input name = npz key (default: x, y)"
    )
    board_dataset: BoardPath | None = Field(
        None,
        description="or a folder on the board that grows (npz shards or class folders of images); the job "
        "pins its files by sha256",
    )
    board_format: BoardFormat = Field("npz-shards", description="board_dataset: npz-shards | image-folder")
    board_select: Annotated[str, Expect("'all', 'new+replay' or a registry version such as 'v0003'")] = Field(
        "all",
        pattern=r"^(all|new\+replay|v\d{4,})$",
        description="board_dataset: all | new+replay (files the model in service never saw, plus older "
        'ones) | a registry version such as "v0003" (its exact files)',
    )
    replay: Number = Field(
        0.0, ge=0, le=0.95, description="new+replay: the share of older samples in the mix"
    )
    heldout: FilePath | None = Field(
        None,
        description="board_dataset: a host folder holding each board shard's held-out part under the "
        "shard's name; every run evaluates the candidate on the parts of the shards it has learnt "
        "(guarded like extra_tests; the report shows accuracy per shard, backward transfer, forgetting)",
    )

    @model_validator(mode="before")
    @classmethod
    def _folder_keys(cls, data: Any) -> Any:
        given = present(data, ("board_format", "board_select", "replay", "heldout"))
        if given and not present(data, ("board_dataset",)):
            raise expected("data.board_dataset too (it applies to a board dataset folder)", given[0])
        return data

    @model_validator(mode="after")
    def _one_source(self) -> DataSpec:
        sources = [k for k in ("train", "board_train", "board_dataset") if getattr(self, k) is not None]
        if len(sources) != 1:
            raise expected(
                "exactly one of data.train (host file), data.board_train (a file on the board) or "
                f"data.board_dataset (a folder on the board that grows) (got {sources or 'none'})",
                "train",
            )
        if self.replay > 0 and self.board_select != "new+replay":
            raise expected('0 unless data.board_select = "new+replay"', "replay", self.replay)
        return self

"""A recipe's folder is first on the import path while its model, ``[data].make`` and loss factory
load and run: a model file may import a sibling package; ``sys.path`` comes back exactly."""

from __future__ import annotations

import sys

import pytest

from tasks.errors import RecipeError
from tasks.prepare.datasets import ensure_datasets
from tasks.prepare.export.torch_model import build_model, load_ref, recipe_import_path
from tests.prepare.kit import tiny_recipe

SSD = """
from torch import nn

WIDTH = {width}


class Net(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.fc = nn.Linear(16, WIDTH * num_classes)

    def forward(self, x):
        return self.fc(x.flatten(1))
"""

MYMODEL = """
import sys

import numpy as np

from vision.ssd import Net  # a sibling package, imported when the module loads


def build(num_classes=3):
    return Net(num_classes)


def build_lazily(num_classes=3):
    from vision.ssd import Net  # imported when called

    return Net(num_classes)


def make(out_dir):
    from vision.ssd import WIDTH

    x = np.zeros((8, 1, 4, 4), np.float32)
    for name in ("train", "test"):
        np.savez(out_dir / f"{name}.npz", x=x + WIDTH, y=np.zeros(8, np.int64))


def first_path():
    return sys.path[0]


def fail():
    raise ValueError("from the recipe")
"""


@pytest.fixture(autouse=True)
def _forget_siblings(tmp_path_factory):
    """Leave no ``vision`` package of these tests cached for other tests."""
    yield
    with recipe_import_path(tmp_path_factory.mktemp("empty")):
        pass


def _folder(path, width=1):
    (path / "vision").mkdir(parents=True)
    (path / "vision" / "__init__.py").write_text("")
    (path / "vision" / "ssd.py").write_text(SSD.format(width=width))
    (path / "mymodel.py").write_text(MYMODEL)
    return path


def _recipe(folder, callable_="mymodel:build"):
    return tiny_recipe(folder, {"model": {"callable": callable_}, "data": {"make": "mymodel:make"}})


def test_model_imports_a_sibling_package_and_sys_path_is_restored(tmp_path):
    path = list(sys.path)
    model = build_model(_recipe(_folder(tmp_path)))
    assert model.fc.out_features == 3 and sys.path == path
    assert load_ref(tmp_path, "mymodel:first_path")() == str(tmp_path.resolve())
    assert sys.path == path


def test_data_make_runs_with_the_recipe_folder_on_the_path(tmp_path):
    recipe = _recipe(_folder(tmp_path, width=5))
    ensure_datasets(recipe)
    assert (tmp_path / "data" / "train.npz").is_file()


def test_each_folder_gets_its_own_sibling_package(tmp_path):
    one, two = _folder(tmp_path / "one", width=1), _folder(tmp_path / "two", width=2)
    widths = [
        build_model(_recipe(folder, "mymodel:build_lazily")).fc.out_features // 3
        for folder in (one, two, one)
    ]
    assert widths == [1, 2, 1]
    assert build_model(_recipe(two)).fc.out_features == 6  # the module-level import, too


def test_path_is_restored_after_an_error_and_import_errors_name_the_module(tmp_path):
    path = list(sys.path)
    _folder(tmp_path)
    with pytest.raises(ValueError, match="from the recipe"):
        load_ref(tmp_path, "mymodel:fail")()
    assert sys.path == path
    (tmp_path / "broken.py").write_text("from vision.nothing import Net\n")
    with pytest.raises(RecipeError, match="an importable module 'broken'"):
        load_ref(tmp_path, "broken:Net")
    assert sys.path == path

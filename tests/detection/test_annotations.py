"""Detection annotations: COCO and VOC give the same boxes, targets match the priors, and every
bad annotation is a DataError naming the file, the image and what was expected."""

from __future__ import annotations

import json

import numpy as np
import pytest

from device_agent import detection as det
from tasks.detection.annotations import load_coco, load_voc, targets
from tasks.detection.synthetic import CLASSES, write_set
from tasks.errors import DataError

SPECS = [det.FeatureSpec(6, 20, 40), det.FeatureSpec(3, 40, 70), det.FeatureSpec(1, 70, 96)]


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return write_set(tmp_path_factory.mktemp("shapes"), 8, 96)


def test_coco_and_voc_give_the_same_boxes(shapes):
    coco, voc = load_coco(shapes, CLASSES), load_voc(shapes.parent, CLASSES)
    assert len(coco) == len(voc) == 8
    for a, b in zip(coco, voc, strict=True):
        assert a.image == b.image and (a.width, a.height) == (96, 96)
        np.testing.assert_allclose(a.boxes, b.boxes)
        np.testing.assert_array_equal(a.labels, b.labels)
        assert 1 <= len(a.boxes) <= 4 and (a.boxes >= 0).all() and (a.boxes <= 1).all()
    sides = np.concatenate([a.boxes[:, 2] - a.boxes[:, 0] for a in coco])
    assert sides.min() < 0.25 and sides.max() > 0.45  # sizes span the prior scales


def test_targets_match_each_object(shapes):
    items = load_coco(shapes, CLASSES)
    p = det.priors(SPECS, 96)
    labels, offsets = targets(items, p)
    assert labels.shape == (8, len(p)) and offsets.shape == (8, len(p), 4)
    for i, a in enumerate(items):
        assert set(np.unique(labels[i])) - {0} == set(a.labels + 1)  # every object has a prior


def _coco(tmp_path, shapes, edit):
    doc = json.loads(shapes.read_text())
    edit(doc)
    path = shapes.parent / "edited.json"
    path.write_text(json.dumps(doc))
    return path


BAD_COCO = {
    "outside": (lambda d: d["annotations"][0].update(bbox=[80, 80, 40, 40]), "lies outside the 96x96 image"),
    "unknown class": (lambda d: d["categories"].append({"id": 9, "name": "star"})
                      or d["annotations"][0].update(category_id=9), "class 'star'; expected one of"),
    "empty image": (lambda d: d["images"].append({"id": 99, "file_name": "img00000.png", "width": 96, "height": 96}),
                    "has no objects"),
    "no area": (lambda d: d["annotations"][0].update(bbox=[10, 10, 0, 5]), "has no area"),
    "missing image": (lambda d: d["images"][0].update(file_name="nowhere.png"), "does not exist"),
    "not coco": (lambda d: d.pop("categories"), "not a COCO instances file"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_COCO))
def test_bad_coco_annotations(tmp_path, shapes, case):
    edit, text = BAD_COCO[case]
    with pytest.raises(DataError, match=text) as err:
        load_coco(_coco(tmp_path, shapes, edit), CLASSES)
    assert "edited.json" in str(err.value)


def test_empty_images_when_allowed(tmp_path, shapes):
    edit, _ = BAD_COCO["empty image"]
    items = load_coco(_coco(tmp_path, shapes, edit), CLASSES, allow_empty=True)
    assert len(items[-1].boxes) == 0
    labels, _ = targets(items[-1:], det.priors(SPECS, 96))
    assert not labels.any()


def test_bad_voc_annotation_names_its_file(tmp_path, shapes):
    folder = tmp_path / "voc"
    folder.mkdir()
    xml = (shapes.parent / "img00000.xml").read_text().replace("<name>", "<name>x", 1)
    (folder / "img00000.xml").write_text(xml)
    (folder / "img00000.png").write_bytes((shapes.parent / "img00000.png").read_bytes())
    with pytest.raises(DataError, match=r"img00000.xml: image img00000.png has an object of class 'x"):
        load_voc(folder, CLASSES)
    with pytest.raises(DataError, match="no Pascal VOC"):
        load_voc(tmp_path, CLASSES)

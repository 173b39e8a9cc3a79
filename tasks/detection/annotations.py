"""Detection data as users have it: COCO JSON or Pascal VOC XML boxes, checked, then matched to a
detector's priors into the per-prior targets its graph takes.

Every problem is a :class:`~tasks.errors.DataError` naming the file, the image and what was
expected: a box outside its image or with no area, a class the recipe does not list, an image
without objects (unless ``allow_empty``), a missing image file.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from device_agent import detection as det
from tasks.errors import DataError

EDGE_TOLERANCE = 1.0  # pixels a box may pass the image edge by (annotation tools round outwards)


@dataclass(frozen=True)
class Annotated:
    """One image and its objects: corner boxes in [0, 1] and class indices into the class list."""

    image: Path
    width: int
    height: int
    boxes: np.ndarray  # [G, 4] float32, x1 y1 x2 y2 normalised
    labels: np.ndarray  # [G] int64, 0 = the first object class


def _checked(
    source: Path,
    image: str,
    size: tuple[int, int],
    raw: list[tuple[str, list[float]]],
    classes: list[str],
    allow_empty: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Normalised boxes and class indices of one image, or the DataError saying what is wrong."""
    width, height = size
    if not raw and not allow_empty:
        raise DataError(f"{source}: image {image} has no objects (expected at least one box, or allow_empty)")
    boxes, labels = [], []
    for name, (x1, y1, x2, y2) in raw:
        if name not in classes:
            raise DataError(
                f"{source}: image {image} has an object of class {name!r}; expected one of {classes}"
            )
        if x2 <= x1 or y2 <= y1:
            raise DataError(f"{source}: image {image}: box {[x1, y1, x2, y2]} of {name!r} has no area")
        t = EDGE_TOLERANCE
        if x1 < -t or y1 < -t or x2 > width + t or y2 > height + t:
            raise DataError(
                f"{source}: image {image}: box {[x1, y1, x2, y2]} of {name!r} lies outside the "
                f"{width}x{height} image"
            )
        boxes.append(
            [max(x1, 0) / width, max(y1, 0) / height, min(x2, width) / width, min(y2, height) / height]
        )
        labels.append(classes.index(name))
    return np.asarray(boxes, np.float32).reshape(-1, 4), np.asarray(labels, np.int64)


def load_coco(path: Path, classes: list[str], *, allow_empty: bool = False) -> list[Annotated]:
    """Images and boxes of a COCO ``instances`` JSON (``bbox`` = x, y, width, height in pixels);
    image files resolve against the JSON's folder."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
        names = {c["id"]: c["name"] for c in doc["categories"]}
        per_image: dict[int, list[tuple[str, list[float]]]] = {img["id"]: [] for img in doc["images"]}
        for a in doc.get("annotations", []):
            x, y, w, h = a["bbox"]
            per_image[a["image_id"]].append((names[a["category_id"]], [x, y, x + w, y + h]))
        images = doc["images"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{path}: not a COCO instances file ({type(exc).__name__}: {exc})") from exc
    out = []
    for img in images:
        size = (int(img["width"]), int(img["height"]))
        boxes, labels = _checked(path, img["file_name"], size, per_image[img["id"]], classes, allow_empty)
        out.append(Annotated(_image(path.parent, img["file_name"], path), *size, boxes, labels))
    return out


def load_voc(folder: Path, classes: list[str], *, allow_empty: bool = False) -> list[Annotated]:
    """Images and boxes of Pascal VOC XML files (one per image, ``*.xml`` in ``folder``, sorted);
    ``<filename>`` resolves against the folder."""
    out = []
    for xml in sorted(Path(folder).glob("*.xml")):
        try:
            root = ET.parse(xml).getroot()
            size = (int(root.findtext("size/width")), int(root.findtext("size/height")))
            filename = root.findtext("filename") or ""
            raw = [
                (
                    o.findtext("name") or "",
                    [float(o.findtext(f"bndbox/{k}")) for k in ("xmin", "ymin", "xmax", "ymax")],
                )
                for o in root.iter("object")
            ]
        except (ET.ParseError, TypeError, ValueError) as exc:
            raise DataError(f"{xml}: not a Pascal VOC annotation ({type(exc).__name__}: {exc})") from exc
        boxes, labels = _checked(xml, filename, size, raw, classes, allow_empty)
        out.append(Annotated(_image(xml.parent, filename, xml), *size, boxes, labels))
    if not out:
        raise DataError(f"{folder}: no Pascal VOC *.xml annotation files")
    return out


def _image(folder: Path, name: str, source: Path) -> Path:
    path = folder / name
    if not path.is_file():
        raise DataError(f"{source}: image file {path} does not exist")
    return path


def targets(
    items: list[Annotated], center_priors: np.ndarray, threshold: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    """Per-prior class ids ``[N, P]`` (0 = background) and box offsets ``[N, P, 4]`` of ``items``."""
    matched = [det.match(a.boxes, a.labels, center_priors, threshold) for a in items]
    return np.stack([m[0] for m in matched]), np.stack([m[1] for m in matched])


def ground_truth(items: list[Annotated]) -> tuple[np.ndarray, np.ndarray]:
    """Every image's boxes ``[N, M, 4]`` (corners in [0, 1]) and class indices ``[N, M]``, padded
    with -1 labels to the largest count M: what host evaluation scores detections against."""
    most = max((len(a.labels) for a in items), default=0)
    boxes = np.zeros((len(items), max(most, 1), 4), np.float32)
    labels = np.full((len(items), max(most, 1)), -1, np.int64)
    for i, a in enumerate(items):
        boxes[i, : len(a.labels)] = a.boxes
        labels[i, : len(a.labels)] = a.labels
    return boxes, labels


def images(
    items: list[Annotated],
    size: int,
    mean: float | tuple[float, ...] = 0.5,
    std: float | tuple[float, ...] = 0.25,
) -> np.ndarray:
    """The images of ``items`` as float32 NCHW ``[N, 3, size, size]``: RGB in [0, 1], resized
    (boxes are normalised, so they stay valid), then ``(pixel - mean) / std`` per channel."""
    from PIL import Image  # Pillow only for image files

    out = np.empty((len(items), 3, size, size), np.float32)
    m = np.asarray(mean, np.float32).reshape(-1, 1, 1)
    s = np.asarray(std, np.float32).reshape(-1, 1, 1)
    for i, a in enumerate(items):
        with Image.open(a.image) as img:
            rgb = img.convert("RGB").resize((size, size), Image.Resampling.BILINEAR)
        out[i] = (np.asarray(rgb, np.float32).transpose(2, 0, 1) / 255.0 - m) / s
    return out


def detection_arrays(
    items: list[Annotated],
    center_priors: np.ndarray,
    size: int,
    *,
    mean: float | tuple[float, ...] = 0.5,
    std: float | tuple[float, ...] = 0.25,
    threshold: float = 0.5,
) -> dict[str, np.ndarray]:
    """The arrays of a detection ``.npz`` set: ``x`` images, ``y`` per-prior class ids, ``offsets``
    per-prior box targets (what the training graph takes) and ``gt_boxes`` / ``gt_labels`` (what
    host evaluation scores mAP against)."""
    labels, offsets = targets(items, center_priors, threshold)
    gt_boxes, gt_labels = ground_truth(items)
    return {
        "x": images(items, size, mean, std),
        "y": labels.astype(np.int64),
        "offsets": offsets.astype(np.float32),
        "gt_boxes": gt_boxes,
        "gt_labels": gt_labels,
    }

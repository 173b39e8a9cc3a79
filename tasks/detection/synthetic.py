"""A synthetic detection set that ships with the project: shapes on textured backgrounds.

Each image holds 1-4 objects of the classes ``square``, ``disc`` and ``triangle`` in random colours,
with sides from 20 % to 70 % of the image (within the SSD-Lite prior scales, 20 % to 95 %), covering
at most 10 % of each other (no object hidden), on a background of stripes and noise. The same set
is written twice, as users have it: a COCO ``instances`` JSON and one Pascal VOC XML per image,
beside the PNG files.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

CLASSES = ["square", "disc", "triangle"]
MIN_SIDE, MAX_SIDE = 0.2, 0.7  # object sides as fractions of the image: the SSD-Lite prior scales
MAX_OVERLAP = 0.1  # share of the smaller of two objects the other may cover
ATTEMPTS = 20  # placements tried per object before it is left out


def _overlap(a: list[int], b: list[int]) -> float:
    """The share of the smaller of two pixel boxes the other covers."""
    w = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    return w * h / min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    y, x = np.mgrid[0:size, 0:size] / size
    angle, freq = rng.uniform(0, np.pi), rng.uniform(3, 12)
    stripes = 0.5 + 0.25 * np.sin(2 * np.pi * freq * (x * np.cos(angle) + y * np.sin(angle)))
    img = stripes[..., None] * rng.uniform(0.3, 1.0, 3) + rng.normal(0, 0.08, (size, size, 3))
    return np.clip(img, 0, 1)


def _mask(kind: str, size: int, box: tuple[int, int, int, int]) -> np.ndarray:
    x1, y1, x2, y2 = box
    y, x = np.mgrid[0:size, 0:size] + 0.5
    inside = (x >= x1) & (x < x2) & (y >= y1) & (y < y2)
    if kind == "disc":
        cx, cy, r = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2
        return (x - cx) ** 2 + (y - cy) ** 2 <= r**2
    if kind == "triangle":  # apex at the top centre, base along the bottom edge
        rel = (y - y1) / max(1, y2 - y1)
        half = rel * (x2 - x1) / 2
        return inside & (np.abs(x - (x1 + x2) / 2) <= half)
    return inside


def make_image(rng: np.random.Generator, size: int) -> tuple[np.ndarray, list[tuple[str, list[int]]]]:
    """One ``[size, size, 3]`` uint8 image and its objects ``(class, [x1, y1, x2, y2])`` in pixels."""
    img = _background(rng, size)
    objects: list[tuple[str, list[int]]] = []
    for _ in range(rng.integers(1, 5)):
        kind = CLASSES[rng.integers(len(CLASSES))]
        for _attempt in range(ATTEMPTS):  # objects may touch but not hide each other
            side = int(rng.uniform(MIN_SIDE, MAX_SIDE) * size)
            x1, y1 = (int(v) for v in rng.integers(0, size - side + 1, 2))
            box = [x1, y1, x1 + side, y1 + side]
            if all(_overlap(box, other) <= MAX_OVERLAP for _, other in objects):
                break
        else:
            continue
        img[_mask(kind, size, tuple(box))] = rng.uniform(0, 1, 3)
        objects.append((kind, box))
    return (img * 255).astype(np.uint8), objects


def write_set(out_dir: Path, n: int, size: int, seed: int = 0) -> Path:
    """Write ``n`` images with ``instances.json`` (COCO) and ``<image>.xml`` (VOC) into ``out_dir``;
    returns the COCO file."""
    from PIL import Image  # Pillow only for image files

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    coco = {
        "images": [],
        "annotations": [],
        "categories": [{"id": i + 1, "name": c} for i, c in enumerate(CLASSES)],
    }
    for i in range(n):
        img, objects = make_image(rng, size)
        name = f"img{i:05d}.png"
        Image.fromarray(img).save(out_dir / name)
        coco["images"].append({"id": i, "file_name": name, "width": size, "height": size})
        voc = ET.Element("annotation")
        ET.SubElement(voc, "filename").text = name
        dims = ET.SubElement(voc, "size")
        for key, value in (("width", size), ("height", size), ("depth", 3)):
            ET.SubElement(dims, key).text = str(value)
        for kind, (x1, y1, x2, y2) in objects:
            coco["annotations"].append({"id": len(coco["annotations"]), "image_id": i, "category_id": CLASSES.index(kind) + 1,
                                        "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1), "iscrowd": 0})  # fmt: skip
            obj = ET.SubElement(voc, "object")
            ET.SubElement(obj, "name").text = kind
            bnd = ET.SubElement(obj, "bndbox")
            for key, value in (("xmin", x1), ("ymin", y1), ("xmax", x2), ("ymax", y2)):
                ET.SubElement(bnd, key).text = str(value)
        ET.ElementTree(voc).write(out_dir / f"img{i:05d}.xml")
    path = out_dir / "instances.json"
    path.write_text(json.dumps(coco))
    return path

"""The calibration data of static int8 quantization: the recipe's ``[quantize].calibration``
samples, checked against the model's input, fed to ONNX Runtime's calibrator one at a time."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tasks.errors import DataError

CALIBRATION_CHUNK = 16  # samples run before ORT reduces their intermediate outputs to ranges


def calibration_inputs(
    calibration: Path, samples: int, sample_shape: tuple[int | str, ...], dtype: np.dtype
) -> np.ndarray:
    """The first ``samples`` samples of the calibration set's ``x``, checked against one model
    input sample (``sample_shape``: fixed sizes, or names for free axes) and cast to ``dtype``."""
    path = Path(calibration)
    where = f"quantize.calibration: {path}"
    if not path.is_file():
        raise DataError(f"{where}: file not found")
    try:
        with np.load(path, allow_pickle=False) as data:
            if "x" not in data.files:
                raise DataError(f"{where}: expected an array 'x' of input samples, found {data.files}")
            x = data["x"]
    except DataError:
        raise
    except Exception as exc:  # zip, pickle and format errors of a file that is not an .npz
        raise DataError(f"{where}: not a readable .npz file: {exc}") from exc
    if x.ndim != len(sample_shape) + 1 or any(
        isinstance(want, int) and want != got for want, got in zip(sample_shape, x.shape[1:], strict=True)
    ):
        raise DataError(
            f"{where}: x holds samples of shape {tuple(x.shape[1:])} (x is {tuple(x.shape)}), the model "
            f"input expects {sample_shape}"
        )
    if len(x) < 1:
        raise DataError(f"{where}: x holds no samples; at least 1 is needed to calibrate")
    x = x[:samples]
    if not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_):
        raise DataError(f"{where}: x has dtype {x.dtype}, expected numbers")
    x = x.astype(dtype)
    if np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
        raise DataError(f"{where}: x holds NaN or infinite values in its first {len(x)} samples")
    return x


class Reader:
    """ORT's calibration data reader over ``x``, one sample (batch 1) at a time; ``set_range``
    lets ``quantize_static`` calibrate in chunks (its ``CalibStridedMinMax``)."""

    def __init__(self, input_name: str, x: np.ndarray) -> None:
        self.input_name, self.x = input_name, x
        self.set_range(0, len(x))

    def __len__(self) -> int:
        return len(self.x)

    def set_range(self, start_index: int, end_index: int) -> None:
        self.samples = iter(range(start_index, min(end_index, len(self.x))))

    def get_next(self) -> dict[str, np.ndarray] | None:
        i = next(self.samples, None)
        return None if i is None else {self.input_name: self.x[i : i + 1]}


def chunk(n: int) -> int:
    """The largest chunk of at most CALIBRATION_CHUNK samples that divides ``n`` (ORT requires it)."""
    return max(d for d in range(1, min(n, CALIBRATION_CHUNK) + 1) if n % d == 0)

"""The reference dataset's grading columns (dataset, ground_truth), from parquet or a safe pickle."""

from __future__ import annotations

import io
import math
import pickle
from dataclasses import dataclass
from pathlib import Path

# Exactly what a pandas DataFrame of ints, strings and token arrays needs to unpickle (pandas 2/3,
# numpy 1/2, pyarrow-backed strings). Anything else (os.system, eval, ...) is refused.
SAFE_GLOBALS = {
    "builtins": {"slice", "bytearray", "complex", "set", "frozenset", "range"},
    "pandas": {
        "DataFrame",
        "Series",
        "Index",
        "RangeIndex",
        "StringDtype",
        "CategoricalDtype",
        "Categorical",
    },
    "pandas.core.frame": {"DataFrame"},
    "pandas.core.series": {"Series"},
    "pandas.core.internals.managers": {"BlockManager", "SingleBlockManager"},
    "pandas.core.internals.blocks": {"new_block", "Block", "ObjectBlock", "NumpyBlock"},
    "pandas._libs.internals": {"_unpickle_block"},
    "pandas.core.indexes.base": {"_new_Index", "Index"},
    "pandas.core.indexes.range": {"RangeIndex"},
    "pandas.arrays": {"ArrowStringArray", "StringArray", "Categorical"},
    "pandas.core.arrays.string_": {"StringArray", "StringDtype"},
    "pandas.core.arrays.string_arrow": {"ArrowStringArray"},
    "pandas.core.arrays.categorical": {"Categorical"},
    "pandas.core.dtypes.dtypes": {"CategoricalDtype"},
    "pyarrow.lib": {"_restore_array", "type_for_alias", "py_buffer", "ChunkedArray", "chunked_array"},
    "numpy": {"ndarray", "dtype"},
    "numpy.core.multiarray": {"_reconstruct", "scalar"},
    "numpy._core.multiarray": {"_reconstruct", "scalar"},
    "numpy.core.numeric": {"_frombuffer"},
    "numpy._core.numeric": {"_frombuffer"},
    "numpy.dtypes": {"Int64DType", "Int32DType", "Float64DType", "ObjectDType", "BoolDType", "StrDType"},
}


class DatasetError(ValueError):
    pass


class SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if name in SAFE_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        raise DatasetError(f"refusing to unpickle {module}.{name}: only pandas/numpy data types are allowed")


def safe_load_pickle(path: Path):
    with open(path, "rb") as f:
        return SafeUnpickler(io.BytesIO(f.read())).load()


@dataclass(frozen=True, slots=True)
class ReferenceRow:
    dataset: str
    ground_truth: str | None  # the answer; the question_id for LiveCodeBench; None when absent


def load_reference(path: Path) -> list[ReferenceRow]:
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such dataset file")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        present = set(pq.read_schema(path).names)
        df = pd.read_parquet(path, columns=[c for c in ("dataset", "ground_truth") if c in present] or None)
    elif path.suffix in (".pkl", ".pickle"):
        df = safe_load_pickle(path)
    else:
        raise DatasetError(f"{path}: expected a .parquet or .pkl file")
    if not isinstance(df, pd.DataFrame):
        raise DatasetError(f"{path}: holds a {type(df).__name__}, not a pandas DataFrame")
    missing = [c for c in ("dataset", "ground_truth") if c not in df.columns]
    if missing:
        raise DatasetError(
            f"{path}: missing column(s) {', '.join(missing)}; columns are {', '.join(map(str, df.columns))}"
        )
    # Names are compared in lower case, as the MLPerf reference does ("AIME25" is aime25).
    return [
        ReferenceRow(str(d).strip().lower(), truth(g))
        for d, g in zip(df["dataset"], df["ground_truth"], strict=True)
    ]


def truth(value) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value).strip()


def has_ground_truths(path: Path) -> bool:
    """Whether an accuracy run on this dataset can be scored (what the harness checks first)."""
    try:
        rows = load_reference(path)
    except DatasetError:  # the answer itself: an unreadable dataset has nothing to score
        return False
    return bool(rows) and all(r.ground_truth is not None for r in rows)

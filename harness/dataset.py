"""MLCommons gpt-oss datasets (parquet or pickle) -> validated token-id prompts."""

from __future__ import annotations

import json
import math
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.config import VOCAB_SIZE

PROMPT_COLUMNS = ("tok_input", "input_tokens")  # input_tokens: the older MLCommons name
OUTPUT_LEN_COLUMN = "max_output_len"  # optional: per-row max_new_tokens, generated with ignore_eos
DATASET_NAMES = ("aime25", "gpqa_diamond", "livecodebench_v6")


class DatasetError(ValueError):
    """A dataset that cannot be run; the message names the file, row and column."""


@dataclass(frozen=True, slots=True)
class Dataset:
    path: Path
    prompts: tuple[np.ndarray, ...]  # each [prompt_len] int32
    output_lens: tuple[int, ...] | None  # from max_output_len, when the file has it
    names: tuple[str, ...] | None  # the 'dataset' column (aime25, gpqa_diamond, livecodebench_v6)
    has_ground_truth: bool
    prompt_column: str

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def max_prompt_len(self) -> int:
        return max(len(p) for p in self.prompts)


def _read(path: Path):
    import pandas as pd

    from harness.safe_pickle import UnsafePickleError, load_dataframe

    suffix = path.suffix.lower()
    if suffix not in (".parquet", ".pkl", ".pickle"):
        raise DatasetError(f"cannot read dataset {path}: expected a .parquet or .pkl file")
    if not path.is_file():
        raise DatasetError(f"cannot read dataset {path}: no such file")
    try:
        df = pd.read_parquet(path) if suffix == ".parquet" else load_dataframe(path)
    except UnsafePickleError as e:
        raise DatasetError(str(e)) from None
    # What a truncated or foreign file raises: pyarrow's ArrowInvalid is a ValueError; a broken
    # pickle raises UnpicklingError, EOFError, or whatever the allowed constructors reject.
    except (
        OSError,
        ValueError,
        EOFError,
        pickle.UnpicklingError,
        AttributeError,
        IndexError,
        TypeError,
        KeyError,
    ) as e:
        raise DatasetError(f"cannot read dataset {path}: {type(e).__name__}: {e}") from None
    if not isinstance(df, pd.DataFrame):
        raise DatasetError(
            f"cannot read dataset {path}: expected a pandas DataFrame, found {type(df).__name__}"
        )
    return df


def _is_missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _prompt(value: object, where: str, vocab_size: int) -> np.ndarray:
    if _is_missing(value):
        raise DatasetError(f"{where} is NaN/missing, expected a list of token ids")
    if isinstance(value, str | bytes) or not hasattr(value, "__len__"):
        raise DatasetError(f"{where} is a {type(value).__name__}, expected a list of token ids")
    if len(value) == 0:
        raise DatasetError(f"{where} is an empty prompt")
    try:
        arr = np.asarray(value)
    except ValueError:  # ragged nesting, e.g. [[0], [0, 0]]: numpy cannot make one array of it
        raise DatasetError(f"{where} is a ragged nested list, expected a flat list of token ids") from None
    if arr.ndim != 1:
        raise DatasetError(f"{where} has shape {arr.shape}, expected a flat list of token ids")
    if arr.dtype.kind not in "iu":
        # Find the first offender so the message can show it.
        for pos, tok in enumerate(value):
            if isinstance(tok, float) and math.isnan(tok):
                raise DatasetError(f"{where}: token at position {pos} is NaN")
            if isinstance(tok, bool) or not isinstance(tok, int | np.integer):
                raise DatasetError(
                    f"{where}: token at position {pos} is {tok!r} ({type(tok).__name__}), not an integer id"
                )
        # Python ints, compared as such: one past int64 is still a bad id, not an OverflowError
        arr = np.asarray([int(t) for t in value], dtype=object)
    if arr.min() < 0:
        pos = int(np.argmax(arr < 0))
        raise DatasetError(f"{where}: token id {int(arr[pos])} at position {pos} is negative")
    if arr.max() >= vocab_size:
        pos = int(np.argmax(arr >= vocab_size))
        raise DatasetError(
            f"{where}: token id {int(arr[pos])} at position {pos} is >= the vocabulary size {vocab_size}"
        )
    return arr.astype(np.int32)


def _output_len(value: object, where: str) -> int:
    if _is_missing(value):
        raise DatasetError(f"{where} is NaN/missing, expected a positive integer")
    if (
        isinstance(value, bool)
        or not isinstance(value, int | np.integer | float | np.floating)
        or value != int(value)
    ):
        raise DatasetError(f"{where} is {value!r}, expected a positive integer")
    if value < 1:
        raise DatasetError(f"{where} is {int(value)}, expected a positive integer")
    return int(value)


def load_dataset(
    path: Path,
    *,
    max_samples: int | None = None,
    vocab_size: int = VOCAB_SIZE,
    require_ground_truth: bool = False,
) -> Dataset:
    """Read and validate `path`. Every problem raises DatasetError naming the row and column."""
    path = Path(path)
    df = _read(path)
    if max_samples is not None:
        df = df.iloc[:max_samples]
    column = next((c for c in PROMPT_COLUMNS if c in df.columns), None)
    if column is None:
        raise DatasetError(
            f"dataset {path} has no 'tok_input' column (nor the older 'input_tokens'); "
            f"its columns are: {', '.join(map(str, df.columns))}"
        )
    if len(df) == 0:
        raise DatasetError(f"dataset {path} has no rows")
    if require_ground_truth and "ground_truth" not in df.columns:
        raise DatasetError(f"dataset {path} has no 'ground_truth' column, which accuracy evaluation needs")

    prompts = tuple(
        _prompt(v, f"{path.name}: row {i}, column '{column}'", vocab_size) for i, v in enumerate(df[column])
    )
    if "tok_input_len" in df.columns:
        for i, (n, p) in enumerate(zip(df["tok_input_len"], prompts, strict=True)):
            if _is_missing(n) or int(n) != len(p):
                raise DatasetError(
                    f"{path.name}: row {i}, column 'tok_input_len' is {n!r} but '{column}' has {len(p)} "
                    "tokens"
                )
    output_lens = None
    if OUTPUT_LEN_COLUMN in df.columns:
        output_lens = tuple(
            _output_len(v, f"{path.name}: row {i}, column '{OUTPUT_LEN_COLUMN}'")
            for i, v in enumerate(df[OUTPUT_LEN_COLUMN])
        )
    names = None
    if "dataset" in df.columns:
        for i, v in enumerate(df["dataset"]):
            if _is_missing(v):
                raise DatasetError(
                    f"{path.name}: row {i}, column 'dataset' is NaN/missing, expected a dataset name"
                )
            if not isinstance(v, str):
                raise DatasetError(
                    f"{path.name}: row {i}, column 'dataset' is {v!r}, expected a dataset name"
                )
        names = tuple(df["dataset"])
    if require_ground_truth:
        for i, v in enumerate(df["ground_truth"]):
            if _is_missing(v):
                raise DatasetError(f"{path.name}: row {i}, column 'ground_truth' is NaN/missing")
    return Dataset(
        path=path,
        prompts=prompts,
        output_lens=output_lens,
        names=names,
        has_ground_truth="ground_truth" in df.columns,
        prompt_column=column,
    )


def check_model_limits(dataset: Dataset, *, max_model_len: int, vocab_size: int) -> None:
    """Every prompt must fit the model's vocabulary and leave room for one generated token."""
    for i, p in enumerate(dataset.prompts):
        where = f"{dataset.path.name}: row {i}, column '{dataset.prompt_column}'"
        if len(p) >= max_model_len:
            raise DatasetError(
                f"{where}: the prompt has {len(p)} tokens, longer than the model's context of "
                f"{max_model_len} tokens"
            )
        if vocab_size < VOCAB_SIZE and int(p.max()) >= vocab_size:
            pos = int(np.argmax(p >= vocab_size))
            raise DatasetError(
                f"{where}: token id {int(p[pos])} at position {pos} is >= the model's vocabulary size "
                f"{vocab_size}"
            )


def model_limits(model_path: Path | None) -> tuple[int | None, int | None]:
    """(max_position_embeddings, vocab_size) from a checkpoint's config.json, when there is one."""
    if model_path is None or not (Path(model_path) / "config.json").is_file():
        return None, None
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DatasetError(f"cannot read {Path(model_path) / 'config.json'}: {e}") from None
    return cfg.get("max_position_embeddings"), cfg.get("vocab_size")

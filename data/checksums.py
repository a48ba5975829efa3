"""Check downloaded MLCommons dataset files against data/checksums.json.

    python -m data.checksums perf/perf_eval_ref.parquet acc/acc_eval_inputs.parquet
    python -m data.checksums --record acc/acc_eval_inputs.parquet   # pin a first verified download

Each file must be known by name, open as a parquet file with a prompt column (tok_input, or the
older input_tokens) and the expected row count, and (once pinned) match its sha256. Exit code 0
when every file passes. A run validates every cell when it loads the file (harness.dataset); this
module imports nothing of the harness, which depends on it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

CHECKSUMS = Path(__file__).with_name("checksums.json")
PROMPT_COLUMNS = ("tok_input", "input_tokens")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _shape(path: Path) -> tuple[int, list[str]]:
    """(rows, column names) from the parquet footer, without reading the data."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path)
    return meta.metadata.num_rows, meta.schema_arrow.names


def check(path: Path, table: dict, *, record: bool = False) -> tuple[bool, str]:
    """(passed, a line saying why) for `path`. With record=True, a file that passes gets its
    sha256 pinned in `table`."""
    entry = table.get(path.name)
    if entry is None:
        known = ", ".join(k for k in table if not k.startswith("_"))
        return False, f"{path}: not an official file name (known: {known})"
    if not path.is_file():
        return False, f"{path}: no such file"
    try:
        rows, columns = _shape(path)
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        return False, f"{path}: cannot read dataset: {e}"
    if not set(PROMPT_COLUMNS) & set(columns):
        return (
            False,
            f"{path}: no 'tok_input' column (nor the older 'input_tokens'): not an MLCommons dataset",
        )
    if rows != entry["rows"]:
        return False, f"{path}: {rows} rows, expected {entry['rows']}"
    digest = sha256(path)
    if entry.get("sha256") is None:
        if record:
            entry["sha256"] = digest
            return True, f"{path}: OK ({rows} rows); pinned sha256 {digest}"
        return (
            True,
            f"{path}: OK ({rows} rows); sha256 {digest} is NOT PINNED yet: verify the source, then rerun "
            "with --record",
        )
    if digest != entry["sha256"]:
        return False, f"{path}: sha256 {digest} does not match the pinned {entry['sha256']}"
    return True, f"{path}: OK ({rows} rows, sha256 matches)"


def main(argv: list[str] | None = None, checksums: Path = CHECKSUMS) -> int:
    p = argparse.ArgumentParser(prog="python -m data.checksums", description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument(
        "--record", action="store_true", help="pin the sha256 of files whose schema and row count pass"
    )
    p.add_argument("--checksums", type=Path, default=checksums, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    table = json.loads(args.checksums.read_text())
    failed = False
    for path in args.files:
        passed, line = check(path, table, record=args.record)
        failed |= not passed
        print(line)
    if args.record:
        args.checksums.write_text(json.dumps(table, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

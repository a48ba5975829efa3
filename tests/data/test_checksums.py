"""data.checksums on generated files (the official ones cannot be downloaded here)."""

from __future__ import annotations

import json

from data.checksums import main
from data.synthetic import make


def _table(tmp_path, rows=5):
    path = tmp_path / "checksums.json"
    path.write_text(json.dumps({"perf_eval_ref.parquet": {"rows": rows, "use": "test", "sha256": None}}))
    return path


def test_record_then_check_then_detect_a_changed_file(tmp_path, capsys):
    data = tmp_path / "perf_eval_ref.parquet"
    make(5, prompt_len=(110, 120), output_len=None).to_parquet(data)
    table = _table(tmp_path)
    assert main([str(data)], checksums=table) == 0
    assert "NOT PINNED" in capsys.readouterr().out
    assert main(["--record", str(data)], checksums=table) == 0
    pinned = json.loads(table.read_text())["perf_eval_ref.parquet"]["sha256"]
    assert len(pinned) == 64
    assert main([str(data)], checksums=table) == 0
    assert "OK (5 rows, sha256 matches)" in capsys.readouterr().out
    make(5, prompt_len=(110, 120), output_len=None, seed=9).to_parquet(data)
    assert main([str(data)], checksums=table) == 1
    assert f"does not match the pinned {pinned}" in capsys.readouterr().out


def test_wrong_row_count_unknown_name_and_bad_schema(tmp_path, capsys):
    table = _table(tmp_path, rows=6396)
    data = tmp_path / "perf_eval_ref.parquet"
    make(5, prompt_len=(110, 120), output_len=None).to_parquet(data)
    assert main(["--record", str(data)], checksums=table) == 1
    assert "5 rows, expected 6396" in capsys.readouterr().out
    assert json.loads(table.read_text())["perf_eval_ref.parquet"]["sha256"] is None  # nothing pinned
    other = tmp_path / "mine.parquet"
    other.write_bytes(data.read_bytes())
    assert main([str(other)], checksums=table) == 1
    assert "not an official file name (known: perf_eval_ref.parquet)" in capsys.readouterr().out
    data.write_bytes(b"junk")
    assert main([str(data)], checksums=table) == 1
    assert "cannot read dataset" in capsys.readouterr().out


def test_the_shipped_table_names_the_official_files():
    from data.checksums import CHECKSUMS

    table = json.loads(CHECKSUMS.read_text())
    assert {k: v["rows"] for k, v in table.items() if not k.startswith("_")} == {
        "perf_eval_ref.parquet": 6396,
        "acc_eval_inputs.parquet": 4395,
        "acc_eval_compliance_gpqa.parquet": 990,
    }

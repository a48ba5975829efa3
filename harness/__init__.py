"""LoadGen glue for the gpt-oss MLPerf harness (no torch import here)."""

#!/usr/bin/env bash
# The GPU scripts' one way to put the harness's wheels (.whl: LoadGen, orjson) into PY (default
# python3) unless it has them already; run from the repository root. The probe asks importlib, so no
# error output needs hiding; a failed install is said on stderr and is this script's exit status.
PY=${1:-python3}
"$PY" -c 'import importlib.util as u, sys; sys.exit(not all(map(u.find_spec, ("mlperf_loadgen", "orjson"))))' \
  && exit 0
"$PY" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check .whl/*.whl \
  || { echo "harness_wheels.sh: the harness's wheels (.whl) did not install into $PY" >&2; exit 1; }

#!/usr/bin/env python3
"""MLPerf Inference for gpt-oss: flags -> RunConfig -> harness.runner.run(cfg). See --help."""

import sys

from harness.cli import main

if __name__ == "__main__":
    sys.exit(main())

"""A dataset of random prompt ids for the GPU benches: N rows of IN ids (numpy, seed 0), every row
generating exactly OUT tokens (max_output_len). With random weights the shape is what matters.

    python3 bench/rand_dataset.py PATH N IN OUT
"""

import os
import sys

import numpy as np
import pandas as pd

path, n, lin, lout = sys.argv[1], *map(int, sys.argv[2:5])
ids = np.random.default_rng(0).integers(0, 199_998, size=(n, lin))
# written whole under another name, then renamed: two runs at once may both write it, and neither
# may read the other's half-written file
tmp = f"{path}.{os.getpid()}.tmp"
pd.DataFrame(
    {"tok_input": list(ids), "tok_input_len": lin, "dataset": "gpqa_diamond", "max_output_len": lout}
).to_parquet(tmp)
os.replace(tmp, path)

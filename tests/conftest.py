import os
import sys

# Small models on a 2-core machine: one intra-op thread avoids oversubscription (and is faster).
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402

torch.set_num_threads(1)

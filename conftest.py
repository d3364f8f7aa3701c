"""Repo-root pytest configuration for the doctests of the ``lightning_fed`` package.

``pyproject.toml`` runs ``--doctest-modules`` over ``testpaths = ["tests", "lightning_fed"]``, so every
``>>>`` example in a docstring of the package is a test. This file is loaded for both paths.
"""

import os

# Small examples on a small machine: one intra-op thread (and identical numbers across machines).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

# ``python -m`` entry points: importing them is harmless, but they hold no examples and are scripts, not API.
collect_ignore_glob = ["lightning_fed/**/__main__.py"]

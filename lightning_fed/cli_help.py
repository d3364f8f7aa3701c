"""The ``lightning-fed`` command's help text (issue #52: moved out of ``cli.py``): docstrings as a person reads them
in ``--help`` (:func:`plain_text`, :func:`first_sentence`) and the help formatter that uses them. Every name stays
importable from :mod:`lightning_fed.cli`.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from jsonargparse import DefaultHelpFormatter

_ROLE_RE = re.compile(r":(?:[\w-]+:)+`(~?)([^`<]*?)\s*(?:<([^>`]+)>)?`")
_ABBREVIATIONS = {"e.g", "i.e", "al", "cf", "vs", "etc", "Alg", "Sec", "Eq", "Fig", "App", "Tab", "No", "approx", "resp"}


def plain_text(text: str) -> str:
    """Docstring text as a person reads it in ``--help``: Sphinx roles become their name (``:class:`~a.b.C``` → C,
    ``:meth:`a.B.f``` → a.B.f, ``:func:`title <a.f>``` → title) and ````literal```` loses its backticks.

    >>> plain_text("a :class:`~lightning_fed.callbacks.FedAvg` with ``lr=1`` (:meth:`lightning.Trainer.fit`)")
    'a FedAvg with lr=1 (lightning.Trainer.fit)'
    """

    def role(match: re.Match) -> str:
        tilde, name, target = match.groups()
        if target is not None and name:
            return name
        name = (target or name).strip()
        return name.rsplit(".", 1)[-1] if tilde else name

    return re.sub(r"``(.+?)``", r"\1", _ROLE_RE.sub(role, text), flags=re.S)  # a literal may span lines


def first_sentence(text: str) -> str:
    """The first sentence of ``text``'s first paragraph, as plain text (:func:`plain_text`); abbreviations such as
    "e.g." or "et al." do not end it.

    >>> first_sentence("The server optimizer (Reddi et al. 2021, Alg. 1): one callback,\\n e.g. FedAdam. More.\\n\\nOther.")
    'The server optimizer (Reddi et al. 2021, Alg. 1): one callback, e.g. FedAdam.'
    """
    import inspect

    paragraph = inspect.cleandoc(text).split("\n\n", 1)[0]
    paragraph = plain_text(" ".join(line.strip() for line in paragraph.splitlines())).strip()
    for match in re.finditer(r"[.!?](?=\s+[A-Z(\"'])", paragraph):
        word = re.search(r"([\w.]+)$", paragraph[: match.start()])
        if word is not None and word.group(1) in _ABBREVIATIONS:
            continue
        return paragraph[: match.end()]
    return paragraph


def _docstring_summary(obj: Any, first_line: Optional[str] = None) -> Optional[str]:
    """The first sentence of the docstring ``first_line`` was taken from (jsonargparse and Lightning title help
    with a docstring's first *line*, which our wrapped docstrings end mid-sentence), among ``obj``, its classes'
    docstrings and their ``__init__``; else of ``obj``'s own docstring."""
    if isinstance(obj, tuple):
        obj = obj[0] if obj else None
    candidates = [obj]
    if isinstance(obj, type):
        for cls in obj.__mro__:
            candidates += [cls, cls.__dict__.get("__init__")]
    docs = [c.__doc__ for c in candidates if c is not None and isinstance(getattr(c, "__doc__", None), str)]
    docs = [d for d in docs if d.strip()]
    if first_line:
        start = first_line.strip().rstrip(".")
        for doc in docs:
            if doc.strip().startswith(start):
                return first_sentence(doc)
        return plain_text(first_line)
    if isinstance(obj, type):
        return obj.__name__  # no docstring of its own: its name, not jsonargparse's "<class '...'>"
    own = getattr(obj, "__doc__", None)
    return first_sentence(own) if isinstance(own, str) and own.strip() else None


class _PlainHelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help formatter with docstring text made plain (:func:`plain_text`): in argument help, group
    titles and descriptions."""

    def _expand_help(self, action: Any) -> str:
        return plain_text(super()._expand_help(action))

    def start_section(self, heading: Optional[str]) -> None:
        super().start_section(plain_text(heading) if heading else heading)

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain_text(text))

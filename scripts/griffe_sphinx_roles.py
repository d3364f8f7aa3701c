"""Griffe extension for the API reference site: the docstrings' Sphinx roles as MkDocs cross-references.

The docstrings are Google style with Sphinx roles (``:class:`~lightning_fed.FederatedTrainer```, ``:meth:`setup```,
``:mod:`~.sgd```). Each role's target is resolved in the scope of the object whose docstring holds it (its
members, its class and module, their imports; a leading ``.`` is relative to the module) and becomes an autorefs
link ``[`Name`][lightning_fed.full.path]``, so ``mkdocs build --strict`` fails on a reference to a
``lightning_fed`` object that does not exist or is not documented. Targets outside ``lightning_fed`` (torch,
Lightning, the standard library) and names inherited from them become plain code.
"""

from __future__ import annotations

import builtins
import re
from typing import Any, Optional

import griffe

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):`(~?)([^`<>]+?)(?:\s*<([^`<>]+)>)?`")
PACKAGE = "lightning_fed"


def _exists(loader: Any, path: str) -> bool:
    try:
        loader.modules_collection.get_member(path)
    except Exception:  # noqa: BLE001 - any lookup failure means: not an object of the package
        return False
    return True


def _resolve(obj: Any, loader: Any, target: str) -> Optional[str]:
    """The full path of ``target`` seen from ``obj``; ``None`` when it cannot be resolved."""
    if target.startswith("."):
        module = obj if obj.is_module else obj.module
        stripped = target.lstrip(".")
        base = module
        for _ in range(len(target) - len(stripped) - 1):
            base = base.parent or base
        candidates = [f"{base.path}.{stripped}"]
        if not obj.is_module:
            candidates.insert(0, f"{obj.path}.{stripped}")
            if obj.parent is not None:
                candidates.insert(1, f"{obj.parent.path}.{stripped}")
        if base.parent is not None:
            candidates.append(f"{base.parent.path}.{stripped}")  # a sibling module
        return next((c for c in candidates if _exists(loader, c)), None)
    if target.startswith(PACKAGE + ".") or target == PACKAGE:
        return target
    first, _, rest = target.partition(".")
    scope = obj
    while scope is not None:
        try:
            path = scope.resolve(first)
        except Exception:  # noqa: BLE001 - griffe raises NameResolutionError (and others on odd scopes)
            path = None
        if path is None and scope.is_class:
            try:  # a member inherited from a base of the package (e.g. a data module's ``setup``)
                inherited = scope.all_members.get(first)
            except Exception:  # noqa: BLE001 - bases outside the loaded packages
                inherited = None
            path = None if inherited is None else f"{scope.path}.{first}"
        if path is not None:
            return f"{path}.{rest}" if rest else path
        scope = scope.parent
    return None


def _lookup(loader: Any, path: str) -> Any:
    """The object at ``path`` (a class's inherited members included), or ``None``."""
    try:
        return loader.modules_collection.get_member(path)
    except Exception:  # noqa: BLE001 - any lookup failure means: not found this way
        pass
    parent, _, name = path.rpartition(".")
    owner = _lookup(loader, parent) if parent else None
    try:
        return owner.all_members.get(name) if owner is not None and owner.is_class else None
    except Exception:  # noqa: BLE001 - bases outside the loaded packages
        return None


def _private(path: str) -> bool:
    return any(part.startswith("_") and part != "__init__" for part in path.split("."))


def _rendered(loader: Any, path: str) -> Optional[str]:
    """The anchor the site has for the object at ``path``: its canonical path (through re-exports and
    inheritance), else the nearest enclosing object the site renders (for a private name, an object without a
    docstring such as an undocumented constant, or a member inherited from a private base); ``""`` when no public
    page documents it; ``None`` when ``path`` names no object of the package."""
    if _lookup(loader, path) is None:
        return None
    candidate = path
    while candidate:
        obj = _lookup(loader, candidate)
        if obj is not None and obj.is_alias:
            try:
                obj = obj.final_target
            except Exception:  # noqa: BLE001 - an alias to something outside the loaded packages
                obj = None
        while obj is not None and not obj.is_module and (obj.name.startswith("_") or not obj.docstring):
            obj = obj.parent
        if obj is not None and not _private(obj.path) and obj.path.startswith(PACKAGE):
            return obj.path
        candidate = candidate.rpartition(".")[0]
    return ""


_PARAM_SECTIONS = ("Args:", "Arguments:", "Parameters:", "Other Parameters:", "Keyword Args:")
_GROUP = re.compile(r"^(\s*)(\*{0,2}\w+(?:\s*,\s*\*{0,2}\w+)+)\s*:(.*)$")


def _split_param_groups(text: str) -> str:
    """Google-style sections in the project's own shorthand, as griffe's parser reads them: an ``Args`` entry
    naming several parameters (``a, b, c: description``, the names possibly wrapped over lines) becomes one entry
    per parameter with the same description; a ``Warns`` entry without a warning class reads ``UserWarning: …``."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        header = line.strip()
        i += 1
        if header not in _PARAM_SECTIONS and header != "Warns:":
            continue
        base = len(line) - len(line.lstrip())
        item = None
        while i < len(lines):
            cur = lines[i]
            indent = len(cur) - len(cur.lstrip())
            if cur.strip() and indent <= base:
                break
            if not cur.strip():
                out.append(cur)
                i += 1
                continue
            item = indent if item is None else item
            if indent != item:
                out.append(cur)
                i += 1
                continue
            if header == "Warns:":
                out.append(cur if re.match(r"^\s*[\w.]+:", cur) else " " * item + "UserWarning: " + cur.strip())
                i += 1
                continue
            # names wrapped over lines: ``a, b,`` / ``c: description``
            while cur.rstrip().endswith(",") and ":" not in cur and i + 1 < len(lines):
                i += 1
                cur = cur.rstrip() + " " + lines[i].strip()
            m = _GROUP.match(cur)
            i += 1
            if not m:
                out.append(cur)
                continue
            rest = []
            while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > item):
                if not lines[i].strip() and (i + 1 >= len(lines) or len(lines[i + 1]) - len(lines[i + 1].lstrip()) <= item):
                    break
                rest.append(lines[i])
                i += 1
            for name in (n.strip() for n in m.group(2).split(",")):
                out.append(f"{m.group(1)}{name}:{m.group(3)}")
                out.extend(rest)
    return "\n".join(out)


def _literal_blocks(text: str) -> str:
    """reStructuredText literal blocks as Markdown: a paragraph ending in ``::`` followed by an indented block ends
    in ``:`` instead, and the block becomes a fenced code block (``pycon`` for ``>>>`` examples, else ``text``)
    where the paragraph starts a line of the docstring; elsewhere (inside a section's entry) only the ``::``
    becomes ``:``."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.rstrip().endswith("::"):
            out.append(line)
            continue
        stripped = line.rstrip()[:-2].rstrip()
        indent = len(line) - len(line.lstrip())
        # the paragraph keeps one colon ("Example::" -> "Example:"); a line that was only "::" goes
        if stripped.strip():
            out.append(stripped + (":" if not stripped.endswith(" ") and line.rstrip()[-3] != " " else ""))
        j = i
        while j < len(lines) and not lines[j].strip():
            j += 1
        block_end = j
        while block_end < len(lines) and (
            not lines[block_end].strip() or len(lines[block_end]) - len(lines[block_end].lstrip()) > indent
        ):
            block_end += 1
        while block_end > j and not lines[block_end - 1].strip():
            block_end -= 1
        if indent != 0 or j == i or j >= block_end:
            continue  # nested in a section entry, or no blank line / no block after it: leave the block as it is
        block = lines[j:block_end]
        cut = min(len(b) - len(b.lstrip()) for b in block if b.strip())
        lang = "pycon" if block[0].lstrip().startswith(">>>") else "text"
        out += [""] + [f"```{lang}"] + [b[cut:] for b in block] + ["```"]
        i = block_end
    return "\n".join(out)


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles in every docstring of the package into autorefs links (see the module doc)."""

    def on_object(self, *, obj: Any, loader: Any, **kwargs: Any) -> None:
        if obj.is_alias or obj.docstring is None:
            return
        obj.docstring.value = _literal_blocks(_split_param_groups(obj.docstring.value))
        if ":`" not in obj.docstring.value:
            return

        def link(m: re.Match) -> str:
            short, target, explicit = m.group(1), m.group(2).strip(), m.group(3)
            shown = target.lstrip(".").split(".")[-1] if short else target.lstrip(".")
            if explicit:  # ``:meth:`title <target>```
                shown, target = " ".join(target.split()), explicit.strip()
            path = _resolve(obj, loader, target)
            if path is None and target.startswith("."):  # relative: always the package's; report it
                module = obj if obj.is_module else obj.module
                return f"[`{shown}`][{module.path}{target}]"
            if path is None or not (path == PACKAGE or path.startswith(PACKAGE + ".")):
                # torch / Lightning / stdlib, or a name inherited from them: plain code
                return f"`{shown}`"
            if target in vars(builtins):
                return f"`{shown}`"
            documented = _rendered(loader, path)
            if documented is None:  # no such object: left for autorefs to report (strict mode fails the build)
                return f"[`{shown}`][{path}]"
            return f"[`{shown}`][{documented}]" if documented else f"`{shown}`"

        obj.docstring.value = _ROLE.sub(link, obj.docstring.value)

"""MkDocs hooks for the documentation site (``mkdocs.yml``; built by ``scripts/build_docs.sh``).

The home page is the README itself (generated as ``index.md`` at build time, so the site's home never drifts from
it); the guide pages are the hand-written files of ``docs/guide/`` and ``docs/*.md``, listed in ``mkdocs.yml``'s
``nav``. Every page is written to read well on GitHub too, so its links are relative to its own file in the
repository; :func:`rewrite_links` makes them links of the site: a link to another page or image of ``docs/`` becomes
relative to the built page, a link to the README goes to the home page, and a link to any other file of the
repository (which is not part of the site: ``benchmarks/README.md``, a test) becomes plain text naming the file. The
API reference pages are generated too (:data:`API_PAGES`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def rewrite_links(markdown: str, source: str, page: str) -> str:
    """``markdown`` (the text of the repository file ``source``, e.g. ``"README.md"`` or ``"docs/guide/x.md"``)
    with its relative links made links of the site page ``page`` (e.g. ``"index.md"``, ``"guide/x.md"``); code
    blocks are left as they are, absolute URLs and ``#anchor`` links too (MkDocs checks the anchors)."""
    here = os.path.dirname(source)

    def fix(m: re.Match) -> str:
        bang, text, target = m.groups()
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            return m.group(0)
        path, _, frag = target.partition("#")
        repo = os.path.normpath(os.path.join(here, path)).replace(os.sep, "/")
        if repo == "README.md":
            site = "index.md"
        elif repo.startswith("docs/") and (ROOT / repo).is_file():
            site = repo[len("docs/"):]
        else:  # another file or folder of the repository: not on the site; name it
            return text if text.strip("`") == path else f"{text} (`{repo}`)"
        href = os.path.relpath(site, os.path.dirname(page) or ".").replace(os.sep, "/")
        return f"{bang}[{text}]({href}{'#' + frag if frag else ''})"

    chunks = re.split(r"(```.*?```)", markdown, flags=re.S)  # never rewrite inside code blocks
    return "".join(c if c.startswith("```") else _LINK.sub(fix, c) for c in chunks)


def _home() -> tuple[str, str, str]:
    """The home page: the README, its links made the site's."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return ("index.md", "Home", rewrite_links(readme, "README.md", "index.md"))


def _pages() -> list[tuple[str, str, str]]:
    return [_home()] + _api_pages()


#: The API reference: (page, package, what the page says first). Every public module of ``lightning_fed`` is on
#: exactly one page — the first whose package holds it (most specific first), the top-level modules on the last —
#: rendered at its own (canonical) path, so each object has one anchor that cross-references can reach.
API_PAGES = [
    ("api/callbacks.md", "lightning_fed.callbacks", "Server optimizers and the other callbacks."),
    ("api/datamodules.md", "lightning_fed.datamodules", "`FederatedDataModule`, the partitioners, local work, tasks."),
    ("api/aggregators.md", "lightning_fed.server.aggregators", "Aggregator stages: transforms, reducers, Δ_t stages."),
    ("api/rules.md", "lightning_fed.server.rules", "Server rules x_{t+1} = ServerOpt(x_t, Δ_t)."),
    ("api/server.md", "lightning_fed.server", "Privacy accounting, attacks, per-client server state, checks."),
    ("api/client.md", "lightning_fed.client", "What one client does in a round, and the executors."),
    ("api/algorithms.md", "lightning_fed.algorithms", "Algorithms as one unit each: client half, server half, state."),
    ("api/models.md", "lightning_fed.models", "The papers' models (plain LightningModules)."),
    ("api/evaluation.md", "lightning_fed.evaluation", "Federated evaluation."),
    ("api/lightning_fed.md", "lightning_fed", "`FederatedTrainer`, the federated fit loop and the modules beside them."),
]


#: Modules a page shows first, in this order, right after its package's own docstring (the rest follow in name
#: order): the datamodules page opens on what every user writes (``FederatedDataModule``, the partitioners, local
#: work), not on the task data modules (CIFAR, EMNIST, ...), which come after.
API_FIRST = {
    "lightning_fed.datamodules": [
        f"lightning_fed.datamodules.{name}"
        for name in ("federated", "partition", "partitioners", *(
            f"partitioners.{scheme}" for scheme in ("iid", "dirichlet", "shard", "pathological", "inner_dirichlet",
                                                    "size_skew", "natural_id", "grouped_natural_id", "pachinko")),
                     "local_work")
    ],
}


#: Members a module's section shows first (the rest follow in source order): the data module's page opens on
#: ``FederatedDataModule``, not on the helper classes defined above it.
API_FIRST_MEMBERS = {"lightning_fed.datamodules.federated": ["FederatedDataModule"]}


def _members_first(module: str, first: list[str]) -> list[str]:
    """The public top-level names of ``module`` (read from its source), those of ``first`` first, then the other
    classes, functions and module attributes, each in source order: mkdocstrings' ``members`` option, which renders
    in its order (with ``group_by_category: false``)."""
    import ast

    tree = ast.parse(ROOT.joinpath(*module.split(".")).with_suffix(".py").read_text(encoding="utf-8"))
    kinds: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            kinds.setdefault(node.name, 0)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            kinds.setdefault(node.name, 1)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    kinds.setdefault(target.id, 2)
    public = sorted((n for n in kinds if not n.startswith("_")), key=kinds.__getitem__)
    missing = [n for n in first if n not in public]
    if missing:
        raise ValueError(f"API_FIRST_MEMBERS: {module} defines no {missing}")
    return first + [n for n in public if n not in first]


def _public_modules(package: str) -> list[str]:
    """Dotted names of ``package`` and its public modules (depth first, packages before their modules); not the old
    module paths, shims until their removal (``lightning_fed._moved.MOVED_MODULES``)."""
    from lightning_fed._moved import MOVED_MODULES

    path = ROOT.joinpath(*package.split("."))
    if not path.is_dir():
        return [package]
    names = [package]
    for child in sorted(path.iterdir()):
        if child.name.startswith("_"):
            continue
        if child.suffix == ".py" and f"{package}.{child.stem}" not in MOVED_MODULES:
            names.append(f"{package}.{child.stem}")
        elif child.is_dir() and (child / "__init__.py").exists() and f"{package}.{child.name}" not in MOVED_MODULES:
            names += _public_modules(f"{package}.{child.name}")
    return names


def _api_pages() -> list[tuple[str, str, str]]:
    claimed: set[str] = set()
    pages = []
    for page, package, lead in API_PAGES:
        modules = [m for m in _public_modules(package) if m not in claimed]
        claimed.update(modules)
        first = [m for m in API_FIRST.get(package, []) if m in modules]
        modules = modules[:1] + first + [m for m in modules[1:] if m not in first]
        blocks = [f"# {package}", "", f"*{lead}*", ""]
        for module in modules:
            # a package's own heading shows its docstring only: what it re-exports is documented where it is defined
            options = "\n    options:\n      members: false" if (ROOT.joinpath(*module.split(".")) / "__init__.py").exists() else ""
            if module in API_FIRST_MEMBERS:
                members = _members_first(module, API_FIRST_MEMBERS[module])
                options = f"\n    options:\n      group_by_category: false\n      members: {members}"
            blocks += [f"::: {module}{options}", ""]
        pages.append((page, package, "\n".join(blocks)))
    return pages


def on_files(files, config, **kwargs):
    """Add the home page (the README) and the API reference's pages as generated files."""
    from mkdocs.structure.files import File  # here, so that the page builders above import without MkDocs

    for path, _, md in _pages():
        if files.get_file_from_path(path) is not None:
            files.remove(files.get_file_from_path(path))
        files.append(File.generated(config, path, content=md))
    return files


def on_page_markdown(markdown, page, config, files, **kwargs):
    """Every page's links made the site's (:func:`rewrite_links`), each read from its file in ``docs/``."""
    return rewrite_links(markdown, "docs/" + page.file.src_uri, page.file.src_uri)


class _Refs(__import__("html.parser").parser.HTMLParser):
    """The ``href``/``src`` values and the ``id``/``name`` anchors of one HTML page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.refs: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for key, value in attrs:
            if key in ("href", "src") and value is not None:
                self.refs.append(value)
            elif key in ("id", "name") and value:
                self.ids.add(value)


def broken_links(site_dir) -> list[str]:
    """Every internal link of the built site that does not work when the site is opened from disk (``file://``, no
    web server): ``"page.html: href -> why"`` for an ``href``/``src`` whose target is a folder (a server would answer
    with its ``index.html``, a browser shows a folder listing), a missing file, or a ``#fragment`` that the target
    page has no ``id`` for. Absolute URLs (``https:``, ``mailto:``, ...) are not checked, nor ``404.html`` (a web
    server's error page, its links absolute by design). ``[]`` when all work."""
    from urllib.parse import unquote, urlsplit

    site = Path(site_dir).resolve()
    pages: dict[Path, _Refs] = {}
    for html in sorted(site.rglob("*.html")):
        if html.relative_to(site).as_posix() == "404.html":
            continue
        parser = _Refs()
        parser.feed(html.read_text(encoding="utf-8"))
        pages[html] = parser
    out = []
    for html, parser in pages.items():
        for ref in parser.refs:
            parts = urlsplit(ref)
            if parts.scheme or parts.netloc:
                continue
            target = (html.parent / unquote(parts.path)).resolve() if parts.path else html
            name = f"{html.relative_to(site)}: {ref}"
            if target.is_dir():
                out.append(f"{name} -> a folder (from disk the browser lists it; link to its index.html)")
            elif not target.is_file():
                out.append(f"{name} -> no such file")
            elif parts.fragment and target in pages and unquote(parts.fragment) not in pages[target].ids:
                out.append(f"{name} -> no id {parts.fragment!r} in {target.relative_to(site)}")
    return out


def on_post_build(config, **kwargs):
    """Fail the build when a link of the site does not work opened from disk (:func:`broken_links`): the README
    tells readers to open ``site/index.html``."""
    broken = broken_links(config["site_dir"])
    if broken:
        from mkdocs.exceptions import PluginError

        shown = "\n  ".join(broken[:20]) + (f"\n  ... and {len(broken) - 20} more" if len(broken) > 20 else "")
        raise PluginError(f"{len(broken)} link(s) of the site do not work opened from disk:\n  {shown}")

"""MkDocs hooks for the API reference site (``mkdocs.yml``; built by ``scripts/build_docs.sh``).

The guide pages are the README itself, split at build time so that the site never drifts from it: the text before
the first ``##`` heading and the first two ``##`` sections form the home page (``index.md``), every other ``##``
section becomes one page under ``guide/``, except the sections of :data:`MERGED_SECTIONS`, which open a
hand-written page of ``docs/`` of the same title (at its ``<!-- README: title -->`` line). The API reference pages
are generated too (:data:`API_PAGES`). Links are rewritten for the split: ``#anchor`` links point to the page
that holds the heading, ``docs/…`` links and images to the docs folder, and links to other files of the repository
(which are not part of the site) become plain text naming the file.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOME_SECTIONS = 2  # ``##`` sections of the README shown on the home page after its introduction
#: README sections shown at the top of a hand-written page of docs/ (its ``<!-- README: title -->`` line), not as
#: guide pages of their own: title -> page.
MERGED_SECTIONS = {"Write your own algorithm": "write-your-own-algorithm.md"}
_HEADING = re.compile(r"^(#{1,6}) +(.*?) *$")
_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def _slug(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped (letters, digits, ``-``, ``_`` and spaces kept),
    spaces to ``-``; Python-Markdown's ``toc`` gives the same for this README's ASCII headings."""
    title = re.sub(r"`", "", title).strip().lower()
    kept = "".join(ch for ch in title if ch in " -_" or unicodedata.category(ch)[0] in "LN")
    return kept.replace(" ", "-")


def _split_readme(text: str) -> list[tuple[str, str, str]]:
    """``[(path, title, markdown)]`` pages of the README (see the module doc); code blocks are never split."""
    sections: list[list[str]] = [[]]
    fence = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        if not fence and line.startswith("## "):
            sections.append([])
        sections[-1].append(line)
    intro, body = sections[0], sections[1:]
    home = "\n".join(intro + [ln for sec in body[:HOME_SECTIONS] for ln in sec])
    pages = [("index.md", "Home", home)]
    for sec in body[HOME_SECTIONS:]:
        title = sec[0][3:].strip()
        # the section's heading becomes the page's title; its ### subsections become ##
        lines = [ln[1:] if ln.startswith("###") else ln for ln in sec[1:]]
        if title in MERGED_SECTIONS:
            path = MERGED_SECTIONS[title]
            page = (ROOT / "docs" / path).read_text(encoding="utf-8")
            marker = f"<!-- README: {title} -->"
            if marker not in page:
                raise ValueError(f"docs/{path} has no line {marker!r} for the README's section {title!r}")
            pages.append((path, title, page.replace(marker, "\n".join(lines).strip("\n"))))
            continue
        pages.append((f"guide/{re.sub('-+', '-', _slug(title))}.md", title, "\n".join(["# " + title] + lines)))
    return pages


def _rewrite_links(pages: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    anchors: dict[str, tuple[str, bool]] = {}  # slug -> (page, is the page's title)
    for path, _, md in pages:
        fence = False
        for line in md.splitlines():
            if line.lstrip().startswith("```"):
                fence = not fence
            m = None if fence else _HEADING.match(line)
            if m:
                anchors[_slug(m.group(2))] = (path, len(m.group(1)) == 1 and path != "index.md")
    docs = ROOT / "docs"

    def fix(page: str, m: re.Match) -> str:
        bang, text, target = m.groups()
        depth = page.count("/")
        up = "../" * depth
        if re.match(r"^[a-z]+:", target):
            return m.group(0)  # an absolute URL
        if target.startswith("#"):
            where = anchors.get(target[1:])
            if where is None:
                return m.group(0)  # left for MkDocs' anchor check to report
            dest, is_title = where
            href = ("" if dest == page else up + dest) + ("" if is_title else target)
            return f"{bang}[{text}]({href or target})"
        path, _, frag = target.partition("#")
        if (docs / Path(page).parent / path).is_file():
            return m.group(0)  # a page or file of the site, relative to this page
        if path.startswith("docs/") and (docs / path[5:]).exists():
            return f"{bang}[{text}]({up}{path[5:]}{'#' + frag if frag else ''})"
        # another file of the repository: not on the site; name it
        return text if text.strip("`") == path else f"{text} (`{path}`)"

    out = []
    for path, title, md in pages:
        chunks = re.split(r"(```.*?```)", md, flags=re.S)  # never rewrite inside code blocks
        md = "".join(c if c.startswith("```") else _LINK.sub(lambda m: fix(path, m), c) for c in chunks)
        out.append((path, title, md))
    return out


def _pages() -> list[tuple[str, str, str]]:
    return _rewrite_links(_split_readme((ROOT / "README.md").read_text(encoding="utf-8"))) + _api_pages()


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
    """Dotted names of ``package`` and its public modules (depth first, packages before their modules)."""
    path = ROOT.joinpath(*package.split("."))
    if not path.is_dir():
        return [package]
    names = [package]
    for child in sorted(path.iterdir()):
        if child.name.startswith("_"):
            continue
        if child.suffix == ".py":
            names.append(f"{package}.{child.stem}")
        elif child.is_dir() and (child / "__init__.py").exists():
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


def on_config(config, **kwargs):
    """The navigation: home, the README's sections, then the hand-written pages and the API reference."""
    pages = _rewrite_links(_split_readme((ROOT / "README.md").read_text(encoding="utf-8")))
    nav = list(config["nav"] or [])
    guide = [{title: path} for path, title, _ in pages[1:] if title not in MERGED_SECTIONS]
    config["nav"] = [{"Home": "index.md"}, {"Guide": guide}] + [item for item in nav if item != {"Home": "index.md"}]
    return config


def on_files(files, config, **kwargs):
    """Add the README's and the API reference's pages as generated files."""
    from mkdocs.structure.files import File  # here, so that the page builders above import without MkDocs

    for path, _, md in _pages():
        if files.get_file_from_path(path) is not None:
            files.remove(files.get_file_from_path(path))
        files.append(File.generated(config, path, content=md))
    return files


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

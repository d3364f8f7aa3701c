"""The documentation site's pages (mkdocs.yml, scripts/docs_hooks.py; built strictly by scripts/build_docs.sh in CI):
the "Write your own algorithm" page runs as written, and the README's guide pages keep every section and link."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from helpers import load_script

ROOT = Path(__file__).resolve().parents[2]


def _hooks():
    return load_script("scripts/docs_hooks.py")


def test_write_your_own_algorithm_page_runs(tmp_path, monkeypatch):
    """Every ``python`` block of the page's own part, in order, in one namespace; the blocks' asserts are the
    checks (the hand-written momentum rule equals FedAvgM bit for bit, top-k uploads change at most 5 coordinates,
    the proximal term shrinks the clients' drift, the per-client participation counts equal the data module's
    cohorts). The README's section at its top is run by tests/integration/test_readme.py."""
    page = (ROOT / "docs" / "write-your-own-algorithm.md").read_text(encoding="utf-8")
    assert "<!-- README: Write your own algorithm -->" in page
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    assert len(blocks) >= 5  # more as the page grows (#41: client halves given to the trainer)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "write_your_own_algorithm"}
    for block in blocks:
        exec(compile(block, "docs/write-your-own-algorithm.md", "exec"), namespace)
    assert len(namespace["prox"].drifts) == len(namespace["plain"].drifts) == 3
    assert namespace["changed"] >= 1
    counts = [namespace["table"].get(c).item() for c in range(20)]
    assert sum(counts) == 3 * 5  # three rounds of five clients


def test_write_your_own_task_page_runs(tmp_path, monkeypatch):
    """#40: every ``python`` block of docs/write-your-own-task.md, in order, in one namespace: the task module of
    the page (its data written as .npz files) takes every data-module option, refuses the partitioner by name, and
    trains two rounds."""
    page = (ROOT / "docs" / "write-your-own-task.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    assert len(blocks) == 3
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "write_your_own_task"}
    for block in blocks:
        exec(compile(block, "docs/write-your-own-task.md", "exec"), namespace)
    assert namespace["trainer"].current_epoch == 2
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "Write your own task: write-your-own-task.md" in nav


def test_readme_section_opens_its_page():
    """The README's "Write your own algorithm" section is the top of the docs page of that title (not a guide page
    of its own), with its link to the architecture page made relative to the site."""
    hooks = _hooks()
    pages = hooks._rewrite_links(hooks._split_readme((ROOT / "README.md").read_text(encoding="utf-8")))
    page = dict((p, md) for p, _, md in pages)["write-your-own-algorithm.md"]
    assert "<!-- README:" not in page and "class LocalWeightDecay(ClientAlgorithm)" in page
    assert page.index("class LocalWeightDecay") < page.index("## In more depth")
    assert "](architecture.md)" in page and "](docs/architecture.md)" not in page
    assert not any(p.startswith("guide/write-your-own") for p, _, _ in pages)


def test_readme_split_into_guide_pages():
    """The home page holds the README's introduction; each other ``##`` section is one page, titled by it; no
    line of the README is lost; ``#anchor`` links point to the page holding the heading; repository files that
    are not on the site become plain text naming them."""
    hooks = _hooks()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    pages = hooks._rewrite_links(hooks._split_readme(readme))
    paths = [p for p, _, _ in pages]
    assert paths[0] == "index.md" and len(paths) == len(set(paths))
    titles = [line[3:].strip() for line in readme.splitlines() if line.startswith("## ")]
    assert [t for _, t, _ in pages[1:]] == titles[hooks.HOME_SECTIONS:]
    assert set(hooks.MERGED_SECTIONS) <= set(titles)
    text = "\n".join(md for _, _, md in pages)
    for title in titles:
        assert title in text
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    for target in links:
        assert not target.startswith("docs/"), target  # docs/ files are the site's own
        assert target.startswith(("http", "#", "../", "guide/")) or (ROOT / "docs" / target.split("#")[0]).exists(), target
    main_job = dict((t, p) for p, t, _ in pages)["The main job, measured"]
    assert f"]({main_job})" in text  # README's (#the-main-job-measured) from the home page


def test_split_rewrites_links_by_hand():
    hooks = _hooks()
    readme = "# t\nintro [a](#two) and [f](lightning_fed/loop.py)\n## One\nx\n## Two\n### Sub\n```\n## not a heading\n```\n" \
             "[up](#one) [s](#sub) ![img](docs/architecture.md)\n## Three\n[x](#sub)\n"
    hooks.HOME_SECTIONS, saved = 1, hooks.HOME_SECTIONS
    try:
        pages = hooks._rewrite_links(hooks._split_readme(readme))
    finally:
        hooks.HOME_SECTIONS = saved
    assert [(p, t) for p, t, _ in pages] == [("index.md", "Home"), ("guide/two.md", "Two"), ("guide/three.md", "Three")]
    home, two, three = (md for _, _, md in pages)
    assert "[a](guide/two.md)" in home and "f (`lightning_fed/loop.py`)" in home
    assert two.splitlines()[:2] == ["# Two", "## Sub"] and "## not a heading" in two
    assert "[up](../index.md#one)" in two and "[s](#sub)" in two and "![img](../architecture.md)" in two
    assert "[x](../guide/two.md#sub)" in three


def test_sphinx_roles_become_checked_cross_references(tmp_path):
    """scripts/griffe_sphinx_roles.py: roles resolved in the docstring's scope (members, imports, inherited
    members, relative modules) link to the documented canonical object; outside names are plain code; a
    ``lightning_fed`` target that does not exist stays a link for autorefs to report (strict build fails)."""
    griffe = pytest.importorskip("griffe")
    spec = importlib.util.spec_from_file_location("griffe_sphinx_roles", ROOT / "scripts" / "griffe_sphinx_roles.py")
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    ext.PACKAGE = "fake_fed"  # a package of the test's own (the extension's root package is a module constant)
    pkg = tmp_path / "fake_fed"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""Top."""\nfrom fake_fed.sub.base import Base\n__all__ = ["Base"]\n')
    (pkg / "sub" / "__init__.py").write_text('"""See :mod:`~.base` and :mod:`.nothere`."""\n')
    (pkg / "sub" / "base.py").write_text(
        '"""Base module."""\nimport torch\n\n\nclass Base:\n    """A base.\n\n    Args:\n        a, b: two numbers.\n    """\n\n'
        '    def __init__(self, a, b):\n        pass\n\n    def run(self):\n        """Run."""\n\n\n'
        'class Child(Base):\n    """Calls :meth:`run` (inherited), :class:`~fake_fed.Base`, :class:`torch.Tensor`, '
        ':class:`ValueError`, :meth:`Base.nosuch`, :class:`~fake_fed.sub.Missing` and\n    :meth:`the run <run>`."""\n'
    )
    loader_ext = griffe.load_extensions(ext.SphinxRoles)
    package = griffe.load("fake_fed", search_paths=[str(tmp_path)], extensions=loader_ext)
    child = package["sub.base.Child"].docstring.value
    assert "[`run`][fake_fed.sub.base.Base.run]" in child
    assert "[`Base`][fake_fed.sub.base.Base]" in child  # the re-export's canonical object
    assert "`torch.Tensor`" in child and "[`torch" not in child and "`ValueError`" in child
    assert "[`Base.nosuch`][fake_fed.sub.base.Base.nosuch]" in child  # missing: autorefs reports it
    assert "[`Missing`][fake_fed.sub.Missing]" in child
    assert "[`the run`][fake_fed.sub.base.Base.run]" in child
    sub = package["sub"].docstring.value
    assert "[`base`][fake_fed.sub.base]" in sub and "[`nothere`][fake_fed.sub.nothere]" in sub
    base = package["sub.base.Base"].docstring.value
    assert "a: two numbers." in base and "b: two numbers." in base  # one Args entry per name


def test_datamodules_api_page_opens_on_federated_data_module_and_partitioners():
    """The ``lightning_fed.datamodules`` API page shows, after the package's docstring, ``FederatedDataModule``,
    then ``Partition``/``Partitioner`` and the partitioners, then local work, and only then the task data modules
    (CIFAR, EMNIST, MNIST, Shakespeare, ...): not CIFAR internals first (issue #43)."""
    hooks = _hooks()
    page = dict((p, md) for p, _, md in hooks._api_pages())["api/datamodules.md"]
    modules = re.findall(r"^::: (\S+)", page, re.M)
    assert modules[:5] == ["lightning_fed.datamodules", "lightning_fed.datamodules.federated",
                           "lightning_fed.datamodules.partition", "lightning_fed.datamodules.partitioners",
                           "lightning_fed.datamodules.partitioners.iid"]
    partitioners = [m for m in modules if m.rsplit(".", 1)[1] in
                    ("dirichlet", "shard", "pathological", "natural_id", "size_skew", "pachinko")]
    tasks = [m for m in modules if m.rsplit(".", 1)[1] in ("cifar", "emnist", "mnist", "fashion_mnist")]
    local_work = modules.index("lightning_fed.datamodules.local_work")
    assert len(partitioners) == 6 and len(tasks) == 4
    assert max(modules.index(m) for m in partitioners) < local_work < min(modules.index(m) for m in tasks)
    assert len(modules) == len(set(modules)) and set(modules) == set(hooks._public_modules("lightning_fed.datamodules"))
    # within its module, FederatedDataModule comes before the helper classes defined above it; none is left out
    members = hooks._members_first("lightning_fed.datamodules.federated", ["FederatedDataModule"])
    assert f"members: {members}" in page and members[0] == "FederatedDataModule"
    assert {"TensorBatches", "refuse_options"} <= set(members[1:])


def test_broken_links_reports_what_fails_from_disk(tmp_path):
    """scripts/docs_hooks.py ``broken_links`` (run after every build, failing it): a link to a folder (what
    ``use_directory_urls: true`` writes: from disk the browser shows a folder listing), a missing file and a
    missing anchor are reported; page links, anchors, assets and absolute URLs pass; ``404.html`` is skipped."""
    hooks = _hooks()
    (tmp_path / "guide").mkdir()
    (tmp_path / "style.css").write_text("")
    (tmp_path / "index.html").write_text(
        '<a href="guide/a.html#sec">ok</a><a href="guide/">folder</a><a href="guide/b.html">missing</a>'
        '<a href="guide/a.html#nosuch">anchor</a><a href="#top">self</a><h1 id="top"></h1>'
        '<link href="style.css"><a href="https://example.org/x/">abs</a><a href="mailto:a@b.c">mail</a>')
    (tmp_path / "guide" / "a.html").write_text('<h2 id="sec">S</h2><a href="../index.html#top">up</a>'
                                               '<img src="../style.css">')
    (tmp_path / "404.html").write_text('<a href="/guide/">server-only</a>')
    broken = hooks.broken_links(tmp_path)
    assert [b.split(" -> ")[0] for b in broken] == ["index.html: guide/", "index.html: guide/b.html",
                                                   "index.html: guide/a.html#nosuch"]
    assert "a folder" in broken[0] and "no such file" in broken[1] and "no id 'nosuch'" in broken[2]


def test_built_site_works_opened_from_disk(tmp_path):
    """The site built as scripts/build_docs.sh does (strict), into a temporary folder: every internal ``href``/
    ``src`` of every page resolves to an existing file (a page's ``.html``, not a folder) and every ``#anchor`` to
    an ``id`` of its page, so ``site/index.html`` opened from disk (``file://``) navigates; the navigation links
    name ``.html`` files, the API pages included."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    import subprocess
    import sys

    site = tmp_path / "site"
    env = {**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                         cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert _hooks().broken_links(site) == []
    index = (site / "index.html").read_text(encoding="utf-8")
    nav = re.findall(r'<a href="([^"#]+)" class="md-nav__link', index)
    assert "architecture.html" in nav and "api/datamodules.html" in nav
    assert len(nav) > 15 and all(href.endswith(".html") for href in nav), nav
    api = (site / "api" / "datamodules.html").read_text(encoding="utf-8")
    first = api.index('id="lightning_fed.datamodules.federated.FederatedDataModule"')  # a cross-reference target
    assert first < api.index('id="lightning_fed.datamodules.federated.TensorBatches"') \
        < api.index('id="lightning_fed.datamodules.partitioners.dirichlet.DirichletPartitioner"') \
        < api.index('id="lightning_fed.datamodules.tasks.cifar.CIFAR10DataModule"')

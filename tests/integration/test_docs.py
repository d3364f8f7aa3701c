"""The documentation site's pages (mkdocs.yml, scripts/docs_hooks.py; built strictly by scripts/build_docs.sh in CI):
the README's opening screen, the pages' links, every snippet run, the "Write your own algorithm" and "Write your own
task" pages as written."""

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
    """Every ``python`` block of the page, in order, in one namespace; the blocks' asserts are the checks (the
    hand-written momentum rule equals FedAvgM bit for bit, top-k uploads change at most 5 coordinates, the proximal
    term shrinks the clients' drift, the per-client participation counts equal the data module's cohorts). What the
    two blocks opening the page do is checked by tests/integration/test_readme.py."""
    page = (ROOT / "docs" / "write-your-own-algorithm.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    assert len(blocks) >= 7  # more as the page grows (#41: client halves given to the trainer)
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


def _headings(text: str) -> set[str]:
    """GitHub's anchors of the headings of a markdown text (code blocks skipped)."""
    import unicodedata

    out, fence = set(), False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        m = None if fence else re.match(r"^#{1,6} +(.*?) *$", line)
        if m:
            title = re.sub(r"`", "", m.group(1)).strip().lower()
            out.add("".join(ch for ch in title if ch in " -_" or unicodedata.category(ch)[0] in "LN").replace(" ", "-"))
    return out


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def test_readme_opening_screen_and_length():
    """#57: the README's first 50 lines hold the pitch, the two commands, the quick start and the picture; the whole
    README is no longer than 250 lines (the details live on the guide pages)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = readme.splitlines()
    assert len(lines) <= 250, len(lines)
    top = "\n".join(lines[:50])
    assert "bash scripts/train_shakespeare.sh" in top and "bash scripts/test.sh" in top
    assert re.search(r"```python\n.*trainer\.fit\(model, datamodule=data\)\n```", top, re.S)
    picture = re.search(r"!\[[^\]]+\]\(([^)]+\.png)\)", top)
    assert picture and (ROOT / picture.group(1)).is_file()
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text() or "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_every_guide_page_is_in_the_nav_and_every_link_resolves():
    """Every page of docs/ is in mkdocs.yml's nav; every relative link of the README and of the pages names a file
    of the repository (relative to the page, as GitHub reads it) and, with a ``#fragment``, a heading of it."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in (ROOT / "docs").rglob("*.md"):
        assert f": {page.relative_to(ROOT / 'docs').as_posix()}" in nav, page
    bad = []
    for md in _markdown_files():
        text = re.sub(r"```.*?```", "", md.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, frag = target.partition("#")
            dest = (md.parent / path).resolve() if path else md
            if not dest.exists():
                bad.append(f"{md.relative_to(ROOT)}: {target} (no such file)")
            elif frag and dest.suffix == ".md" and frag not in _headings(dest.read_text(encoding="utf-8")):
                bad.append(f"{md.relative_to(ROOT)}: {target} (no such heading)")
    assert not bad, "\n".join(bad)


def test_rewrite_links_by_hand():
    """Links relative to a repository file become links of the site page: docs pages and images relative to the
    built page, the README the home page, anchors and URLs as they are, other repository files plain text."""
    hooks = _hooks()
    readme = ("[g](docs/guide/partitions.md#dirichlet) ![p](docs/images/reddi_shakespeare.png) [a](#two) "
              "[f](lightning_fed/loop.py) [`benchmarks/README.md`](benchmarks/README.md) [u](https://x.org/a.md) "
              "[d](docs/guide/)\n```\n[c](lightning_fed/loop.py)\n```\n")
    home = hooks.rewrite_links(readme, "README.md", "index.md")
    assert "[g](guide/partitions.md#dirichlet)" in home and "![p](images/reddi_shakespeare.png)" in home
    assert "[a](#two)" in home and "f (`lightning_fed/loop.py`)" in home and " `benchmarks/README.md` " in home
    assert "[u](https://x.org/a.md)" in home and "d (`docs/guide`)" in home
    assert "[c](lightning_fed/loop.py)" in home  # code blocks untouched
    page = "[h](../../README.md#quick-start) [o](partitions.md) [r](../architecture.md) [t](../../tests/test_loop.py)"
    out = hooks.rewrite_links(page, "docs/guide/x.md", "guide/x.md")
    assert out == "[h](../index.md#quick-start) [o](partitions.md) [r](../architecture.md) t (`tests/test_loop.py`)"


#: Every ``python`` block of the README and the docs pages, by file: the test that runs it. A new block fails
#: :func:`test_every_python_snippet_is_run` until it is given a runner here.
SNIPPET_RUNNERS = {
    "README.md": ["tests/integration/test_readme.py::test_readme_snippet_runs"],
    "docs/guide/your-own-lightningmodule-federated.md":
        ["tests/integration/test_readme.py::test_hugging_face_dict_batches_snippet_runs"],
    "docs/write-your-own-algorithm.md": ["tests/integration/test_docs.py::test_write_your_own_algorithm_page_runs",
                                         "tests/integration/test_readme.py::test_write_your_own_algorithm_snippets_run"],
    "docs/write-your-own-task.md": ["tests/integration/test_docs.py::test_write_your_own_task_page_runs"],
    "docs/guide/device-traces.md": ["tests/datamodules/devices/test_fedscale.py::test_device_traces_guide_snippet_runs"],
    "docs/guide/communication.md": ["tests/communication/test_compression.py::test_communication_guide_snippet_runs"],
}


def test_every_python_snippet_is_run():
    """#57: every file with a ``python`` block has a runner in :data:`SNIPPET_RUNNERS` that exists and reads that
    file (each runner runs every block of its file, or the one block its file has)."""
    with_blocks = {md.relative_to(ROOT).as_posix(): len(re.findall(r"```python\n", md.read_text(encoding="utf-8")))
                   for md in _markdown_files()}
    with_blocks = {k: n for k, n in with_blocks.items() if n}
    assert set(with_blocks) == set(SNIPPET_RUNNERS), set(with_blocks) ^ set(SNIPPET_RUNNERS)
    for md, runners in SNIPPET_RUNNERS.items():
        for runner in runners:
            file, name = runner.split("::")
            source = (ROOT / file).read_text(encoding="utf-8")
            assert f"def {name}(" in source and Path(md).name in source, (md, runner)
    assert with_blocks["README.md"] == 1 and with_blocks["docs/guide/your-own-lightningmodule-federated.md"] == 1


def test_readme_figure_is_the_committed_runs():
    """The README's picture is drawn from the five committed Reddi Shakespeare runs: the figure each legend entry
    gives (the mean validation accuracy over rounds 1,401–1,500) equals the one examples/README.md's table reports,
    and the paper's figures are Table 1's."""
    fig = load_script("scripts/make_readme_figure.py")
    examples = (ROOT / "examples" / "README.md").read_text(encoding="utf-8")
    for optimizer, paper in fig.PAPER.items():
        m = re.search(rf"- {optimizer}: ([\d.]+) %, against the paper's ([\d.]+) %", examples)
        assert m, optimizer
        assert f"{fig.last_100_mean(optimizer):.1f}" == m.group(1) and float(m.group(2)) == paper


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

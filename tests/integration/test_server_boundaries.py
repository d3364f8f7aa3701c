"""The server side's boundaries (issue #52): the federated loop and the client side reach the server optimizer through
a few members, ``FederatedFitLoop.advance`` reads as a handful of calls, and no function of ``loop.py`` is long."""

from __future__ import annotations

import ast
from pathlib import Path

from lightning_fed.callbacks import ServerOptimizer

PACKAGE = Path(__file__).resolve().parents[2] / "lightning_fed"
HOLDERS = {"server", "server_optimizer", "_server"}  # the names code gives the server optimizer


def _members_named(paths: list[Path]) -> set[str]:
    """Members of ServerOptimizer read as ``<holder>.member`` or ``getattr(<holder>, "member", ...)`` in ``paths``."""
    members = set(dir(ServerOptimizer)) | set(vars(ServerOptimizer()))
    named = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                holder = node.value.id if isinstance(node.value, ast.Name) else getattr(node.value, "attr", None)
                if holder in HOLDERS:
                    named.add(node.attr)
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and len(node.args) >= 2:
                target, name = node.args[0], node.args[1]
                holder = target.id if isinstance(target, ast.Name) else getattr(target, "attr", None)
                if holder in HOLDERS and isinstance(name, ast.Constant):
                    named.add(name.value)
    return {m for m in named if m in members and not m.startswith("__")}


def _code_lines(source: list[str], node: ast.FunctionDef) -> int:
    """Lines of ``node``'s body that are neither blank, comments nor its docstring."""
    start = node.body[0].lineno
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        start = first.end_lineno + 1
    lines = source[start - 1:node.end_lineno]
    return sum(1 for line in lines if line.strip() and not line.strip().startswith("#"))


def test_the_loop_and_the_client_side_name_at_most_four_members_of_the_server_optimizer():
    loop = _members_named([PACKAGE / "loop.py"])
    client = _members_named(sorted((PACKAGE / "client").glob("*.py")))
    assert loop == {"aggregation_requirement", "round_step", "undo_round_step"}, loop
    assert len(client) <= 4, client
    assert not client & {"client_algorithm_states", "loaded_client_state", "client_table"}, client


def test_advance_is_a_handful_of_calls_and_no_loop_function_is_long():
    text = (PACKAGE / "loop.py").read_text()
    source, tree = text.split("\n"), ast.parse(text)
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert _code_lines(source, functions["advance"]) <= 8
    long = {name: _code_lines(source, f) for name, f in functions.items() if _code_lines(source, f) > 60}
    assert not long, long

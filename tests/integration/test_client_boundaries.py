"""A lint of the package's seams (issue #14): the client side (executors, the client runner, client-side callbacks)
touches no federated-loop internals, and only lightning_fed/_lightning.py uses Lightning's private API."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "lightning_fed"

#: The client side: what runs a client, the algorithms' client halves, and the callbacks (progress bar, ...).
CLIENT_SIDE = sorted(
    [PACKAGE / "executor.py", PACKAGE / "vectorized.py", PACKAGE / "distributed.py"]
    + list((PACKAGE / "client").glob("*.py"))
    + list((PACKAGE / "callbacks").glob("*.py"))
    + list((PACKAGE / "algorithms").glob("*.py"))
)

#: Loop objects the client side must not reach: the fit loop, Lightning's epoch loop and its optimization helpers.
LOOP_ATTRIBUTES = {"fit_loop", "epoch_loop", "optim_progress"}  # (module.automatic_optimization is public)

#: Allowed exceptions, (file relative to the package, line's code): each with its reason.
ALLOWED_LOOP_ACCESS = {
    # A type check, not a read of loop state: a server optimizer refuses a plain lightning.Trainer (whose fit loop
    # would silently ignore it). Server-side code, left to the server-side refactor.
    # (read by its client runner, not by importing the loop: no import circle)
    ("callbacks/server_optimizer.py",
     'if getattr(trainer.fit_loop, "client_runner", None) is None:  # not lightning_fed\'s FederatedFitLoop'),
}

#: Roots under which a ``_``-prefixed attribute is not a loop's or Lightning's: the object's own members,
#: torch/numpy internals.
OWN_ROOTS = {"self", "cls", "torch", "nn", "np", "super"}

#: ``_``-prefixed attributes of objects that are neither the loop nor Lightning's: (file, attribute) and why.
ALLOWED_PRIVATE = {
    ("client/vectorized.py", "_version"): "torch.Tensor._version counts in-place writes (probe for buffer updates)",
    ("client/update.py", "_version"): "torch.Tensor._version counts in-place writes (DeltaNorms: norms of a Δ_i "
                                      "written since are not reused)",
    ("client/runner.py", "_version"): "torch.Tensor._version counts in-place writes (a client changing a frozen "
                                      "parameter, issue #42)",
    ("client/lean_step.py", "_optimizer_step_pre_hooks"): "torch.optim.Optimizer's own step pre-hooks (a lean step "
    "runs the closure before step() only without them)",
    ("client/lean_step.py", "_global_optimizer_pre_hooks"): "torch.optim's global step pre-hooks (likewise)",
    ("algorithms/fedlamb.py", "_opt_called"): "torch.optim.lr_scheduler's own flag, set on a rebuilt optimizer",
    ("algorithms/fedlamb.py", "_wrapped_by_lr_sched"): "torch.optim.lr_scheduler's own flag on optimizer.step",
    ("algorithms/fedlamb.py", "_last_lr"): "torch.optim.lr_scheduler's last learning rates, re-pointed to the new "
    "optimizer",
    ("algorithms/scaffold.py", "_replace"): "typing.NamedTuple's public API (ScaffoldControl's state)",
    ("algorithms/fedaware.py", "_replace"): "typing.NamedTuple's public API (ClientDeltas, FedAWAREMinNorm's state)",
    ("algorithms/ditto.py", "_replace"): "typing.NamedTuple's public API (DittoInitialModel's state: w^0)",
    ("callbacks/server_optimizer.py", "_asdict"): "typing.NamedTuple's public API (aggregator stage states)",
    ("callbacks/server_optimizer.py", "_field_defaults"): "typing.NamedTuple's public API (rule states)",
    ("callbacks/server_optimizer.py", "_fields"): "typing.NamedTuple's public API (the rule state's required fields)",
}


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.value if not isinstance(node, ast.Call) else node.func
    return node.id if isinstance(node, ast.Name) else None


def _rel(path):
    return path.relative_to(PACKAGE).as_posix()


@pytest.mark.parametrize("path", CLIENT_SIDE, ids=_rel)
def test_client_side_touches_no_loop_internals(path):
    source = path.read_text()
    lines = source.splitlines()
    problems = []
    for node in ast.walk(ast.parse(source)):
        code = lines[node.lineno - 1].strip() if hasattr(node, "lineno") else ""
        if isinstance(node, ast.Name) and node.id == "loop":
            problems.append(f"line {node.lineno}: a `loop` variable ({code})")
        if isinstance(node, ast.arg) and node.arg == "loop":
            problems.append(f"line {node.lineno}: a `loop` argument ({code})")
        if isinstance(node, ast.Attribute) and node.attr in LOOP_ATTRIBUTES:
            if (_rel(path), code) not in ALLOWED_LOOP_ACCESS:
                problems.append(f"line {node.lineno}: `.{node.attr}` ({code})")
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if _root(node) not in OWN_ROOTS and (_rel(path), node.attr) not in ALLOWED_PRIVATE:
                problems.append(f"line {node.lineno}: private attribute `.{node.attr}` ({code})")
    assert not problems, f"{_rel(path)} reaches into the loop or private API:\n" + "\n".join(problems)


def _private_lightning_imports(tree):
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "lightning":
            private_module = any(part.startswith("_") for part in node.module.split("."))
            names = [a.name for a in node.names if a.name.startswith("_")]
            if private_module or names:
                found.append(f"line {node.lineno}: from {node.module} import {', '.join(a.name for a in node.names)}")
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "lightning" and any(p.startswith("_") for p in alias.name.split(".")):
                    found.append(f"line {node.lineno}: import {alias.name}")
    return found


#: Private Lightning attributes ``_lightning.py`` wraps; nobody else may read or write them.
LIGHTNING_PRIVATE_ATTRIBUTES = {
    "_logger_connector", "_results", "_checkpoint_connector", "_accelerator_connector", "_checkpoint_io",
    "_first_loop_iter", "_batches_that_stepped", "_build_kwargs", "_should_check_val_epoch", "_update_learning_rates",
    "_current_fx_name", "_on_before_batch_transfer", "_every_n_train_steps", "_train_time_interval",
    "_save_on_train_epoch_end", "_forward_cache", "_computed", "_call_callback_hooks", "_call_lightning_module_hook",
    "_call_strategy_hook",
}


@pytest.mark.parametrize(
    "path", sorted(p for p in PACKAGE.rglob("*.py") if p.name != "_lightning.py"), ids=_rel
)
def test_only_the_adapter_uses_private_lightning_api(path):
    tree = ast.parse(path.read_text())
    problems = _private_lightning_imports(tree)
    problems += [
        f"line {node.lineno}: .{node.attr}" for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in LIGHTNING_PRIVATE_ATTRIBUTES
    ]
    assert not problems, (
        f"{_rel(path)} uses Lightning's private API outside lightning_fed/_lightning.py (add a named function "
        "there and list the symbol in REQUIRED_SYMBOLS / INSTANCE_ATTRIBUTES):\n" + "\n".join(problems)
    )


def test_the_lint_catches_what_it_should():
    """The checks above are not vacuous: code as it was before the client runner fails them."""
    old_executor = "def run_round(self, loop, cohort, round_idx):\n    loop.round_failures = []\n"
    old_scaffold = "x = trainer.fit_loop.global_params\n"
    old_vectorized = "p = loop.epoch_loop.automatic_optimization.optim_progress\n"
    old_loop = "from lightning.pytorch.loops.fit_loop import _FitLoop\nfrom lightning.pytorch.trainer import call\n"
    assert any(isinstance(n, ast.arg) and n.arg == "loop" for n in ast.walk(ast.parse(old_executor)))
    assert any(isinstance(n, ast.Attribute) and n.attr == "fit_loop" for n in ast.walk(ast.parse(old_scaffold)))
    assert {n.attr for n in ast.walk(ast.parse(old_vectorized)) if isinstance(n, ast.Attribute)} & LOOP_ATTRIBUTES
    assert len(_private_lightning_imports(ast.parse(old_loop))) == 1

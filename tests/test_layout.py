"""The test tree mirrors the source tree (tests/README.md): lightning_fed/<dir>/<module>.py is tested in
tests/<dir>/test_<module>.py (or test_<module>_<aspect>.py); the two task packages below datamodules/tasks/ are
tested as one unit each, tests/datamodules/tasks/test_<package>.py."""

from __future__ import annotations

from pathlib import Path

from lightning_fed._moved import MOVED_MODULES

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lightning_fed"
TESTS = ROOT / "tests"

# Sub-packages that are one data source: tested by one file named after the package (all their modules).
PACKAGES_AS_ONE_UNIT = {"datamodules/tasks/shakespeare", "datamodules/tasks/stackoverflow"}

# Source modules without a mirrored test module, each with the place that covers it.
COVERED_ELSEWHERE = {
    "errors.py": "tests/test_cli_errors.py (a task's missing data: one error line, exit 2; the traceback with --verbose)",
    "callbacks/dp.py": "tests/server/aggregators/test_dp.py (DPFedAvg/DPFedAdam fits, ε logging, target ε stop)",
    "server/privacy.py": "tests/server/aggregators/test_dp.py (ε equals dp-accounting's own answer)",
    "server/checks.py": "argument checks, exercised by every rule's and optimizer's bad-argument tests",
    "server/moments.py": "tests/server/rules/test_base.py and tests/algorithms/test_fedlamb_ready_made.py (Adam/AMSGrad in NumPy)",
    "server/rules/sgd.py": "tests/server/rules/test_base.py (every rule against NumPy, one file)",
    "server/rules/momentum.py": "tests/server/rules/test_base.py (heavy ball, Nesterov against NumPy)",
    "server/rules/adaptive.py": "tests/server/rules/test_base.py and tests/callbacks/test_adaptive_conventions.py",
    "server/rules/lamb.py": "tests/server/rules/test_base.py (You et al. Alg. 2)",
    "server/rules/stepsize.py": "tests/server/rules/test_base.py (Malitsky & Mishchenko Alg. 1)",
    "callbacks/robust.py": "tests/server/aggregators/test_robust.py (FedMedian, FedTrimmedAvg, Krum against Flower's results)",
    "callbacks/fedbn.py": "tests/algorithms/test_fedbn.py (the FedBN ready-made name: fits against NumPy, resume)",
    # old paths of the ready-made names moved into algorithms/ (#52): re-export shims, checked by
    # tests/test_migrations.py (MOVED_CLASSES: the old path gives the class now)
    **{f"callbacks/{m}.py": f"re-export shim of algorithms/; tests/test_migrations.py and the method's tests/algorithms/"
       for m in ("fedper", "feddyn", "fedprox", "fednova", "fedmgda", "fedaware", "scaffold", "fedlamb")},
    "executor.py": "re-export shim of client/sequential.py (old import path)",
    "vectorized.py": "re-export shim of client/vectorized.py; tests/client/test_vectorized.py",
    "callbacks/fedadagrad.py": "tests/callbacks/test_server_optimizer.py (NumPy Alg. 2, parametrised over the three)",
    "callbacks/fedadam.py": "tests/callbacks/test_server_optimizer.py (NumPy Alg. 2, parametrised over the three)",
    "callbacks/fedyogi.py": "tests/callbacks/test_server_optimizer.py (NumPy Alg. 2 and the sign branch)",
    "callbacks/fedavgm.py": "tests/callbacks/test_server_optimizer.py (NumPy FedAvgM and torch SGD momentum)",
    "models/classifier.py": "the papers' classifiers' tests in tests/models/ (shared training body)",
    # parts of a big module split by concern (#52: no package file over 800 lines), tested with the module they left
    "loop_report.py": "tests/test_loop.py and tests/test_round_logging.py (round metrics, end-of-fit messages)",
    "loop_stop.py": "tests/test_interrupts.py (stop signals: the checkpoint, the resume hint, the discarded round)",
    "evaluation_results.py": "tests/test_evaluation.py (statistics against NumPy, eval_csv)",
    "cli_config.py": "tests/test_cli.py and tests/test_cli_errors.py (configs moved, old paths, size limits)",
    "cli_swaps.py": "tests/test_cli.py (--server_optimizer swaps: defaults, carried or refused client halves)",
    "cli_help.py": "tests/test_cli.py and tests/test_console.py (the help text)",
    "cli_partition.py": "tests/test_cli.py (lightning-fed partition)",
    "server/client_store_disk.py": "tests/server/test_client_state.py (the disk store: rows, manifests, refs, GC)",
    "run_record.py": "tests/test_checkpoint.py (the run record, allowed changes, resume refusals)",
    "tensorboard_partition.py": "tests/test_tensorboard.py (the partition's figures and statistics)",
    "algorithms/fedlamb_optim.py": "tests/algorithms/test_fedlamb.py (the local AMSGrad optimizers against NumPy)",
    "algorithms/fedaware_options.py": "tests/algorithms/test_fedaware.py and tests/algorithms/test_fedaware_ready_made.py",
    "client/failures.py": "tests/client/test_runner.py and tests/test_loop.py (failure policies, ClientRecord, stops)",
}

INTEGRATION = TESTS / "integration"  # cross-cutting, end-to-end tests: no mirror required

#: The shims at the old module paths (lightning_fed/_moved.py's MOVED_MODULES, with the old Shakespeare package's
#: ``python -m`` shim): tested together in tests/integration/test_moved_modules.py.
OLD_PATH_SHIMS = {old.removeprefix("lightning_fed.").replace(".", "/") for old in MOVED_MODULES}


def source_units() -> set[str]:
    """Relative source modules (``a/b.py``) and one-unit packages (``a/pkg``) that need a test module."""
    units = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name == "__init__.py":
            continue  # re-exports
        if rel.removesuffix(".py") in OLD_PATH_SHIMS or Path(rel).parent.as_posix() in OLD_PATH_SHIMS:
            continue
        package = next((p for p in PACKAGES_AS_ONE_UNIT if rel.startswith(p + "/")), None)
        units.add(package or rel)
    return units


def mirrored(unit: str) -> list[Path]:
    rel = Path(unit)
    name = rel.name.removesuffix(".py")
    folder = TESTS / rel.parent
    return sorted(folder.glob(f"test_{name}.py")) + sorted(folder.glob(f"test_{name}_*.py"))


def test_every_source_module_has_a_mirrored_test_module():
    missing = sorted(u for u in source_units() - set(COVERED_ELSEWHERE) if not mirrored(u))
    assert not missing, f"no tests/<dir>/test_<module>.py for {missing} (or list it in COVERED_ELSEWHERE)"


def test_allow_list_is_current():
    stale = sorted(u for u in COVERED_ELSEWHERE if u not in source_units() or mirrored(u))
    assert not stale, f"COVERED_ELSEWHERE names modules that are gone or now mirrored: {stale}"


def test_every_test_module_mirrors_a_source_module():
    units = source_units()
    strays = []
    for path in TESTS.rglob("test_*.py"):
        if INTEGRATION in path.parents or path == Path(__file__):
            continue
        rel = path.relative_to(TESTS)
        stem = rel.name.removeprefix("test_").removesuffix(".py")
        candidates = {(rel.parent / f"{stem[:i]}.py").as_posix() for i in range(1, len(stem) + 1)
                      if i == len(stem) or stem[i] == "_"}
        candidates |= {(rel.parent / stem[:i]).as_posix() for i in range(1, len(stem) + 1)
                       if i == len(stem) or stem[i] == "_"}
        if not candidates & units:
            strays.append(rel.as_posix())
    assert not strays, f"test modules named after no source module (move to tests/integration/?): {sorted(strays)}"

"""Every public class of lightning_fed has a runnable ``>>>`` example in its docstring (issue #14).

The examples themselves run as doctests (``--doctest-modules`` over ``lightning_fed`` in pyproject.toml);
this test checks that they exist, naming the classes that lack one.
"""

import importlib
import inspect
import pkgutil

import lightning_fed

# Public classes allowed without a `>>>` example (none: every public class has one).
ALLOWED_WITHOUT_EXAMPLE: frozenset[str] = frozenset()


def public_classes():
    """``module.Class`` names of the public classes defined in lightning_fed (not re-exports)."""
    found = {}
    for info in pkgutil.walk_packages(lightning_fed.__path__, "lightning_fed."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if name.startswith("_") or not inspect.isclass(obj) or obj.__module__ != module.__name__:
                continue
            found[f"{module.__name__}.{obj.__qualname__}"] = obj
    return found


def test_walk_finds_the_package_classes():
    classes = public_classes()
    # a few that must be found, so an empty or broken walk cannot pass the test below vacuously
    for name in (
        "lightning_fed.callbacks.fedadam.FedAdam",
        "lightning_fed.datamodules.partitioners.dirichlet.DirichletPartitioner",
        "lightning_fed.models.mnist.MNISTCNN",
        "lightning_fed.loop.FederatedFitLoop",
    ):
        assert name in classes
    assert len(classes) > 60


def test_every_public_class_has_an_example():
    missing = sorted(
        name
        for name, cls in public_classes().items()
        if ">>>" not in (cls.__doc__ or "") and name not in ALLOWED_WITHOUT_EXAMPLE
    )
    assert not missing, "public classes without a `>>>` example in their docstring:\n  " + "\n  ".join(missing)


def test_allow_list_is_current():
    # an allowed class that has gained an example (or was renamed/removed) must leave the list
    classes = public_classes()
    stale = sorted(
        name for name in ALLOWED_WITHOUT_EXAMPLE if name not in classes or ">>>" in (classes[name].__doc__ or "")
    )
    assert not stale, "remove from ALLOWED_WITHOUT_EXAMPLE:\n  " + "\n  ".join(stale)

"""The ``lightning-fed`` command's readable errors (issue #52: moved out of ``cli.py``): ``--verbose``
(:func:`verbose`), the two lines printed for a value a class refused (:func:`instantiation_error_message`) or a
task's missing data (:func:`data_not_found_message`), and jsonargparse's parse errors made short, with the closest
known names (:func:`readable_parse_error`). Every name stays importable from :mod:`lightning_fed.cli`.
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
from contextvars import ContextVar
from typing import Any, Optional

from lightning.pytorch.cli import LightningCLI

from lightning_fed._jsonargparse import subcommands_action
from lightning_fed.errors import DataNotFoundError  # noqa: F401  (the examples)

#: Set to ``1`` for full error output: jsonargparse's whole message with the usage for a bad argument, the Python
#: traceback for a value a class refused (the same as ``--verbose`` anywhere on the command line).
VERBOSE_ENV = "LIGHTNING_FED_VERBOSE"

#: Exit status of ``lightning-fed`` for a bad argument: a parse error or a value a class refused in ``__init__``
#: (argparse's status for usage errors).
EXIT_BAD_ARGUMENT = 2

_verbose_flag: ContextVar[bool] = ContextVar("lightning_fed_cli_verbose", default=False)

#: Set on an exception raised while the CLI instantiated the config's classes (told apart from one raised by a run).
_INSTANTIATION_ERROR = "_lightning_fed_instantiation_error"

_VERBOSE_HINT = f"--verbose or {VERBOSE_ENV}=1"


def verbose() -> bool:
    """Whether ``lightning-fed`` shows full error output: ``--verbose`` was given (:func:`main` removes it from the
    arguments) or the environment variable :data:`VERBOSE_ENV` is ``1`` / ``true`` / ``yes``.

    >>> import os
    >>> os.environ.get(VERBOSE_ENV) is None and verbose()
    False
    """
    return _verbose_flag.get() or os.environ.get(VERBOSE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _root_cause(err: BaseException) -> BaseException:
    """The innermost exception of ``err``'s chain (``raise ... from``, or raised while handling)."""
    seen = {id(err)}
    while True:
        nxt = err.__cause__ or (None if err.__suppress_context__ else err.__context__)
        if nxt is None or id(nxt) in seen:
            return err
        seen.add(id(nxt))
        err = nxt


def _refusing_object(err: BaseException) -> tuple[Any, dict[str, Any]]:
    """The object whose ``__init__`` raised ``err`` (the outermost ``__init__`` in its traceback that is not the
    CLI's or jsonargparse's own) and that frame's local variables; ``(None, {})`` if none."""
    from jsonargparse import ArgumentParser

    tb = err.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "__init__":
            obj = frame.f_locals.get("self")
            if obj is not None and not isinstance(obj, (LightningCLI, ArgumentParser)) and not (
                type(obj).__module__.startswith("jsonargparse")
            ):
                return obj, dict(frame.f_locals)
        tb = tb.tb_next
    return None, {}


def instantiation_error_message(err: BaseException) -> str:
    """The few lines ``lightning-fed`` prints for a value a class refused while the config was instantiated: the
    class with the arguments its message names, the message itself, and how to see the full traceback.

    jsonargparse wraps such an error in a "Does not validate against any of the Union subtypes" report that ends
    with a dump of the whole ``Namespace``; the class's own message is the root of the exception chain.

    >>> try:
    ...     try:
    ...         raise ValueError("`lr` must be a finite number > 0, got -1.0.")
    ...     except ValueError as inner:
    ...         raise ValueError("Does not validate against any of the Union subtypes ...") from inner
    ... except ValueError as outer:
    ...     print(instantiation_error_message(outer))
    error: ValueError: `lr` must be a finite number > 0, got -1.0.
      (the full traceback: run again with --verbose or LIGHTNING_FED_VERBOSE=1)
    """
    import inspect

    root = _root_cause(err)
    text = str(root).strip() or type(root).__name__
    obj, local_vars = _refusing_object(root)
    if obj is None:
        head = type(root).__name__
    else:
        try:
            names = [p.name for p in inspect.signature(type(obj)).parameters.values()
                     if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        except (TypeError, ValueError):
            names = []
        extra = local_vars.get("kwargs") if isinstance(local_vars.get("kwargs"), dict) else {}
        names += [k for k in extra if k not in names]
        given = {}
        for name in names:
            if re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", text):
                if name in local_vars and name not in ("self", "kwargs"):
                    given[name] = local_vars[name]
                elif name in extra:
                    given[name] = extra[name]
        head = f"{type(obj).__name__}({', '.join(f'{k}={v!r}' for k, v in given.items())})"
    return f"error: {head}: {text}\n  (the full traceback: run again with {_VERBOSE_HINT})"


def data_not_found_message(err: BaseException) -> str:
    """The lines ``lightning-fed`` prints for a task's data that is not there
    (:class:`~lightning_fed.errors.DataNotFoundError`: its message says what is missing and how to get it), instead of
    the traceback: ``error: <message>`` and how to see the traceback (exit status 2).

    >>> print(data_not_found_message(DataNotFoundError("Fashion-MNIST not found: data/FashionMNIST/raw lacks [...].")))
    error: Fashion-MNIST not found: data/FashionMNIST/raw lacks [...].
      (the full traceback: run again with --verbose or LIGHTNING_FED_VERBOSE=1)
    """
    return f"error: {str(err).strip() or type(err).__name__}\n  (the full traceback: run again with {_VERBOSE_HINT})"


_CLASS_PATH_RE = re.compile(r"(?:<class '|\[|, )([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+)")


def _import_class(class_path: str) -> Optional[type]:
    module_name, _, name = class_path.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        return None
    return obj if isinstance(obj, type) else None


def _known_class_names(bases: list[type]) -> list[str]:
    """Short names of the classes a ``class_path`` of type ``bases`` accepts (what jsonargparse resolves a short
    name against), with the project's callbacks, data modules and models imported."""
    from lightning_fed._jsonargparse import subclass_paths

    for module in ("lightning_fed.callbacks", "lightning_fed.datamodules", "lightning_fed.models"):
        try:
            importlib.import_module(module)
        except ImportError:  # pragma: no cover - part of the package
            pass
    names: dict[str, None] = {}
    for base in bases:
        try:
            paths = subclass_paths(base)
        except Exception:  # pragma: no cover - jsonargparse's helper refused a type: no suggestion
            continue
        names.update((path.rsplit(".", 1)[1], None) for path in paths)
    return sorted(names)


def _init_arg_names(class_path: str) -> list[str]:
    """The arguments jsonargparse accepts for ``class_path``'s ``init_args`` (parents' ones through ``**kwargs``)."""
    cls = _import_class(class_path)
    if cls is None:
        return []
    try:
        from lightning_fed._jsonargparse import init_parameter_names

        return init_parameter_names(cls)
    except Exception:  # pragma: no cover - fall back to the plain signature
        import inspect

        return [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]


def _did_you_mean(word: str, candidates: list[str], prefix: str = "") -> str:
    close = [prefix + c for c in difflib.get_close_matches(word, candidates, n=3, cutoff=0.6)]
    if not close:
        return ""
    return f" Did you mean {close[0]}?" if len(close) == 1 else f" Did you mean {', '.join(close[:-1])} or {close[-1]}?"


def _key_path(lines: list[str], upto: int) -> list[str]:
    """The nested ``Parser key "k":`` names of jsonargparse's message above line ``upto`` (by indentation)."""
    stack: list[tuple[int, str]] = []
    for line in lines[:upto]:
        match = re.match(r'^(\s*)(?:- )?Parser key "([^"]+)"', line)
        if match:
            indent = len(match.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, match.group(2)))
    return [key for _, key in stack]


def readable_parse_error(message: str, parser: Any = None) -> Optional[str]:
    """A short version of jsonargparse's error ``message`` for a misspelt class or option name, naming the option
    and the closest known names; ``None`` for other errors (shown as they are).

    Recognised: an unknown class (``--server_optimizer FedYogy``; the closest subclasses of the option's type, e.g.
    the registered server optimizers), an unknown ``init_args`` name (``--server_optimizer.lrr``; the class's
    arguments), an unknown option (``--trainer.max_epoch``, or a config key; the parser's options), and a value of
    the wrong type (``--trainer.max_epochs abc: expected int or null.``; for an ``Optional``/``Union`` option of a
    class, ``FashionMNISTDataModule(eval_fraction='abc'): expected float or null (--data.eval_fraction).``,
    :func:`_nested_union_error`).

    >>> print(readable_parse_error('Parser key "server_optimizer":\\n'
    ...                            '  - Expected a path but FedYogy either not accessible or invalid\\n'
    ...                            "  Subtypes: [<class 'lightning_fed.callbacks.server_optimizer.ServerOptimizer'>, "
    ...                            "<class 'NoneType'>]"))  # doctest: +ELLIPSIS
    --server_optimizer FedYogy: no class of that name (a ServerOptimizer). Did you mean FedYogi, DPFedYogi or ...?
    """
    lines = message.splitlines()
    for i, line in enumerate(lines):
        match = re.search(r"Expected a path but (\S+) either not accessible or invalid", line)
        if match:
            given = match.group(1)
            keys = _key_path(lines, i)
            subtypes = next((ln for ln in lines[i:] if ln.strip().startswith("Subtypes:")), "")
            found = map(_import_class, _CLASS_PATH_RE.findall(subtypes))
            bases = list(dict.fromkeys(cls for cls in found if cls is not None))
            known = _known_class_names(bases)
            short = given.rsplit(".", 1)[-1]
            option = "--" + ".".join(keys) if keys else "the value"
            kind = " or ".join(b.__name__ for b in bases)
            text = f"{option} {given}: no class of that name" + (f" (a {kind})." if kind else ".")
            text += _did_you_mean(short, known)
            if known and len(known) <= 30 and "Did you mean" not in text:
                text += f" Known: {', '.join(known)}."
            return text
        match = re.search(r"Expected a (?:<class '([\w.]+)'>|(.+?))\. Got value: (.*)$", line)
        if match:
            kind = (match.group(1) or match.group(2)).replace("NoneType", "null")
            return f"--{'.'.join(_key_path(lines, i + 1))} {match.group(3)}: expected {kind}."
        match = re.search(r"Option '([^']+)' is not accepted", line)
        if match:
            wrong = match.group(1)
            class_path = None
            for prev in reversed(lines[:i]):
                found = re.search(r"Problem with given class_path '([^']+)'", prev)
                if found:
                    class_path = found.group(1)
                    break
            keys = _key_path(lines, i)
            prefix = "--" + ".".join(keys) + "." if keys else "--"
            name = class_path.rsplit(".", 1)[-1] if class_path else "the class"
            subtypes = next((ln for ln in lines[:i][::-1] if ln.strip().startswith("Subtypes:")), "")
            bases = [base.rsplit(".", 1)[-1] for base in _CLASS_PATH_RE.findall(subtypes)]
            if keys and class_path and name in bases:  # only the option's base class: no class named yet
                return (f"{prefix}{wrong}: no {prefix[:-1]} class given before its settings; name one first "
                        f"({prefix[:-1]} NAME {prefix}{wrong} ..., or class_path in a config).")
            return (f"{prefix}{wrong}: {name} has no argument {wrong!r}."
                    + _did_you_mean(wrong, _init_arg_names(class_path) if class_path else [], prefix))
    nested = _nested_union_error(lines)
    if nested is not None:
        return nested
    key = re.match(r'Parser key "([^"]+)":', message)
    given = re.search(r"^\s*Given value: (.*)$", message, re.M)
    errors = [ln.strip()[2:] for ln in lines if ln.strip().startswith("- ")]
    expected = [re.fullmatch(r"Expected a (?:<class '([\w.]+)'>|([\w.\[\], ]+))", e) for e in errors]
    if key and given and errors and all(expected):
        kinds = [(m.group(1) or m.group(2)).replace("NoneType", "null") for m in expected]
        return f"--{key.group(1)} {given.group(1)}: expected {' or '.join(dict.fromkeys(kinds))}."
    options = sorted({s for p in _parsers(parser) for a in p._actions for s in a.option_strings
                      if s.startswith("--") and not s.endswith(".help")})
    match = re.search(r"unrecognized arguments: (\S+)", message)
    if match:
        return f"{match.group(1)}: no such option." + _did_you_mean(match.group(1), options)
    match = re.search(r"does not accept option '([^']+)'", message)
    if match:  # a key of a config file
        keys = [o[2:] for o in options]
        return f"{match.group(1)} (in a config): no such setting." + _did_you_mean(match.group(1), keys)
    return None


def _split_top_level(text: str) -> list[str]:
    """``text`` split at the commas outside brackets (``"Sequence[int], <class 'x'>"`` -> two parts)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "[(<":
            depth += 1
        elif ch in "])>":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def _type_words(subtype: str) -> str:
    """A type as jsonargparse prints it in ``Subtypes: [...]``, as a person reads it: ``<class 'float'>`` -> float,
    ``<class 'NoneType'>`` -> null, ``typing.Sequence[int]`` -> a list of int, a class -> a <Name> (a class name, or
    class_path and init_args)."""
    match = re.fullmatch(r"<class '([\w.]+)'>", subtype)
    if match:
        name = match.group(1)
        if name == "NoneType":
            return "null"
        if "." not in name:
            return name
        return f"a {name.rsplit('.', 1)[-1]} (a class name, or class_path and init_args)"
    subtype = subtype.replace("typing.", "").replace("collections.abc.", "")
    match = re.fullmatch(r"(?:Sequence|List|list|Tuple|tuple|Iterable)\[(.+?)(?:, \.\.\.)?\]", subtype)
    if match:
        return f"a list of {_type_words(match.group(1))}"
    return subtype


def _nested_union_error(lines: list[str]) -> Optional[str]:
    """The one-line message for a value of the wrong type given to an ``Optional``/``Union`` option of a class
    (``--data.eval_fraction abc``): jsonargparse's nested "Does not validate against any of the Union subtypes"
    report under ``Problem with given class_path 'C'`` becomes ``C(name='abc'): expected float or null
    (--data.eval_fraction).`` (the innermost such report); ``None`` when ``lines`` hold none.

    >>> report = '''Parser key "data":
    ...   Does not validate against any of the Union subtypes
    ...   Errors:
    ...     - Problem with given class_path 'lightning_fed.datamodules.MNISTDataModule':
    ...         Parser key "eval_fraction":
    ...           Does not validate against any of the Union subtypes
    ...           Subtypes: [<class 'float'>, <class 'NoneType'>]
    ...           Errors:
    ...             - Expected a <class 'float'>
    ...             - Expected a <class 'NoneType'>
    ...           Given value type: <class 'str'>
    ...           Given value: abc
    ...     - Expected a <class 'NoneType'>
    ...   Given value type: <class 'jsonargparse._util.NestedArg'>'''
    >>> print(_nested_union_error(report.splitlines()))
    MNISTDataModule(eval_fraction='abc'): expected float or null (--data.eval_fraction).
    """
    best = None
    for i, line in enumerate(lines):
        if i == 0 or "Does not validate against any of the Union subtypes" not in line:
            continue
        head = re.match(r'^\s*(?:- )?Parser key "([^"]+)":', lines[i - 1])
        if head is None:
            continue
        indent = len(line) - len(line.lstrip())
        own = []
        for follow in lines[i + 1:]:
            depth = len(follow) - len(follow.lstrip())
            if follow.strip() and depth < indent:
                break
            if depth == indent:
                own.append(follow.strip())
        subtypes = next((ln[len("Subtypes: "):] for ln in own if ln.startswith("Subtypes: [")), None)
        given = next((ln[len("Given value: "):] for ln in own if ln.startswith("Given value: ")), None)
        given_type = next((ln for ln in own if ln.startswith("Given value type: ")), "")
        if subtypes is None or given is None or "NestedArg" in given_type:
            continue
        class_path = None
        for prev in reversed(lines[:i - 1]):
            found = re.search(r"Problem with given class_path '([^']+)'", prev)
            if found and len(prev) - len(prev.lstrip()) < indent:
                class_path = found.group(1)
                break
        if class_path is None or (best is not None and indent <= best[0]):
            continue
        value = repr(given) if given_type.endswith("<class 'str'>") else given
        kinds = [_type_words(t) for t in _split_top_level(subtypes[1:-1])]
        option = "--" + ".".join(_key_path(lines, i))
        best = (indent, f"{class_path.rsplit('.', 1)[-1]}({head.group(1)}={value}): expected "
                        f"{' or '.join(dict.fromkeys(kinds))} ({option}).")
    return None if best is None else best[1]


def _parsers(parser: Any) -> list[Any]:
    """``parser`` and its subcommand parsers."""
    if parser is None:
        return []
    out = [parser]
    action = subcommands_action(parser)
    if action is not None:
        out += list(getattr(action, "_name_parser_map", {}).values())
    return out

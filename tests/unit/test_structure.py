"""The package's shape, held: no class or Lua script longer than a reader holds in a few screens."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "echomq_django"
SCRIPTS = PACKAGE.parent / "lua"
MAX_CLASS_LINES = 300
MAX_MODULE_LINES = 450
MAX_SCRIPT_LINES = 250


def class_lengths() -> dict[str, int]:
    """Lines of each class in the package (its decorators aside), by "path:Class"."""
    lengths = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                lengths[f"{path.relative_to(PACKAGE.parent)}:{node.name}"] = node.end_lineno - node.lineno + 1
    return lengths


def test_no_class_is_longer_than_300_lines():
    lengths = class_lengths()
    assert lengths, "no class found: is PACKAGE right?"
    too_long = {name: lines for name, lines in lengths.items() if lines > MAX_CLASS_LINES}
    assert too_long == {}, f"classes longer than {MAX_CLASS_LINES} lines: split them into parts with one job each"


def test_no_lua_script_is_longer_than_250_lines():
    """Each script as written, its includes not spliced in: a long one moves a coherent piece to lua/includes/."""
    lengths = {path.name: len(path.read_text().splitlines()) for path in sorted(SCRIPTS.glob("*.lua"))}
    assert lengths, "no script found: is SCRIPTS right?"
    too_long = {name: lines for name, lines in lengths.items() if lines > MAX_SCRIPT_LINES}
    assert too_long == {}, f"scripts longer than {MAX_SCRIPT_LINES} lines: move a piece with one job to lua/includes/"


def test_stored_json_is_decoded_in_one_place():
    """JSON read back from Redis or a row may be anyone's, nested past Python's decoder: json.loads raises
    RecursionError there, which no `except ValueError` catches (a hand-off list, a worker's record and a
    workflow's tree each broke on it). Outside codec.py, every decode goes through core.decode_stored."""
    calls = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "core" / "protocol" / "codec.py":
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        names = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for alias in node.names if alias.name == "json"}  # json, under whatever name it is imported as
        for node in ast.walk(tree):
            if ((isinstance(node, ast.Attribute) and node.attr in ("loads", "load", "JSONDecoder")
                 and isinstance(node.value, ast.Name) and node.value.id in names)
                    or (isinstance(node, ast.ImportFrom) and node.module == "json"
                        and any(alias.name in ("loads", "load", "JSONDecoder") for alias in node.names))):
                calls.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert calls == [], "decode stored JSON with decode_stored, whose only error is ValueError"


def test_a_worker_is_told_its_options_in_one_object():
    """Worker takes one WorkerOptions, not a keyword argument per option: what the settings hand the core is
    one typed, frozen object that mypy checks and that is checked whole when made."""
    import dataclasses
    import inspect

    import pytest

    from echomq_django.core import Worker, WorkerOptions

    parameters = inspect.signature(Worker).parameters
    assert len(parameters) <= 8, list(parameters)
    assert parameters["options"].annotation in (WorkerOptions, "WorkerOptions")
    options = WorkerOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.concurrency = 2  # type: ignore[misc]
    with pytest.raises(ValueError, match="renewal every 1000 ms must be shorter than the lock duration of 1000 ms"):
        WorkerOptions(lock_duration_ms=1000, renew_interval_ms=1000)


def test_no_module_is_longer_than_450_lines():
    """A module past a few hundred lines holds several things (the issue that split beat.py, pool.py and conf.py
    found each doing three); the generated migrations aside."""
    lengths = {str(path.relative_to(PACKAGE.parent)): len(path.read_text().splitlines())
               for path in PACKAGE.rglob("*.py") if "migrations" not in path.parts}
    assert len(lengths) > 50, "too few modules found: is PACKAGE right?"
    too_long = {name: lines for name, lines in lengths.items() if lines > MAX_MODULE_LINES}
    assert too_long == {}, f"modules longer than {MAX_MODULE_LINES} lines: split them into parts with one job each"

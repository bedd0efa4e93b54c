"""The package's shape, held: no class longer than a reader holds in a few screens."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "echomq_django"
MAX_CLASS_LINES = 300


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

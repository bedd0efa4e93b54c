"""Reading a workflow back: the tree its record keeps, walked node by node, and a step's inputs assembled.

What is read may be another client's: a tree nested past any plan, or an input slot no workflow writes, is
refused (None, or ValueError) rather than walked.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..protocol.codec import decode_stored, deeper_than
from ..protocol.job import Job
from ..protocol.keys import QueueKeys

# Deeper nesting than this is refused: no real workflow comes close, and the
# plan and every step's inputs are built recursively.
MAX_DEPTH = 32
# The most jobs one workflow may have (a chord of 10,000 members fits).
MAX_JOBS = 100_000


# A tree that Plan._tree made nests at most this deep (two lists a level, one for a step); a deeper
# one is another client's, and is not walked (its workflow is still found from its queues and ids).
MAX_TREE_DEPTH = 2 * MAX_DEPTH + 1


@dataclass(frozen=True)
class TreeNode:
    """One node of a workflow's tree (Plan._tree's shape), as `tree_nodes` walks it."""

    depth: int
    label: str  # "header" or "callback" in a chord, "on error" for a handler, else ""
    kind: str = ""  # "chain", "group", "chord" or "linked"; "" for a step
    queue: str = ""  # a step's queue and job id
    job_id: str | None = None


def tree_nodes(tree: Any, *, handlers: bool = True) -> Iterator[TreeNode]:
    """Every node of a record's tree, depth first, in order (a scope's error handler after its parts); a node
    of another shape (a record another client wrote) is left out."""

    def walk(node: Any, depth: int, label: str) -> Iterator[TreeNode]:
        if isinstance(node, list) and len(node) == 2 and all(isinstance(part, str) for part in node):
            yield TreeNode(depth, label, queue=node[0], job_id=node[1])
        elif isinstance(node, list) and len(node) == 3 and node[0] in ("chain", "group", "chord", "linked"):
            yield TreeNode(depth, label, kind=node[0])
            for index, part in enumerate(node[1] if isinstance(node[1], list) else []):
                yield from walk(part, depth + 1, ("header", "callback")[min(index, 1)] if node[0] == "chord"
                                else ("", "link")[min(index, 1)] if node[0] == "linked" else "")
            if node[2] is not None and handlers:
                yield from walk(node[2], depth + 1, "on error")

    return walk(tree, 0, "")


def assemble(fields: dict[str, str]) -> Any:
    """The inputs gathered under their slots ("" alone, or "0", "1", "1.0"...) as one value: nested lists.

    ValueError for a slot no workflow writes (another client's): a part past the number of inputs, which
    would make a list that long, or deeper than a workflow nests.
    """
    if set(fields) == {""}:
        return decode_stored(fields[""])
    places: dict[str, list[int]] = {}  # each slot's place: its parts as numbers
    for slot in fields:
        parts = slot.split(".")
        if len(parts) > MAX_DEPTH or not all(part.isdigit() and part.isascii() and int(part) < len(fields)
                                             for part in parts):
            raise ValueError(f"an input slot no workflow writes: {slot[:100]!r}")
        places[slot] = [int(part) for part in parts]
    root: list[Any] = []
    for slot in sorted(fields, key=places.__getitem__):
        *path, last = places[slot]
        where = root
        for index in path:
            while len(where) <= index:
                where.append([])
            where = where[index]
        while len(where) <= last:
            where.append(None)
        where[last] = decode_stored(fields[slot])
    return root


def read_inputs(client: Any, keys: QueueKeys, job: Job, mode: str) -> list[Any]:
    """The arguments a workflow step gets before its own: its inputs (mode "1"), or a handler's id and error."""
    fields = {as_text(k): as_text(v) for k, v in client.hscan_iter(keys.inputs(job.id), count=1000)}
    if mode == "2":
        return [decode_stored(fields.get("0", "null")), decode_stored(fields.get("1", "null"))]
    return [assemble({slot: value for slot, value in fields.items() if not slot.startswith("d")})]


def as_text(value: Any) -> str:
    """A reply as text (a client that returns bytes)."""
    return value.decode() if isinstance(value, bytes) else value


def read_tree(text: str | None) -> Any:
    """A record's `tree` (Plan._tree's shape), or None: missing, no JSON, or nested deeper than any plan makes
    (MAX_TREE_DEPTH: another client's, which a walk of it would stop on with RecursionError)."""
    try:
        tree = decode_stored(text or "null")
    except ValueError:
        return None
    if text and text.count("[") > MAX_TREE_DEPTH and deeper_than(tree, MAX_TREE_DEPTH):
        return None
    return tree

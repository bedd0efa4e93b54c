"""docs/protocol.md's tables, the README's layout and links, CONTRIBUTING's markers, held to what they restate.

The events table against the events the scripts emit, the job hash table
against the fields the scripts write and core/protocol/job.py reads, and the meta row
of the keys table against the fields written to meta. The scripts are read as
Redis runs them (includes spliced in, comments dropped), so a field written by
an include counts for every script that includes it.
"""

import ast
import re
import tomllib
from pathlib import Path

from echomq_django.core.protocol.keys import SCRIPT_KEYS
from echomq_django.core.protocol.lua import script_names, script_source
from echomq_django.core.worker.sweeper import LAST_SWEEP_FIELD

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = ROOT / "docs" / "protocol.md"

STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
CALL = re.compile(r"redis\.p?call\(")
# HSET and HMSET take field/value pairs; the others one field.
PAIRED_WRITES = {"HSET", "HMSET"}
SINGLE_WRITES = {"HSETNX", "HINCRBY", "HINCRBYFLOAT"}


# -- reading Lua ---------------------------------------------------------------

def code_of(name: str) -> str:
    """The assembled script without its comments."""
    text = re.sub(r"--\[\[.*?\]\]", "", script_source(name), flags=re.DOTALL)
    return re.sub(r"--[^\n]*", "", text)


def balanced(text: str, start: int) -> str:
    """The text from `start` (just after an opening bracket) to its matching close."""
    depth, i, quote = 1, start, None
    while True:
        char = text[i]
        if quote:
            if char == "\\":
                i += 1
            elif char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char in "({[":
            depth += 1
        elif char in ")}]":
            depth -= 1
            if depth == 0:
                return text[start:i]
        i += 1


def split_args(text: str) -> list[str]:
    """Top-level comma-separated items of an argument list or table constructor."""
    items, depth, current, quote = [], 0, [], None
    for char in text:
        if quote:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "({[":
            depth += 1
        elif char in ")}]":
            depth -= 1
        elif char == "," and depth == 0:
            items.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    if "".join(current).strip():
        items.append("".join(current).strip())
    return items


def literal(expression: str, where: str) -> str:
    match = STRING.fullmatch(expression)
    assert match, f"{where}: {expression!r} is not a string literal; teach tests/unit/test_docs.py to read it"
    return match.group(1)


def table_items(code: str, table: str) -> list[str]:
    """What a local table built in pairs holds: its constructor's items, then each `t[#t + 1] = x`."""
    items = []
    for match in re.finditer(rf"local {table} = \{{", code):
        items += split_args(balanced(code, match.end()))
    items += re.findall(rf"{table}\[#{table} \+ 1\] = ([^\n]+)", code)
    return [item.strip() for item in items]


def hash_of(script: str, key: str) -> str:
    """Which hash a key expression names: a queue key (`meta`, ...) or `job`."""
    if match := re.fullmatch(r"KEYS\[(\d+)\]", key):
        name = SCRIPT_KEYS[script][int(match.group(1)) - 1]
        return "job" if name == "<id>" else name
    if "meta" in key.lower():
        return "meta"
    if "metrics" in key.lower():
        return "metrics"
    if "group" in key.lower() or key == "countKey":  # groups.lua's counters, which groupCount calls name
        return "groups"
    if key.endswith('.. ":in"'):  # a workflow step's inputs, or a workflow's results: one field per slot
        return "inputs"
    if key in ("stepsKey", "signalsKey"):  # a job's durable steps and signals: one field per name (docs/durable.md)
        return key[:-3]
    if "record" in key.lower():  # a workflow's record: its fields are named in protocol.md's prose
        return "record"
    assert re.fullmatch(r"jobKey|jobHash|prefix \.\. id", key), \
        f"{script}: cannot tell which hash {key!r} is; teach tests/unit/test_docs.py"
    return "job"


def hash_writes(script: str) -> set[tuple[str, str]]:
    """(hash, field) for every field the script writes to a hash (groupCount, an HINCRBY, included)."""
    code, writes = code_of(script), set()
    for match in re.finditer(r"groupCount\(", code):
        key, field, _by = split_args(balanced(code, match.end()))
        if (target := hash_of(script, key)) != "groups":  # includes the definition's own countKey
            writes.add((target, literal(field, f"{script}: groupCount")))
    for match in CALL.finditer(code):
        args = split_args(balanced(code, match.end()))
        command = STRING.fullmatch(args[0])
        if not command or command.group(1).upper() not in PAIRED_WRITES | SINGLE_WRITES:
            continue
        command_name, where = command.group(1).upper(), f"{script}: {command.group(1)}"
        target = hash_of(script, args[1])
        # Fields named in includes and protocol.md's prose (a task's rate record: "tat", one per job holding a start).
        if target in ("metrics", "groups", "record", "inputs", "<id>:nxt", "task-rate:<name>", "steps", "signals"):
            continue
        if command_name in SINGLE_WRITES:
            writes.add((target, literal(args[2], where)))
            continue
        pairs = []
        for arg in args[2:]:
            unpacked = re.fullmatch(r"unpack\((\w+)\)", arg)
            pairs += table_items(code, unpacked.group(1)) if unpacked else [arg]
        assert len(pairs) % 2 == 0, f"{where}: an odd number of fields and values"
        writes |= {(target, literal(field, where)) for field in pairs[::2]}
    return writes


def emitted(script: str) -> dict[str, set[str]]:
    """The events the script emits, each with the extra fields its emits carry."""
    code, events = code_of(script), {}
    for match in re.finditer(r"(?<!function )emitEvent\(", code):
        _prefix, event, _id, *extra = split_args(balanced(code, match.end()))
        where = f"{script}: emitEvent"
        assert len(extra) % 2 == 0, f"{where}: an odd number of extra fields and values"
        events.setdefault(literal(event, where), set()).update(literal(field, where) for field in extra[::2])
    return events


# -- reading the doc -----------------------------------------------------------

def doc_table(header: str) -> list[list[str]]:
    """The rows of the protocol.md table whose header row starts with `header`, as cells."""
    lines = PROTOCOL.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(header)]
    assert len(starts) == 1, f"protocol.md has {len(starts)} tables headed {header!r}"
    rows = []
    for line in lines[starts[0] + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def script_called(short: str) -> str:
    [name] = [name for name in script_names() if name.rsplit("-", 1)[0] == short]
    return name


def fields_read_by_job_py() -> set[str]:
    """The fields Job.from_hash reads: every `fields.get("...")` in core/protocol/job.py."""
    tree = ast.parse((ROOT / "echomq_django" / "core" / "protocol" / "job.py").read_text())
    return {node.args[0].value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "fields"
            and node.args and isinstance(node.args[0], ast.Constant)}


WRITES = {name: hash_writes(name) for name in script_names()}
EVENTS = {name: emitted(name) for name in script_names()}


# -- the tests -----------------------------------------------------------------

def test_the_readers_find_what_the_scripts_plainly_do():
    # Guards the parsing above: were it to find nothing, every comparison below would be vacuous.
    assert {("job", "atm"), ("job", "stc")} <= WRITES["moveStalledJobsToWait-8"]
    assert {("job", "tok"), ("job", "wids"), ("job", "startedOn")} <= WRITES["moveToActive-10"]
    assert {("job", "stacktrace"), ("job", "errc"), ("meta", "prioritySequence")} <= WRITES["moveToFinished-10"]
    assert ("meta", "paused") in WRITES["pauseQueue-5"]
    assert EVENTS["addJob-9"]["delayed"] == {"due"} and "removed" in EVENTS["cleanJobs-1"]
    assert {"name", "atm", "wids", "errc"} <= fields_read_by_job_py()


def test_the_events_table_lists_exactly_the_events_the_scripts_emit():
    rows = doc_table("| event |")
    documented = {ticked(event)[0]: (ticked(by), set(ticked(extra))) for event, by, extra in rows}
    emitted_by: dict[str, set[str]] = {}
    extra_fields: dict[str, set[str]] = {}
    for script, events in EVENTS.items():
        for event, extra in events.items():
            emitted_by.setdefault(event, set()).add(script)
            extra_fields.setdefault(event, set()).update(extra)
    assert set(documented) == set(emitted_by)
    for event, (by, extra) in documented.items():
        assert by, f"the row of {event!r} names no script"
        for short in by:
            assert script_called(short) in emitted_by[event], f"{short} does not emit {event!r}"
        assert extra == extra_fields[event], f"the fields of {event!r}"


def test_the_job_hash_table_lists_exactly_the_fields_written_and_read():
    rows = doc_table("| field | set by |")
    documented = {ticked(field)[0]: ticked(by) for field, by, _meaning in rows}
    written: dict[str, set[str]] = {}
    for script, writes in WRITES.items():
        for target, field in writes:
            if target == "job":
                written.setdefault(field, set()).add(script)
    assert set(documented) == set(written)
    assert fields_read_by_job_py() <= set(written), "core/protocol/job.py reads a field no script writes"
    for field, by in documented.items():
        assert by, f"the row of {field!r} names no script"
        for short in by:
            assert script_called(short) in written[field], f"{short} does not write {field!r}"


def test_the_keys_table_names_every_field_of_meta():
    [row] = [cells for cells in doc_table("| key |") if cells[0] == "`emq:{q}:meta`"]
    written = {field for writes in WRITES.values() for target, field in writes if target == "meta"}
    assert set(ticked(row[2])) == written | {LAST_SWEEP_FIELD}


def test_the_operations_list_gives_the_sweeps_keys_in_their_order():
    text = " ".join(PROTOCOL.read_text().split())
    match = re.search(r"`moveStalledJobsToWait-8\.lua`, 8 keys: ([^)]*)\)", text)
    assert match, "protocol.md no longer lists the sweep's keys"
    assert tuple(match.group(1).split(", ")) == SCRIPT_KEYS["moveStalledJobsToWait-8"]


def test_the_readme_layout_names_every_module():
    """Each module of the package and each benchmark is named in the README's layout table, in the row of its own
    folder: the row `echomq_django/core/worker/` names `pool`, and a `pool` named in another row does not count."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("## Layout"):].split("\n\n")[1]  # the table, to the next blank line
    rows = {}
    for line in table.splitlines()[2:]:
        path, what = line.strip("|").split("|", 1)
        rows[path.strip().strip("`")] = what
    modules = [path for folder in ("echomq_django", "bench") for path in (ROOT / folder).rglob("*.py")
               if path.stem != "__init__" and "migrations" not in path.parts]
    missing = sorted(str(path.relative_to(ROOT)) for path in modules
                     if f"`{path.stem}`" not in rows.get(f"{path.parent.relative_to(ROOT)}/", "")
                     and f"`{path.name}`" not in rows.get(f"{path.parent.relative_to(ROOT)}/", ""))
    assert not missing, f"the README's layout table does not name {missing} in the row of its folder"
    folders = {f"{path.parent.relative_to(ROOT)}/" for path in modules}
    assert set(rows) >= folders, f"the layout table has no row for {sorted(folders - set(rows))}"


def test_contributing_names_every_test_marker():
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    contributing = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    missing = [marker.split(":")[0] for marker in markers if f"`{marker.split(':')[0]}`" not in contributing]
    assert not missing, f"CONTRIBUTING.md does not describe the markers {missing}"


# -- the README and the pages it links ----------------------------------------------

README_MAX_LINES = 300
DOC_FILES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", path.read_text(encoding="utf-8")), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return [link for link in LINK.findall(text) if not re.match(r"[a-z][a-z+.-]*:", link)]


def test_the_anchor_reader_follows_githubs_rule():
    # Guards the rule above: were it wrong, every anchor below would be reported, or none.
    performance = anchors(ROOT / "docs" / "performance.md")
    assert "schedules-1000-schedules-under-1-3-and-10-schedulers-2026-12-02" in performance
    assert "echomq-django-groups" in anchors(ROOT / "docs" / "protocol.md")
    assert "settings" in anchors(ROOT / "docs" / "configuration.md")


def test_the_readme_stays_short():
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move detail to a page under docs/"


def test_the_readme_links_every_docs_page():
    linked = {(ROOT / link.split("#")[0]).resolve() for link in relative_links(ROOT / "README.md")}
    missing = [page.name for page in sorted((ROOT / "docs").glob("*.md")) if page.resolve() not in linked]
    assert not missing, f"README.md links no {missing}"


def test_every_relative_link_reaches_a_file_and_a_heading():
    broken = []
    for page in DOC_FILES:
        for link in relative_links(page):
            target, _, anchor = link.partition("#")
            path = (page.parent / target).resolve() if target else page
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {link} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{page.relative_to(ROOT)}: {link} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_file_the_docs_name_exists():
    """Each test, benchmark, script or module named in backticks is still there (a placeholder, `NAME`, aside)."""
    named = re.compile(r"`((?:tests|bench|lua|echomq_django|demo_project|docs)/[\w./-]+\.(?:py|lua|md|png))`")
    missing = [f"{page.relative_to(ROOT)}: {path}" for page in DOC_FILES
               for path in sorted(set(named.findall(page.read_text(encoding="utf-8"))))
               if not (ROOT / path).exists() and not re.search(r"[A-Z]{3,}", path)]
    assert not missing, missing

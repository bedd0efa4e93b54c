"""The Lua/Python contract, read from the scripts instead of copied: each script's
KEYS and ARGV as its header lists them, the keys it builds from the prefix, its includes."""

import re

import pytest

from echomq_django.core import EncodedJob
from echomq_django.core.protocol.keys import DERIVED_KEYS, SCRIPT_KEYS, QueueKeys
from echomq_django.core.protocol.lua import CONSTANTS, script_names, script_source, scripts_dir
from echomq_django.core.protocol.script_args import SCRIPT_ARGV, SCRIPT_ARGV_EACH, script_argv, script_argv_each

HEADER_KEY = re.compile(r"^\s*KEYS\[(\d+)\]\s+(\S+)", re.MULTILINE)
# "ARGV[i] name", the name followed by two spaces (then what it is) or by the line's end.
HEADER_ARGV = re.compile(r"^\s*ARGV\[(\d+)\] ([a-z_]+)(?:  |$)", re.MULTILINE)
HEADER_ARGV_EACH = re.compile(r"^\s*ARGV\[n\+(\d+)\] ([a-z_]+)(?:  |$)", re.MULTILINE)
# The line that opens a header's repeated values: "... ARGV[n+1] to ARGV[n+8] with n = 9, 17, 25, ...:"
HEADER_EACH_START = re.compile(r"ARGV\[n\+1\](?: to ARGV\[n\+(\d+)\])? with n = (\d+), (\d+), (\d+), \.\.\.:")
BUILT_FROM_PREFIX = re.compile(r'[pP]refix \.\. (?:"([^"]*)"|([A-Za-z_\[\]]+)(?: \.\. "([^"]*)")?)')


def header(name: str) -> str:
    text = (scripts_dir() / f"{name}.lua").read_text()
    return text[:text.index("]]")]


def test_every_script_has_its_keys_in_the_table_and_the_file_name_counts_them():
    assert set(SCRIPT_KEYS) == set(script_names())
    for name, keys in SCRIPT_KEYS.items():
        assert int(name.rsplit("-", 1)[1]) == len(keys), name


@pytest.mark.parametrize("name", sorted(SCRIPT_KEYS))
def test_the_header_lists_the_keys_the_wrappers_send(name):
    listed = HEADER_KEY.findall(header(name))
    assert [int(index) for index, _ in listed] == list(range(1, len(listed) + 1)), f"{name}: KEYS out of order"
    assert tuple(key for _, key in listed) == SCRIPT_KEYS[name]


def test_every_script_has_its_argv_in_the_table():
    assert set(SCRIPT_ARGV) == set(script_names())
    assert set(SCRIPT_ARGV_EACH) <= set(SCRIPT_ARGV)


@pytest.mark.parametrize("name", sorted(SCRIPT_ARGV))
def test_the_header_lists_the_argv_the_wrappers_send(name):
    text = header(name)
    fixed, each = HEADER_ARGV.findall(text), HEADER_ARGV_EACH.findall(text)
    assert [int(index) for index, _ in fixed] == list(range(1, len(fixed) + 1)), f"{name}: ARGV out of order"
    assert [int(index) for index, _ in each] == list(range(1, len(each) + 1)), f"{name}: ARGV[n+i] out of order"
    assert tuple(argv for _, argv in fixed) == SCRIPT_ARGV[name]
    assert tuple(argv for _, argv in each) == SCRIPT_ARGV_EACH.get(name, ())
    starts = HEADER_EACH_START.findall(text)
    if each:
        [(last, *n)] = starts
        width, first = len(each), len(fixed)
        assert int(last or 1) == width and [int(i) for i in n] == [first, first + width, first + 2 * width], name
    else:
        assert not starts, name


@pytest.mark.parametrize("name", sorted(SCRIPT_ARGV))
def test_the_script_reads_the_argv_its_header_lists(name):
    """The body reads ARGV[i] only for a listed i, and a repeated part in steps of its width from its start."""
    text = (scripts_dir() / f"{name}.lua").read_text()
    body = "\n".join(line.split("--")[0] for line in text[text.index("]]") + 2:].splitlines())
    fixed, each = SCRIPT_ARGV[name], SCRIPT_ARGV_EACH.get(name, ())
    assert {int(i) for i in re.findall(r"ARGV\[(\d+)\]", body)} <= set(range(1, len(fixed) + 1)), name
    loops = re.findall(r"for i = (\d+), #ARGV, (\d+) do", body)
    offsets = {int(k) for k in re.findall(r"ARGV\[i \+ (\d+)\]", body)}
    if not each:
        assert not loops and not offsets and "ipairs(ARGV)" not in body, name
    elif not fixed and len(each) == 1:
        assert "ipairs(ARGV)" in body, name
    else:
        assert loops == [(str(len(fixed) + 1), str(len(each)))], name
        assert offsets == set(range(1, len(each))), name


def test_script_argv_orders_the_values_by_the_table_and_refuses_a_wrong_name():
    assert script_argv("retryJob-7", job_id="j", record_ms=1, prefix="p") == ["p", "j", 1]
    assert script_argv_each("extendLocks-1", token="t", job_id="j") == ["j", "t"]
    with pytest.raises(TypeError, match="missing job_id, unknown none"):
        script_argv("retryJob-7", prefix="p", record_ms=1)
    with pytest.raises(TypeError, match="missing none, unknown jobid"):
        script_argv("retryJob-7", prefix="p", job_id="j", record_ms=1, jobid="j")
    with pytest.raises(TypeError, match="missing job_id, unknown jobid"):
        script_argv("retryJob-7", prefix="p", record_ms=1, jobid="j")


def test_the_table_names_the_same_keys_as_queue_keys():
    keys = QueueKeys("q", "p")
    named = {keys.wait, keys.paused, keys.active, keys.stalled, keys.failed, keys.completed, keys.delayed,
             keys.prioritized, keys.stalled_check, keys.meta, keys.marker, keys.id_counter, keys.add_record("T"),
             keys.fetch_record("T"), keys.change_record("T"), keys.failed, keys.job("J"), keys.logs("J"),
             keys.schedule("S"), keys.limiter, keys.sent, keys.deferred, keys.edge_pages("J"), keys.task_rate("S"),
             keys.parked, keys.steps("J"), keys.signals("J")}
    for name in SCRIPT_KEYS:
        assert set(keys.for_script(name, token="T", state="failed", id="J", name="S")) <= named, name


def test_scripts_build_from_the_prefix_only_the_derived_keys():
    derived = set()
    for path in [*scripts_dir().glob("*.lua"), *(scripts_dir() / "includes").glob("*.lua")]:
        for literal, variable, suffix in BUILT_FROM_PREFIX.findall(path.read_text()):
            derived.add(literal if not variable else "<id>" + (suffix or ""))
    # "fetch:" .. token is the record of a token: "fetch:<token>"; "metrics:" .. minute a minute's metrics;
    # "group:" .. group a group's list.
    placeholders = {"metrics:": "<minute>", "group:": "<name>", "wf:": "<workflow>", "dedupe:": "<key>",
                    "dedupe-id:": "<id>"}
    derived = {key + placeholders.get(key, "<token>") if key.endswith(":") else key for key in derived}
    assert derived == set(DERIVED_KEYS)


def test_an_include_is_spliced_once_even_when_named_twice():
    source = script_source("moveToActive-10")  # names emitEvent, which jobFields and promoteDue name too
    assert source.count("local function emitEvent(") == 1
    assert "-- @include" not in source



def test_the_scripts_know_the_same_reserved_ids_as_python():
    from echomq_django.core.protocol.keys import RESERVED_IDS

    text = script_source("cleanJobs-1")  # jobKey, which names the generated include "reservedIds"
    listed = text[text.index("local RESERVED_IDS = {"):text.index("}\n", text.index("local RESERVED_IDS = {"))]
    assert set(re.findall(r'\["([a-z-]+)"\] = true', listed)) == RESERVED_IDS


def test_every_name_of_a_queue_key_is_refused_as_a_job_id():
    from echomq_django.core.protocol.keys import RESERVED_IDS

    names = {name for keys in SCRIPT_KEYS.values() for name in keys} | set(DERIVED_KEYS)
    # A name with a placeholder or a ":" cannot be an id (ids hold no ":").
    assert {name for name in names if "<" not in name and ":" not in name} <= RESERVED_IDS


def test_the_scheduler_and_fire_schedule_allow_a_record_as_far_ahead_of_redis():
    from echomq_django.core.defaults import EARLY_MS

    [in_lua] = re.findall(r"^local EARLY_MS = (\d+)$", script_source("fireSchedule-6"), re.MULTILINE)
    assert int(in_lua) == EARLY_MS


def code_of(lua: str) -> str:
    """Lua text without its comments."""
    return "\n".join(line.split("--")[0] for line in re.sub(r"--\[\[.*?\]\]", "", lua, flags=re.DOTALL).splitlines())


# A number a script may write out although a bound has the same value: another fact, by chance.
# A day, as long as MAX_PAUSE_MS but not it: the fetch record's lifetime, and a deduplicated caller id's (dedupe-id).
NOT_A_COPY = {("moveToActive-10.lua", 86_400_000), ("addJob-9.lua", 86_400_000)}


def test_the_scripts_take_the_shared_bounds_from_python_and_copy_none():
    """A bound both sides hold a number to (a priority, attempts, a pause...) reaches the scripts from Python."""
    for path in [*scripts_dir().glob("*.lua"), *(scripts_dir() / "includes").glob("*.lua")]:
        code = code_of(path.read_text())
        for name, value in CONSTANTS.items():
            assert not re.search(rf"\blocal {name}\b", code), f"{path.name} defines {name} itself"
            # Small numbers (15, 100) are too common to tell; a large one written out is a copy.
            if abs(value) >= 1000 and (path.name, abs(value)) not in NOT_A_COPY:
                assert not re.search(rf"(?<![\w.]){abs(value)}(?![\w.])", code), f"{path.name} writes out {name}"
    for name in script_names():
        source = script_source(name)
        for limit, value in CONSTANTS.items():
            if re.search(rf"\b{limit}\b", code_of(source)):
                assert f"local {limit} = {value}\n" in source, f"{name} uses {limit} without the include \"constants\""


def test_the_scripts_count_the_all_time_totals_python_reads():
    from echomq_django.core.reading.metrics import TOTALS

    [listed] = re.findall(r"^local TOTAL_FIELDS = \{(.*)\}$", script_source("moveToFinished-10"), re.MULTILINE)
    assert set(re.findall(r"(\w+) = true", listed)) == set(TOTALS)


def test_an_encoded_job_has_the_fields_of_add_jobs_argv_in_its_order():
    assert EncodedJob._fields == SCRIPT_ARGV_EACH["addJob-9"]

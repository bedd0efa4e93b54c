"""The Lua/Python contract, read from the scripts instead of copied: each script's
KEYS as its header lists them, the keys it builds from the prefix, its includes."""

import re

import pytest

from echomq_django.core.keys import DERIVED_KEYS, SCRIPT_KEYS, QueueKeys
from echomq_django.core.lua import script_names, script_source, scripts_dir

HEADER_KEY = re.compile(r"^\s*KEYS\[(\d+)\]\s+(\S+)", re.MULTILINE)
BUILT_FROM_PREFIX = re.compile(r'prefix \.\. (?:"([^"]*)"|([A-Za-z_\[\]]+)(?: \.\. "([^"]*)")?)')


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


def test_the_table_names_the_same_keys_as_queue_keys():
    keys = QueueKeys("q", "p")
    named = {keys.wait, keys.paused, keys.active, keys.stalled, keys.failed, keys.completed, keys.delayed,
             keys.prioritized, keys.stalled_check, keys.meta, keys.marker, keys.id_counter, keys.add_record("T"),
             keys.fetch_record("T"), keys.failed, keys.job("J"), keys.logs("J"), keys.schedule("S"), keys.limiter}
    for name in SCRIPT_KEYS:
        assert set(keys.for_script(name, token="T", state="failed", id="J", name="S")) <= named, name


def test_scripts_build_from_the_prefix_only_the_derived_keys():
    derived = set()
    for path in [*scripts_dir().glob("*.lua"), *(scripts_dir() / "includes").glob("*.lua")]:
        for literal, variable, suffix in BUILT_FROM_PREFIX.findall(path.read_text()):
            derived.add(literal if not variable else "<id>" + (suffix or ""))
    # "fetch:" .. token is the record of a token: "fetch:<token>"; "metrics:" .. minute a minute's metrics;
    # "group:" .. group a group's list.
    placeholders = {"metrics:": "<minute>", "group:": "<name>"}
    derived = {key + placeholders.get(key, "<token>") if key.endswith(":") else key for key in derived}
    assert derived == set(DERIVED_KEYS)


def test_an_include_is_spliced_once_even_when_named_twice():
    source = script_source("moveToActive-10")  # names emitEvent, which jobFields and promoteDue name too
    assert source.count("local function emitEvent(") == 1
    assert "-- @include" not in source



def test_the_scripts_know_the_same_reserved_ids_as_python():
    from echomq_django.core.keys import RESERVED_IDS

    text = (scripts_dir() / "includes" / "jobKey.lua").read_text()
    listed = text[text.index("local RESERVED_IDS = {"):text.index("}\n", text.index("local RESERVED_IDS = {"))]
    assert set(re.findall(r'\["([a-z-]+)"\] = true', listed)) == RESERVED_IDS


def test_every_name_of_a_queue_key_is_refused_as_a_job_id():
    from echomq_django.core.keys import RESERVED_IDS

    names = {name for keys in SCRIPT_KEYS.values() for name in keys} | set(DERIVED_KEYS)
    # A name with a placeholder or a ":" cannot be an id (ids hold no ":").
    assert {name for name in names if "<" not in name and ":" not in name} <= RESERVED_IDS


def test_the_scheduler_and_fire_schedule_allow_a_record_as_far_ahead_of_redis():
    from echomq_django.core.beat import EARLY_MS

    [in_lua] = re.findall(r"^local EARLY_MS = (\d+)$", script_source("fireSchedule-6"), re.MULTILINE)
    assert int(in_lua) == EARLY_MS

"""Finding the Lua scripts and assembling each one from its includes.

A script names the shared pieces it uses with lines like

    -- @include "emitEvent"

and an include may name includes of its own. Each piece is spliced in once,
where it is first named, before anything that names it, so the assembled text
is one self-contained script whose text never changes.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from pathlib import Path

from .. import defaults
from ..errors import MAX_RETRY_AFTER_S
from .job import MAX_COUNTER_CHARS
from .keys import MAX_NAME_LENGTH, MINUTE_MS, NAME_FIRST, NAME_REST, RESERVED_IDS
from .options import MAX_ATTEMPTS, MAX_DELAY_MS, MAX_PRIORITY, MIN_PRIORITY

_INCLUDE = re.compile(r'^-- @include "([A-Za-z]+)"$', re.MULTILINE)

# The numbers the scripts share with the Python side, each named as that side
# names it (but MAX_PAUSE_MS, errors.py's MAX_RETRY_AFTER_S in ms: the longest
# RateLimited pause of a queue that moveToActive honours).
CONSTANTS = {
    "MIN_PRIORITY": MIN_PRIORITY,
    "MAX_PRIORITY": MAX_PRIORITY,
    "MAX_ATTEMPTS": MAX_ATTEMPTS,
    "MAX_COUNTER_CHARS": MAX_COUNTER_CHARS,
    "MAX_DELAY_MS": MAX_DELAY_MS,
    "MAX_PAUSE_MS": MAX_RETRY_AFTER_S * 1000,
    "MAX_METRICS_MINUTES": defaults.MAX_METRICS_MINUTES,
    "EARLY_MS": defaults.EARLY_MS,
    "WORKFLOW_DELIVERIES_PER_CALL": defaults.WORKFLOW_DELIVERIES_PER_CALL,
    "WORKFLOW_REASON_BYTES": defaults.WORKFLOW_REASON_BYTES,
    "MINUTE_MS": MINUTE_MS,
}

# Includes written here rather than read from a file: facts the scripts share
# with the Python side, defined once on that side. Constants, so a script's
# text (and its SHA) is the same for every call.
GENERATED_INCLUDES = {
    # What may be a name: keys.py's rule, as a Lua pattern (groupOf in includes/groups.lua).
    "names": (f'local NAME_PATTERN = "^[{NAME_FIRST}][{NAME_REST}]*$"\n'
              f"local MAX_NAME_LENGTH = {MAX_NAME_LENGTH}\n"),
    # The ids that are a queue key's name, not a job's: keys.py's RESERVED_IDS (jobKey in includes/jobKey.lua).
    "reservedIds": "local RESERVED_IDS = {\n" + "".join(f'  ["{name}"] = true,\n' for name in sorted(RESERVED_IDS))
                   + "}\n",
    "constants": "".join(f"local {name} = {value}\n" for name, value in CONSTANTS.items()),
}


def scripts_dir() -> Path:
    """Where the scripts are: inside the installed package, or `lua/` of a checkout."""
    packaged = importlib.resources.files("echomq_django") / "lua"
    if packaged.is_dir():
        return Path(str(packaged))
    checkout = Path(__file__).resolve().parents[3] / "lua"
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(
        f"echomq's Lua scripts are neither in {packaged} nor in {checkout}; "
        "reinstall the package"
    )


@functools.cache
def script_names() -> tuple[str, ...]:
    """Every script's file name without `.lua`, e.g. `moveToActive-10`."""
    return tuple(sorted(p.stem for p in scripts_dir().glob("*.lua")))


@functools.cache
def script_source(name: str) -> str:
    """The text of one script with its `-- @include` lines replaced by the includes."""
    return assemble((scripts_dir() / f"{name}.lua").read_text(encoding="utf-8"))


def assemble(text: str) -> str:
    """Lua `text` with its `-- @include` lines replaced by the includes, each spliced in once."""
    directory = scripts_dir()
    spliced: set[str] = set()

    def splice(text: str) -> str:
        return _INCLUDE.sub(include, text)

    def include(match: re.Match[str]) -> str:
        part = match.group(1)
        if part in spliced:
            return f"-- {part}: spliced in above"
        spliced.add(part)
        if part in GENERATED_INCLUDES:
            return GENERATED_INCLUDES[part]
        return splice((directory / "includes" / f"{part}.lua").read_text(encoding="utf-8"))

    return splice(text)

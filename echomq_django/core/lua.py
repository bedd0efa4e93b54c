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

_INCLUDE = re.compile(r'^-- @include "([A-Za-z]+)"$', re.MULTILINE)


def scripts_dir() -> Path:
    """Where the scripts are: inside the installed package, or `lua/` of a checkout."""
    packaged = importlib.resources.files("echomq_django") / "lua"
    if packaged.is_dir():
        return Path(str(packaged))
    checkout = Path(__file__).resolve().parents[2] / "lua"
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
    directory = scripts_dir()
    spliced: set[str] = set()

    def assemble(text: str) -> str:
        return _INCLUDE.sub(include, text)

    def include(match: re.Match[str]) -> str:
        part = match.group(1)
        if part in spliced:
            return f"-- {part}: spliced in above"
        spliced.add(part)
        return assemble((directory / "includes" / f"{part}.lua").read_text(encoding="utf-8"))

    return assemble((directory / f"{name}.lua").read_text(encoding="utf-8"))

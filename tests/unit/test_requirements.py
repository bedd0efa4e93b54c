"""The Django versions the package claims: the requirement refuses the one it cannot serve, and CI runs each other."""

import re
import tomllib
from pathlib import Path

import django
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
# The newest release of each Django minor near the supported ones (2026-12-05): what a line that installs
# "the newest" of a range gets, and what a user's pip picks within a minor.
RELEASES = ["5.1.15", "5.2.19", "6.0.10", "6.1.3"]


def django_requirement() -> Requirement:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    [requirement] = [Requirement(line) for line in dependencies if Requirement(line).name == "django"]
    return requirement


def ci_django_requirements() -> list[Requirement]:
    """The Django requirement of each virtual environment .ci/run installs (`install_line NAME PYTHON "django..."`)."""
    found = re.findall(r'^install_line \S+ \S+ "(django[^"]*)"', (ROOT / ".ci/run").read_text(), re.MULTILINE)
    return [Requirement(line) for line in found]


def minor(version: str) -> str:
    return ".".join(map(str, Version(version).release[:2]))


def test_django_6_0_is_refused_and_5_2_and_6_1_are_allowed():
    """6.0's `task()` passes no options to the backend's Task, so `@task(attempts=5)` is a TypeError there."""
    specifier = django_requirement().specifier
    assert [version for version in ("5.1.15", "5.2", "5.2.19", "6.0", "6.0.10", "6.1", "6.1.3", "7.0")
            if specifier.contains(version)] == ["5.2", "5.2.19", "6.1", "6.1.3"]


def test_the_installed_django_is_one_the_package_supports():
    assert django_requirement().specifier.contains(django.__version__), django.__version__


def test_ci_runs_the_newest_release_of_each_django_minor_the_package_claims():
    """Each CI line installs the newest Django its requirement admits; together they cover every minor claimed."""
    lines = ci_django_requirements()
    assert len(lines) >= 2, "no Django requirement found in .ci/run's install_line calls"
    tested = set()
    for line in lines:
        admitted = [version for version in RELEASES if line.specifier.contains(version)]
        assert admitted, f"{line}: admits none of {RELEASES}"
        newest = max(admitted, key=Version)
        assert django_requirement().specifier.contains(newest), f"{line} installs {newest}, which the package refuses"
        tested.add(minor(newest))
    claimed = {minor(version) for version in RELEASES if django_requirement().specifier.contains(version)}
    assert tested == claimed, f"the package claims Django {sorted(claimed)}, CI runs {sorted(tested)}"

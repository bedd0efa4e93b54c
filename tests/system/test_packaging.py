"""The wheel carries the scripts, its types and its licence, and the runtime stands without Django."""

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_the_code_passes_the_linter():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise",
                             "echomq_django", "tests", "bench", "demo_project", "manage.py"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(360)
def test_the_package_passes_the_type_checker():
    # What to check and how strictly is [tool.mypy] in pyproject.toml (echomq_django: core strict, the Django layer
    # as strict as Django, untyped, allows).
    result = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(360)
def test_the_package_passes_the_type_checker_without_the_otel_extra(tmp_path):
    """`otel` is an optional extra: core/producing/tracing.py type-checks where opentelemetry is not installed too."""
    python = environment_without(tmp_path / "venv", "opentelemetry")
    result = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", "--python-executable", str(python),
                             "--cache-dir", str(tmp_path / "mypy-cache")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def environment_without(path: Path, hidden: str) -> Path:
    """A virtual environment seeing this one's packages except `hidden`'s (links, no copies); its python."""
    import sysconfig

    venv.create(path, with_pip=False)
    [site_packages] = (path / "lib").glob("python3*/site-packages")
    for installed in {Path(sysconfig.get_path(name)) for name in ("purelib", "platlib")}:
        for entry in installed.iterdir():
            if not entry.name.startswith(hidden) and not (site_packages / entry.name).exists():
                (site_packages / entry.name).symlink_to(entry)
    python = path / "bin" / "python"
    # Without this the test would pass where nothing is hidden, or where redis-py is missing too.
    probe = f"import importlib.util as u; assert u.find_spec({hidden!r}) is None and u.find_spec('redis')"
    subprocess.run([python, "-c", probe], check=True, timeout=60)
    return python


def test_the_runtime_imports_no_django():
    code = (
        "import sys; sys.modules['django'] = None\n"  # any import of django now fails
        "import echomq_django.core as core\n"
        "assert not any(name == 'django' or name.startswith('django.') for name in sys.modules if sys.modules[name])\n"
        "print(len(core.__all__))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


@pytest.mark.timeout(960)
@pytest.mark.slow
def test_the_installed_wheel_loads_every_script_outside_the_repository(tmp_path, redis_url):
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    [wheel] = (tmp_path / "dist").glob("echomq_django-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        [metadata] = [name for name in names if name.endswith(".dist-info/METADATA")]
        headers = archive.read(metadata).decode().partition("\n\n")[0].splitlines()
    assert "echomq_django/py.typed" in names, "type checkers read the package's hints only with py.typed"
    assert "License-Expression: BSD-3-Clause" in headers
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "--quiet", str(wheel)], check=True, timeout=600)

    check = (
        "import sys, echomq_django\n"
        "from echomq_django.core import connect\n"
        "from echomq_django.core import Scripts\n"
        "from echomq_django.core.protocol.lua import script_names, script_source, scripts_dir\n"
        f"assert str(scripts_dir()).startswith({str(env_dir)!r}), scripts_dir()\n"
        "client = connect(sys.argv[1])\n"
        "Scripts(client)\n"
        "loaded = {name: client.script_load(script_source(name)) for name in script_names()}\n"
        "assert all(client.script_exists(*loaded.values()))\n"
        "print(' '.join(loaded))"
    )
    result = subprocess.run([python, "-c", check, redis_url], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    shipped = set(result.stdout.split())
    in_repo = {path.stem for path in (ROOT / "lua").glob("*.lua")}
    assert shipped == in_repo and "moveStalledJobsToWait-8" in shipped


def test_the_django_layer_uses_only_what_core_exports():
    import ast

    import echomq_django.core as core

    package = ROOT / "echomq_django"
    wrong = []
    for path in package.rglob("*.py"):
        if package / "core" in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level == 0 and not (node.module or "").startswith("echomq_django."):
                continue  # django.core and the like
            module = (node.module or "").removeprefix("echomq_django.")
            if module == "core":
                wrong += [f"{path.name}: {alias.name}" for alias in node.names if alias.name not in core.__all__]
            elif module.startswith("core.") or module == "" and any(a.name == "core" for a in node.names):
                wrong.append(f"{path.name}: imports {node.module or 'core'}")
    assert wrong == [], "import these from echomq_django.core, and export them in its __all__"


def package_imports() -> dict[str, set[str]]:
    """Each module of the package -> the modules of the package it imports, at its top or inside a function."""
    import ast

    package = ROOT / "echomq_django"
    modules = {}
    for path in package.rglob("*.py"):
        if "migrations" not in path.parts:
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            modules[name] = path
    imports: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package_of = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package_of.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
                # `from . import child` imports the module child; `from .conf import x`, the module conf.
                submodules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules]
                found = submodules if len(submodules) == len(node.names) else [base, *submodules]
            else:
                continue
            imports[name] |= {module for module in found if module in modules and module != name}
    return imports


def test_the_package_has_no_import_circle():
    """Each module imports only modules below it (a function-level import counts too), so the layers read
    bottom to top: a circle is held together by import order alone and breaks when it changes."""
    import graphlib

    try:
        order = list(graphlib.TopologicalSorter(package_imports()).static_order())
    except graphlib.CycleError as error:
        # graphlib lists the circle from each module to one that imports it: reversed, "a imports b imports ..."
        pytest.fail(f"an import circle: {' imports '.join(reversed(error.args[1]))}")
    assert "echomq_django.core.protocol.keys" in order


# The package's layers, bottom to top: a module may import its own layer and those below, never one above. The
# Django app sits on core, and its entry points (the admin, the management commands, the URLs) on the app.
LAYERS = [["echomq_django.core.defaults", "echomq_django.core.errors"], ["echomq_django.core.protocol"],
          ["echomq_django.core.producing"], ["echomq_django.core.reading"], ["echomq_django.core.worker"],
          ["echomq_django.core.schedules"], ["echomq_django.core"], ["echomq_django"],
          ["echomq_django.admin", "echomq_django.management", "echomq_django.urls", "echomq_django.views"]]


def layer_of(module: str) -> int:
    """The layer of the longest entry of LAYERS that is module or a package holding it."""
    entries = [(len(entry), index) for index, layer in enumerate(LAYERS) for entry in layer
               if module == entry or module.startswith(entry + ".")]
    return max(entries)[1]


def test_no_module_imports_a_layer_above_its_own():
    """core's sub-packages are layers: the protocol knows nothing of queues, the producers nothing of workers, the
    worker nothing of the scheduler, and nothing in core knows the Django app. An upward import is a layer that
    cannot be read, tested or replaced without the one above it."""
    upward = sorted(f"{module} imports {imported}" for module, imports in package_imports().items()
                    for imported in imports if layer_of(imported) > layer_of(module))
    assert upward == [], "imports that run up a layer"
    assert (layer_of("echomq_django.core.worker.pool"), layer_of("echomq_django.admin.bulk")) == (4, 8)


# redis-py's internals: what only the fast path (core/protocol/own_connections.py, its class OwnConnections) may use.
REDIS_INTERNALS = {"connection_kwargs", "connection_class", "send_packed_command", "send_command", "read_response",
                   "can_read", "register_connect_callback", "pack_command", "_sock"}
FAST_PATH = ("own_connections.py", "OwnConnections")
# Private-looking names that are public API where they come from: Django's Model._meta, Python's os._exit, a
# NamedTuple's _asdict.
NOT_PRIVATE = {"_meta", "_exit", "_asdict"}


def test_only_the_fast_path_uses_redis_py_internals():
    """Outside OwnConnections, the package reaches redis-py through its public API only: no name of the list
    above, and no private attribute (`x._name`, `getattr(x, "_name")`) that the package does not define itself."""
    import ast

    package = ROOT / "echomq_django"
    trees = {path: ast.parse(path.read_text()) for path in package.rglob("*.py")}
    own_names = set()  # the private names the package gives its own functions, classes and attributes
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own_names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                own_names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own_names.add(node.id)
    wrong = []
    for path, tree in trees.items():
        fast = range(0)
        if path.name == FAST_PATH[0]:
            [cls] = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == FAST_PATH[1]]
            fast = range(cls.lineno, (cls.end_lineno or cls.lineno) + 1)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                name = node.attr
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "setattr", "hasattr")
                  and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)):
                name = str(node.args[1].value)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if "hiredis" in modules and path.name != FAST_PATH[0]:
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: imports hiredis")
                continue
            else:
                continue
            private = name.startswith("_") and not name.startswith("__") and name not in own_names | NOT_PRIVATE
            if (name in REDIS_INTERNALS or private) and node.lineno not in fast:
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert wrong == [], f"redis-py's internals are for {FAST_PATH[1]} in core/{FAST_PATH[0]} alone: {wrong}"


def test_the_installed_redis_py_is_one_the_package_supports():
    """The redis-py requirement has both bounds (the fast path reads its internals), and the installed one is in."""
    import tomllib

    import redis
    from packaging.requirements import Requirement

    [requirement] = [Requirement(line) for line in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "dependencies"] if Requirement(line).name == "redis"]
    operators = {spec.operator for spec in requirement.specifier}
    assert operators & {">=", ">"} and operators & {"<", "<="}, f"{requirement}: a lower and an upper bound"
    assert requirement.specifier.contains(redis.__version__), \
        f"redis-py {redis.__version__} is installed; the package supports {requirement.specifier}"

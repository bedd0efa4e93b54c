"""The README's demo, end to end: a private redis-server, a worker that dies, the sweeper, the admin data."""

import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import wait_until
from tests.redis_servers import free_port

ROOT = Path(__file__).resolve().parents[2]
# The demo starts its own redis-server; it runs on Python 3.11 with Django 5.2 where no newer Python is.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # the story takes about 25 s


def process_table() -> dict[int, list[tuple[int, str]]]:
    """Parent pid -> [(pid, start time), ...] of every process, read from /proc."""
    children: dict[int, list[tuple[int, str]]] = {}
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended meanwhile
            continue
        children.setdefault(int(fields[1]), []).append((int(stat_file.parent.name), fields[19]))
    return children


def descendants(root: int) -> set[tuple[int, str]]:
    """(pid, start time) of every process under `root`; the start time tells a reused pid apart."""
    table, found, parents = process_table(), set(), [root]
    while parents:
        for child in table.get(parents.pop(), []):
            found.add(child)
            parents.append(child[0])
    return found


def still_running(process: tuple[int, str]) -> bool:
    pid, started = process
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[19] == started and fields[0] != "Z"


class Demo:
    """`manage.py echomq_demo` as a child process, with every process it starts recorded while it runs."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.process = subprocess.Popen([sys.executable, "manage.py", "echomq_demo", *args], cwd=ROOT, env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.started: set[tuple[int, str]] = set()
        self.watcher = threading.Thread(target=self._watch, daemon=True)
        self.watcher.start()

    def _watch(self) -> None:
        while self.process.poll() is None:
            self.started |= descendants(self.process.pid)
            threading.Event().wait(0.05)

    def finish(self, timeout_s: float) -> tuple[str, str]:
        try:
            out, err = self.process.communicate(timeout=timeout_s)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.communicate()
        self.watcher.join(5)
        return out, err

    def leftovers(self) -> list[tuple[int, str]]:
        return [process for process in self.started if still_running(process)]


@pytest.fixture
def demo_env(subprocess_env, tmp_path) -> dict[str, str]:
    env = {key: value for key, value in subprocess_env.items() if key != "ECHOMQ_REDIS_URL"}
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'demo.sqlite3'}"
    (tmp_path / "tmp").mkdir()
    env["TMPDIR"] = str(tmp_path / "tmp")  # where the private redis-server's folder goes
    return env


def test_the_demo_tells_the_whole_story(demo_env, tmp_path):
    demo = Demo(demo_env, "--no-serve")
    out, err = demo.finish(280)  # under the module's 300 s: a slow machine tells the 25 s story slowly
    assert demo.process.returncode == 0, err
    assert "started a private redis-server" in out
    [password] = re.findall(r"admin user: admin / (\S+)", out)
    assert "worker 1 died (exit 1) in the middle of job" in out
    rows = {line.split()[1]: line.split() for line in out.splitlines() if re.match(r"demo\.\d+ ", line)}
    assert rows["crash"][2:5] == ["completed", "2", "1"], "recovered from its stall, then completed"
    assert rows["doomed"][2:4] == ["failed", "2"]
    assert rows["flaky"][2:4] == ["completed", "2"]
    assert re.search(r'^job demo\.\d+ \(import_rows\) logged 5 lines and last reported \{"percent": 100, "rows": 5\}: '
                     r"see its page, /admin/echomq/job/demo/job/demo\.\d+/$", out, re.M)
    assert "Django task add(2, 3) through the Tasks framework: SUCCESSFUL, return value 5" in out
    assert re.search(r"^workers of 'demo' in the registry now \(the admin's Workers page\): pid \d+, threads x1, "
                     r"\d+ done; worker 1 \(pid \d+\) dropped out with its lock duration$", out, re.M)
    assert re.search(r"^workflow w\w+: a chord of three import_rows jobs, then add_up once with their results: "
                     r"succeeded, 60 rows \(its page: /admin/echomq/job/demo/workflow/w\w+/\)$", out, re.M)
    assert re.search(r"^Celery-style checkout \(demo_project/shop/tasks.py: .*\): SUCCESS, 'receipt for 600 to "
                     r"ada@example.com'; the charge ran 2 times \(self.retry once\)$", out, re.M)
    assert re.search(r"^durable task approve_order\(7\) .*: job \S+ is parked, holding no worker slot", out, re.M)
    assert re.search(r"^signal \"approved\" sent: it resumed and returned \{'order': 7, 'total': 70, "
                     r"'approved_by': 'the demo'\}$", out, re.M)
    assert re.search(r"^cancel of job heavy\.\d+ \(export\) while it runs: stopping;", out, re.M)
    assert re.search(r"^job heavy\.\d+ \(stuck\) of 'heavy': failed, time limit of 2 s exceeded$", out, re.M)
    assert re.search(r"^job heavy\.\d+ \(export\) of 'heavy': failed, cancelled: not needed any more$", out, re.M)
    [limits] = re.findall(r"^queue 'api': 15 calls started over ([\d.]+) s by two workers; tenant-b's calls were "
                          r"starts (\d+), (\d+), (\d+) of 16 .*completed with 1 attempt made, 2 started$", out, re.M)
    assert float(limits[0]) >= 2.0, "5 a second: 15 starts (and a retry) take more than two windows"
    # The groups take turns: tenant-b's first call is among the first starts, not after tenant-a's 12. (How
    # late its next ones start depends on how fast a worker ends the one before: one running per tenant.)
    assert int(limits[1]) <= 3, "tenant-b's first call waited for tenant-a's calls instead of taking its turn"
    fired = re.findall(r"^\[beat [12]\] schedule heartbeat: tick \S+ fired job (heartbeat@\d+) on queue demo",
                       out, re.M)
    assert fired and len(fired) == len(set(fired)), "two beats, and each tick fired once"
    assert re.search(r"^schedule heartbeat: [1-9]\d* of its jobs completed so far", out, re.M)

    crash = f"job {rows['crash'][0]} (crash)"
    assert re.search(rf"^\[sweeper\] queue demo: marked 1, recovered 0 .*: marked {re.escape(crash)}$", out, re.M)
    assert re.search(rf"^\[sweeper\] queue demo: marked 0, recovered 1 to wait.*: recovered {re.escape(crash)}$",
                     out, re.M)
    assert re.search(r"^\[sweeper\] queue default: marked 0", out, re.M), "every configured queue is swept"
    assert re.search(rf"^\[worker 1\] job {rows['crash'][0]} of queue demo started: .*crash", out, re.M)
    assert '"mirror"' in out and '"Task id=... state=..." lines' in out, "the lines to come are introduced"
    assert out.rstrip().splitlines()[-1].startswith(f"The admin user is admin, password {password}")

    assert demo.leftovers() == [], "the demo left processes behind"
    assert len(demo.started) >= 4, "redis-server, worker 1, the sweeper and worker 2 were seen"
    assert list((tmp_path / "tmp").iterdir()) == [], "the private redis-server's folder is removed"


def test_the_served_demo_stops_everything_it_started(demo_env, tmp_path):
    port = free_port()
    demo = Demo(demo_env, "--port", str(port))

    def admin_answers() -> bool:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/login/", timeout=1).status == 200
        except OSError:
            return False

    try:
        assert wait_until(admin_answers, 200, interval_s=0.5), "the admin was never served"  # about 35 s here
        assert len([p for p in demo.started if still_running(p)]) >= 4, "redis-server, worker, sweeper, runserver"
        demo.process.send_signal(signal.SIGTERM)  # what Ctrl-C does, without needing a terminal
        out, err = demo.finish(60)
    finally:
        if demo.process.poll() is None:
            demo.process.kill()
    assert demo.process.returncode == 0, err
    assert f"The admin is at http://127.0.0.1:{port}/admin/ (user admin, password " in out
    assert demo.leftovers() == []
    assert list((tmp_path / "tmp").iterdir()) == []

"""The README's demo, end to end: a private redis-server, a worker that dies, the sweeper, the admin data."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_demo_tells_the_whole_story(subprocess_env, tmp_path):
    env = {key: value for key, value in subprocess_env.items() if key != "ECHOMQ_REDIS_URL"}
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'demo.sqlite3'}"
    result = subprocess.run([sys.executable, "manage.py", "echomq_demo", "--no-serve"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "started a private redis-server" in out and "admin user: admin / " in out
    assert "worker 1 died (exit 1)" in out
    assert "marked 1, recovered 0" in out and "recovered 1 to wait" in out
    rows = {line.split()[1]: line.split() for line in out.splitlines() if line[:3].strip().isdigit()}
    assert rows["crash"][2:5] == ["completed", "2", "1"], "recovered from its stall, then completed"
    assert rows["doomed"][2:4] == ["failed", "2"]
    assert rows["flaky"][2:4] == ["completed", "2"]
    assert "Django task add(2, 3) through the Tasks framework: SUCCESSFUL, return value 5" in out
    leftovers = subprocess.run(["pgrep", "-f", "manage.py echomq_"], capture_output=True, text=True).stdout
    assert leftovers.strip() == "", f"the demo left processes behind: {leftovers}"


@pytest.mark.slow
def test_the_served_demo_stops_everything_it_started(subprocess_env, tmp_path):
    import signal
    import urllib.request

    from tests.helpers import wait_until
    from tests.redis_servers import free_port

    port = free_port()
    env = {key: value for key, value in subprocess_env.items() if key != "ECHOMQ_REDIS_URL"}
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'demo.sqlite3'}"
    demo = subprocess.Popen([sys.executable, "manage.py", "echomq_demo", "--port", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def admin_answers() -> bool:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/login/", timeout=1).status == 200
        except OSError:
            return False

    try:
        assert wait_until(admin_answers, 90, interval_s=0.5), "the admin was never served"
        children = subprocess.run(["pgrep", "-P", str(demo.pid)], capture_output=True, text=True).stdout.split()
        assert len(children) >= 4, "redis-server, worker, sweeper and runserver"
        demo.send_signal(signal.SIGTERM)  # what Ctrl-C does, without needing a terminal
        assert demo.wait(45) == 0
        still_running = [pid for pid in children if Path(f"/proc/{pid}").exists()
                         and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()]
        assert still_running == []
    finally:
        if demo.poll() is None:
            demo.kill()

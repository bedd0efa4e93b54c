"""Worker processes forked from one process that set Django up, for tests/system/test_durable_processes.py.

    python -m tests.durable_app.workers COUNT [--respawn] ECHOMQ_WORKER_OPTIONS...

Each child runs `manage.py echomq_worker` with the options given, as the
command itself (call_command), in a fork of a process that has set Django up
(tests.durable_settings unless DJANGO_SETTINGS_MODULE says) and imported the
jobs: a child costs a fork, not the second of CPU a new interpreter takes to
set Django up. That is what lets a test kill workers hundreds of times.
Nothing here touches Redis or the database before a fork, so each child makes
its own connections. Prints "started <pid>" for each child, "ended <pid>" when
one exits; with --respawn a child that ends is replaced. SIGTERM or SIGINT:
kill the children (SIGKILL), reap them, exit.
"""

import argparse
import os
import signal
import sys
import traceback

WATCHED = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT}


def fork_worker(options: list[str], mask: set[signal.Signals]) -> int:
    """Fork a child that runs echomq_worker with `options`; its pid."""
    from django.core.management import call_command

    pid = os.fork()
    if pid:
        print(f"started {pid}", flush=True)
        return pid
    code = 0
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # the command handles its own signals
        call_command("echomq_worker", *options)
    except BaseException:  # the child must never return into the parent's loop
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def reap(children: set[int]) -> list[int]:
    """The children that have exited, reaped."""
    ended = []
    while children:
        pid, _status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        children.discard(pid)
        ended.append(pid)
        print(f"ended {pid}", flush=True)
    return ended


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("count", type=int)
    parser.add_argument("--respawn", action="store_true")
    args, options = parser.parse_known_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.durable_settings")
    import django

    django.setup()
    from echomq_django.jobs import discover_jobs
    from echomq_django.management.commands import echomq_worker  # noqa: F401  (imported once, before the forks)

    discover_jobs()
    # Signals are taken by sigwaitinfo, in this loop: no handler runs between a fork and its bookkeeping.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
    children = {fork_worker(options, mask) for _ in range(args.count)}
    while True:
        if signal.sigwaitinfo(WATCHED).si_signo != signal.SIGCHLD:
            break
        for _pid in reap(children):
            if args.respawn:
                children.add(fork_worker(options, mask))
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    for pid in children:
        os.waitpid(pid, 0)


if __name__ == "__main__":
    main()

"""The echomq loggers' records in a management command's own output, for projects without LOGGING for them.

The commands use it, and so does a processes-pool child (child.py), whose
output is its command's.
"""

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from django.core.management.base import BaseCommand

# What each --verbosity shows of the echomq loggers: 0 warnings and errors only,
# 1 progress (a job started, completed, failed), 2 and more everything.
LEVELS = {0: logging.WARNING, 1: logging.INFO}


class CommandOutputHandler(logging.Handler):
    """Write records to a command's stdout (progress) or stderr (warnings and errors)."""

    def __init__(self, command: BaseCommand, level: int) -> None:
        super().__init__(level)
        self.command = command

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = self.format(record)
            if record.levelno >= logging.ERROR:
                self.command.stderr.write(self.command.style.ERROR(message))
            elif record.levelno >= logging.WARNING:
                self.command.stderr.write(self.command.style.WARNING(message))
            else:
                self.command.stdout.write(message)
        except Exception:
            self.handleError(record)


@contextmanager
def echomq_logs_shown(command: BaseCommand, verbosity: int) -> Iterator[None]:
    """Show the `echomq` loggers' records in `command`'s output while the block runs.

    Only when no handler would receive them otherwise (a fresh project has no
    LOGGING for them): a project whose LOGGING does handle them keeps its own
    output, and nothing is printed twice.
    """
    logger = logging.getLogger("echomq")
    if logger.hasHandlers():
        yield
        return
    level = LEVELS.get(verbosity, logging.DEBUG)
    handler = CommandOutputHandler(command, level)
    previous_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous_level)

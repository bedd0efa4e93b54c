"""Schedules: periodic jobs from ECHOMQ["SCHEDULES"] and from the Schedule model, which `echomq_beat` fires.

`parsing` (reading one schedule's options, every problem tied to its option:
for the system checks, the admin's form and the scheduler), `models` (the
Schedule rows), `firing` (what the scheduler fires, what Redis remembers of
each schedule, and run now). The names below are what the rest of the app
and `echomq_beat` use; the scheduler itself is core's `Beat`.
"""

from .firing import database_entries, load_schedules, records, run_now
from .parsing import Entry, parse_schedule, schedules_problems, settings_entries

__all__ = ["Entry", "database_entries", "load_schedules", "parse_schedule", "records", "run_now",
           "schedules_problems", "settings_entries"]

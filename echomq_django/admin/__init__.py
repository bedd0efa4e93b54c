"""The admin: a queue dashboard, every queue's states, the failed and stalled lists, schedules, the outbox,
the live workers.

Every change goes through the Lua scripts first, so Redis stays the source
of truth. Changes are POST-only, CSRF-protected and need their own
permission; the bulk ones that act on a whole set run only on the POST of a
confirmation page.
"""

from . import browser, dashboard, mirror_lists, outbox, schedules, workers

__all__ = ["browser", "dashboard", "mirror_lists", "outbox", "schedules", "workers"]

"""Celery's task states, as echomq's job states map onto them (AsyncResult.state).

| Celery    | echomq                                                                       |
|-----------|------------------------------------------------------------------------------|
| PENDING   | wait, prioritized, paused, deferred (a workflow step), delayed before its first attempt, or not in Redis |
| RETRY     | delayed after a failed attempt, until the next one                           |
| STARTED   | active (or the state the job set with `self.update_state(state=...)`)          |
| SUCCESS   | completed                                                                    |
| FAILURE   | failed                                                                       |
| REVOKED   | failed by a cancel (`revoke()`, `Queue.cancel`, the admin)                    |
"""

PENDING = "PENDING"
RECEIVED = "RECEIVED"
STARTED = "STARTED"
SUCCESS = "SUCCESS"
FAILURE = "FAILURE"
REVOKED = "REVOKED"
RETRY = "RETRY"
IGNORED = "IGNORED"

READY_STATES = frozenset({SUCCESS, FAILURE, REVOKED})
UNREADY_STATES = frozenset({PENDING, RECEIVED, STARTED, RETRY})
EXCEPTION_STATES = frozenset({RETRY, FAILURE, REVOKED})
PROPAGATE_STATES = frozenset({FAILURE, REVOKED})
ALL_STATES = frozenset({PENDING, RECEIVED, STARTED, SUCCESS, FAILURE, RETRY, REVOKED})

"""Every Redis key name of the protocol, built here or named here where a script builds it; each script's ARGV.

A script gets the keys it works on as KEYS, in the order SCRIPT_KEYS gives,
and builds from the queue's prefix (its ARGV "prefix") only the keys listed in
DERIVED_KEYS. Its other arguments come as ARGV, in the order SCRIPT_ARGV (and
SCRIPT_ARGV_EACH, per job or lock) gives. tests/unit/test_lua_contract.py reads
every script's header and source and holds the tables to them.
"""

import functools
import re
import unicodedata
from dataclasses import dataclass

from .. import defaults
from ..errors import InvalidNameError

MAX_NAME_LENGTH = 128
# A generated id is "<queue>.<n>" (addJob): a queue name of MAX_NAME_LENGTH, a dot and a counter of up to 20 digits.
MAX_ID_LENGTH = MAX_NAME_LENGTH + 21
# A metrics key holds one minute: metrics:<minute>, minute = ms // MINUTE_MS (the scripts get it from here).
MINUTE_MS = 60_000

# Names become Redis keys and admin URL path segments, so they are kept to an
# alphabet that means the same thing in both and looks the same to everyone:
# ASCII letters, digits and `_ . @ + = -`, starting with a letter, a digit or
# `_`. That leaves out the key separator ":" and the hash tag "{}", URL syntax
# ("/", "?", "#", "%", "." and ".." as a path segment), whitespace, control
# characters and every non-ASCII character (bidi overrides, zero-width spaces,
# look-alike letters).
# The rule in one place for both languages: the first character from
# NAME_FIRST, the rest from NAME_REST, each written to mean the same as a Python
# regex class and a Lua pattern set (ranges and plain characters only). The
# scripts get them from here (lua.py's generated include "names").
NAME_FIRST = "A-Za-z0-9_"
NAME_REST = "A-Za-z0-9_.@+=-"
_NAME = re.compile(f"[{NAME_FIRST}][{NAME_REST}]*")
ALPHABET = "ASCII letters, digits and _ . @ + = - (starting with a letter, a digit or _)"
# Job names are never part of a key or a URL path, so any printable text
# without whitespace goes (a dotted function path, "send-welcome",
# "<b>"; pages escape it), but not characters that hide or reorder text.
_JOB_NAME = re.compile(r"[^\s\x00-\x1f\x7f]+")

# The states a job can be in, each one key of the queue: a LIST (newest at the
# head) or a sorted set. A job is in exactly one of them, or in none once removed.
LIST_STATES = ("wait", "paused", "active")
SORTED_SET_STATES = ("prioritized", "delayed", "deferred", "parked", "completed", "failed")
# `deferred`: a workflow's steps that wait for their inputs (docs/workflows.md); `parked`: durable jobs that wait
# for a signal (docs/durable.md).
STATES = ("wait", "prioritized", "paused", "active", "delayed", "deferred", "parked", "completed", "failed")
# What a count of the queue reports: every state, and `stalled`, the SET of
# marked jobs (a subset of active).
COUNTED = ("wait", "prioritized", "paused", "active", "stalled", "delayed", "deferred", "parked", "completed",
           "failed")

# The KEYS of each script, in order, named as they follow the queue's base
# ("emq:{q}:"); `<token>`, `<state>` and `<id>` are filled in per call. Each script's
# header lists the same names, and the wrappers in scripts.py take their KEYS
# from here (QueueKeys.for_script).
SCRIPT_KEYS: dict[str, tuple[str, ...]] = {
    "addJob-9": ("wait", "paused", "meta", "id", "delayed", "marker", "prioritized", "add:<token>", "sent"),
    "addLog-2": ("<id>", "<id>:logs"),
    "addEdgePages-1": ("<id>:nxt",),
    "addWorkflow-8": ("wait", "paused", "meta", "delayed", "marker", "prioritized", "deferred", "add:<token>"),
    "cancelJob-7": ("wait", "paused", "delayed", "prioritized", "failed", "meta", "change:<token>"),
    "cleanJobs-1": ("<state>",),
    "deliverWorkflow-5": ("wait", "paused", "meta", "prioritized", "failed"),
    "extendLocks-1": ("stalled",),
    "fireSchedule-6": ("schedule:<name>", "wait", "paused", "meta", "marker", "prioritized"),
    "getCounts-11": (*COUNTED, "meta"),
    "getJob-11": (*STATES, "<id>", "<id>:logs"),
    "moveStalledJobsToWait-8": ("stalled", "wait", "active", "failed", "stalled-check", "meta", "paused", "marker"),
    "moveToActive-10": ("wait", "active", "meta", "delayed", "marker", "paused", "failed", "prioritized",
                        "fetch:<token>", "limiter"),
    "moveToFinished-10": ("active", "completed", "failed", "delayed", "wait", "paused", "meta", "marker", "stalled",
                          "prioritized"),
    "pauseQueue-5": ("meta", "wait", "paused", "marker", "prioritized"),
    "promoteDelayed-6": ("delayed", "wait", "paused", "meta", "marker", "prioritized"),
    "recordStep-3": ("<id>", "<id>:steps", "<id>:signals"),
    "removeJob-10": ("wait", "paused", "active", "delayed", "completed", "failed", "stalled", "prioritized", "meta",
                     "change:<token>"),
    "retryJob-7": ("failed", "wait", "paused", "meta", "marker", "prioritized", "change:<token>"),
    "signalJob-9": ("<id>", "<id>:steps", "<id>:signals", "parked", "wait", "paused", "meta", "marker", "prioritized"),
    "taskRate-1": ("task-rate:<name>",),
    "updateProgress-1": ("<id>",),
}
# The keys scripts build from the prefix instead, and why. All share the
# queue's hash tag, so on a cluster they live in the slot of the KEYS.
DERIVED_KEYS: dict[str, str] = {
    "<id>": "a job's hash: the ids a script works on are found inside it (a list, a set, a reply)",
    "<id>:lock": "a job's lock, for the same reason",
    "<id>:logs": "a job's log lines, deleted with the job wherever its hash is",
    "metrics:<minute>": "one minute of the queue's metrics (includes/metrics.lua), named by the call's time",
    "metrics:total": "the queue's all-time counters, written beside the minute's",
    "events": "the event stream, written by the emitEvent include that every writing script shares",
    "locks": "the lock index, kept by every script that moves jobs in or out of active",
    "prioritized": "the sweep's: the spec fixes its eight KEYS, and a recovered job may have a priority",
    "fetch:<token>": "moveToFinished's: one call finishes attempts of many fetches, each with its own record",
    "failed": "where includes/groups.lua sends a job whose group's list is another type, from any script",
    "groups": "the ring of groups taking turns (includes/groups.lua): a job's group is found inside its hash",
    "group:<name>": "a group's waiting jobs, for the same reason",
    "group-active": "each group's running jobs, for the same reason",
    "group-waiting": "each group's waiting jobs, for the same reason",
    "group-running": "the group of each running job, for the same reason",
    "deferred": "includes/workflow.lua's: any script that ends a job may release or fail a step that waited for it",
    "delayed": "includes/workflow.lua's, for the same reason: a released step may have a delay of its own",
    "marker": "includes/workflow.lua's, for the same reason: a released step wakes a worker",
    "handoff": "includes/workflow.lua's: a member's end bound for another queue waits there to be delivered",
    "<id>:steps": "a job's durable steps (recordStep), deleted with the job wherever its hash is",
    "<id>:signals": "the signals sent to a job (signalJob), deleted with the job wherever its hash is",
    "parked": "includes/parked.lua's: a fetch resumes parked jobs whose wait timed out, a finish parks a job, and a "
              "cancel or removal takes one out",
    "<id>:in": "a workflow step's inputs, written where its inputs end and deleted with the job",
    "<id>:nxt": "a workflow step's edges in pages (includes/workflow.lua): named by its edge of kind \"f\", deleted "
                "once the last page is delivered",
    "wf:<workflow>": "a workflow's record, in its home queue: named by the edges a member's hash holds",
    "dedupe:<key>": "includes/dedupe.lua's: a job's dedupe key, named in its hash (`ddk`) where it ends",
    "dedupe-id:<id>": "addJob's: the holder a caller's deduplicated id went to, for a day (a task's result id)",
    "completed": "addJob's: a dedupe key whose holder completed is free (includes/dedupe.lua)",
    "result-ttl": "moveToFinished's: the completed jobs with a result TTL, by when (opts.resultTtl, includes/"
                  "applyRetention.lua)",
}
_PLACEHOLDER = re.compile(r"<([a-z]+)>")

# Job hashes live beside the queue's own keys (emq:{q}:<id>), so a caller's id
# may not be one of these names. Digit-only ids are reserved for generated ids.
RESERVED_IDS = frozenset(
    {"wait", "paused", "active", "stalled", "failed", "completed", "delayed", "prioritized",
     "stalled-check", "meta", "marker", "id", "events", "locks", "schedule", "limiter", "groups", "group-active",
     "group-waiting", "group-running", "sent", "deferred", "handoff", "result-ttl", "workers", "task-rate", "parked"}
)


def is_name(value: str) -> bool:
    """Whether `value` may be a name (a queue's, an id, a group's): the rule validate_name explains."""
    return len(value) <= MAX_NAME_LENGTH and _NAME.fullmatch(value) is not None


def validate_name(value: object, what: str, *, limit: int = MAX_NAME_LENGTH) -> str:
    """Return `value` if it may be part of a key (at most `limit` characters), else raise InvalidNameError."""
    if not isinstance(value, str):
        raise InvalidNameError(f"{what} must be a string, not {type(value).__name__}")
    if not value:
        raise InvalidNameError(f"{what} must not be empty")
    if len(value) > limit:
        raise InvalidNameError(
            f"{what} is {len(value)} characters long; the limit is {limit}"
        )
    if not _NAME.fullmatch(value):
        raise InvalidNameError(
            f"{what} {value!r} may hold only {ALPHABET}"
        )
    return value


def validate_job_name(name: object) -> str:
    """Return a job name if it is valid, else raise InvalidNameError."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH:
        return validate_name(name, "job name")  # raises with the reason
    if not _JOB_NAME.fullmatch(name) or not name.isascii() and any(
            unicodedata.category(c) in ("Cf", "Cs", "Co", "Cn") for c in name):
        raise InvalidNameError(
            f"job name {name!r} may not contain whitespace, control, format (bidi, zero-width) "
            "or unassigned characters")
    return name


def validate_id(job_id: object) -> str:
    """Return the id of a job to read if it can be one (a generated id is longer than a name), else InvalidNameError."""
    return validate_name(job_id, "job id", limit=MAX_ID_LENGTH)


def validate_stored_id(job_id: object) -> str:
    """Return the id of a job to change (retry, remove) if it can be one; else InvalidNameError.

    Generated ids ("<queue>.<n>", all digits before) pass; a queue key name does not, even when another
    client put it in a set: changing it as a job would change the queue's own key.
    """
    job_id = validate_id(job_id)
    if job_id in RESERVED_IDS:
        raise InvalidNameError(f"job id {job_id!r} is the name of a queue key, not of a job")
    return job_id


def validate_job_id(job_id: object) -> str:
    """Return a caller-chosen job id if it is valid, else raise InvalidNameError."""
    job_id = validate_name(job_id, "job id")
    if job_id in RESERVED_IDS:
        raise InvalidNameError(f"job id {job_id!r} is reserved for a queue key")
    if job_id.isdigit():
        raise InvalidNameError(
            f"job id {job_id!r} is all digits; such ids are reserved for generated ids"
        )
    return job_id


@dataclass(frozen=True)
class QueueKeys:
    """The key names of one queue; all share the `{queue}` hash tag (one cluster slot)."""

    queue: str
    prefix: str = defaults.PREFIX

    def __post_init__(self) -> None:
        validate_name(self.queue, "queue name")
        validate_name(self.prefix, "key prefix")

    @property
    def base(self) -> str:
        """The common start of every key of this queue, as scripts receive it."""
        return f"{self.prefix}:{{{self.queue}}}:"

    @property
    def wait(self) -> str:
        return self.base + "wait"

    @property
    def paused(self) -> str:
        return self.base + "paused"

    @property
    def active(self) -> str:
        return self.base + "active"

    @property
    def stalled(self) -> str:
        return self.base + "stalled"

    @property
    def failed(self) -> str:
        return self.base + "failed"

    @property
    def completed(self) -> str:
        return self.base + "completed"

    @property
    def delayed(self) -> str:
        return self.base + "delayed"

    @property
    def prioritized(self) -> str:
        return self.base + "prioritized"

    @property
    def locks(self) -> str:
        """The lock index: each active id scored by when its lock lapses unless renewed."""
        return self.base + "locks"

    @property
    def stalled_check(self) -> str:
        return self.base + "stalled-check"

    @property
    def meta(self) -> str:
        return self.base + "meta"

    @property
    def marker(self) -> str:
        return self.base + "marker"

    @property
    def groups(self) -> str:
        """The ring of groups taking turns (ZSET, score = turn); see lua/includes/groups.lua."""
        return self.base + "groups"

    @property
    def group_running(self) -> str:
        """The group of each running job of a group (HASH, job id -> group)."""
        return self.base + "group-running"

    @property
    def group_waiting(self) -> str:
        """Each group's waiting jobs (ZSET, score = how many); see lua/includes/groups.lua."""
        return self.base + "group-waiting"

    @property
    def group_active(self) -> str:
        """Each group's running jobs (HASH, group -> how many)."""
        return self.base + "group-active"

    def group(self, name: str) -> str:
        """A group's waiting jobs (LIST, taken from the right)."""
        return self.base + "group:" + name

    @property
    def deferred(self) -> str:
        """A workflow's steps waiting for their inputs (ZSET, score = when added); see includes/workflow.lua."""
        return self.base + "deferred"

    @property
    def parked(self) -> str:
        """Durable jobs waiting for a signal (ZSET, score: the deadline, +inf: none); see includes/parked.lua."""
        return self.base + "parked"

    @property
    def handoff(self) -> str:
        """Ends of this queue's workflow members bound for another queue, to be delivered (LIST of JSON)."""
        return self.base + "handoff"

    def deduplicated_to(self, job_id: str) -> str:
        """Where an add of caller id `job_id` went when its dedupe key was held (STRING, a day; addJob)."""
        return self.base + "dedupe-id:" + job_id

    def workflow(self, workflow_id: str) -> str:
        """A workflow's record (HASH: status, deps, ttl, tree), in its home queue."""
        return self.base + "wf:" + workflow_id

    def inputs(self, job_id: str) -> str:
        """A workflow step's inputs (HASH, one field per slot), or the workflow record's results (see workflow)."""
        return self.base + job_id + ":in"

    @property
    def limiter(self) -> str:
        """The rate limit's window (ZSET): one member per attempt started in it, scored by Redis's time."""
        return self.base + "limiter"

    @property
    def sent(self) -> str:
        """The ids an outbox sent, each scored by when its record lapses (ZSET); see addJob."""
        return self.base + "sent"

    @property
    def abandoned(self) -> str:
        """The job threads past their hard limit that still run, each holding a worker's slot (ZSET); see Worker."""
        return self.base + "threads:abandoned"

    @property
    def workers(self) -> str:
        """The workers registry's index (ZSET): each worker's id, scored by when its record lapses; see registry.py."""
        return self.base + "workers"

    def worker(self, worker_id: str) -> str:
        """One worker's record in the registry (STRING, JSON, PX its lock duration); see registry.py."""
        return self.base + "workers:" + worker_id

    @property
    def id_counter(self) -> str:
        return self.base + "id"

    @property
    def events(self) -> str:
        return self.base + "events"

    def fetch_record(self, token: str) -> str:
        """What one fetch took, under its lock token (moveToActive's re-send answer).

        moveToFinished builds this name itself from the prefix and each
        attempt's token (one call finishes attempts of many fetches) to
        delete the record once its token finishes a job.
        """
        return self.base + "fetch:" + token

    def add_record(self, token: str) -> str:
        """One add call's reply, under its add token (addJob's re-send answer)."""
        return self.base + "add:" + token

    def change_record(self, token: str) -> str:
        """One round trip's answers to retryJob, removeJob or cancelJob calls (HASH), under its token."""
        return self.base + "change:" + token

    def bulk_run(self, run_id: str) -> str:
        """A bulk change run outside the request that asked it (HASH): its action, progress, counts; see bulk_runs."""
        return self.base + "bulk-run:" + run_id

    def bulk_run_ids(self, run_id: str) -> str:
        """The ids a bulk run changes, in order (LIST); see core/reading/bulk_runs.py."""
        return self.base + "bulk-run:" + run_id + ":ids"

    def job(self, job_id: str) -> str:
        return self.base + job_id

    def for_script(self, script: str, **parts: str) -> list[str]:
        """The KEYS of one call of `script` (SCRIPT_KEYS), `parts` filling in `<token>` or `<state>`."""
        names = self._script_keys(script)
        if not parts:
            return list(names)
        return [_PLACEHOLDER.sub(lambda match: parts[match.group(1)], name) if "<" in name else name
                for name in names]

    @functools.cache  # noqa: B019  (a handful of queues and scripts per process)
    def _script_keys(self, script: str) -> tuple[str, ...]:
        return tuple(self.base + name for name in SCRIPT_KEYS[script])

    def schedule(self, name: str) -> str:
        """A schedule's record (HASH): the latest tick decided and the latest job added; see fireSchedule."""
        return self.base + "schedule:" + name

    def task_rate(self, name: str) -> str:
        """A task's own rate limit (HASH: "tat", and "r:<id>" per job holding a start); see taskRate."""
        return self.base + "task-rate:" + name

    def lock(self, job_id: str) -> str:
        return self.base + job_id + ":lock"

    def edge_pages(self, job_id: str) -> str:
        """A workflow step's edges in pages (HASH: "n", then "0", "1", ...), for a step with many; see addEdgePages."""
        return self.base + job_id + ":nxt"

    def steps(self, job_id: str) -> str:
        """A job's durable steps (HASH: step name -> record JSON); see recordStep and docs/durable.md."""
        return self.base + job_id + ":steps"

    def signals(self, job_id: str) -> str:
        """The signals sent to a job (HASH: "p:<name>" -> payload JSON, "c:<name>" -> call id); see signalJob."""
        return self.base + job_id + ":signals"

    def logs(self, job_id: str) -> str:
        """The log lines a job wrote while running (LIST, oldest first)."""
        return self.base + job_id + ":logs"

    def metrics_minute(self, minute: int) -> str:
        """One minute of metrics (HASH), `minute` = ms // MINUTE_MS; see lua/includes/metrics.lua."""
        return f"{self.base}metrics:{minute}"

    @property
    def metrics_total(self) -> str:
        """The all-time counters (HASH)."""
        return self.base + "metrics:total"

"""Reading one value of the ECHOMQ setting: each reader checks a value and converts it to the runtime's units.

A reader takes (value, where, problems): `where` names the value in a message ("ECHOMQ['QUEUES']['a']['POOL']"),
and a wrong value adds a Problem to `problems` (the system checks report them all) and gives None, or a fallback,
so one wrong value never stops the others from being read. conf.py reads the whole setting with them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .core import (
    ALPHABET,
    MAX_DELAY_MS,
    MAX_RATE_WINDOW_MS,
    POOLS,
    Backoff,
    InvalidNameError,
    RateLimit,
    RedisURLError,
    Retention,
    defaults,
    parse_redis_url,
    validate_name,
)

# The most log lines a job may keep: at 10,000 characters a line, a job's log stays under 1 GB.
MAX_LOG_LINES = 100_000


# A metrics token shorter than this is easy to guess.
MIN_TOKEN_LENGTH = 24


# The longest duration a setting may give, as for a job's delay (nan fails every comparison).
MAX_SECONDS = MAX_DELAY_MS // 1000


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the settings, as a system check reports it."""

    id: str
    message: str
    hint: str
    warning: bool = False


def seconds_to_ms(value: Any, where: str, problems: list[Problem], *, allow_none: bool = False,
                   most_s: float = MAX_SECONDS, most: str = f"{MAX_SECONDS:,} (ten years)",
                   hint: str = "") -> int | None:
    """Seconds (fractions allowed, at most `most_s`, said as `most`) in ms; None, and a problem, when wrong."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= most_s:
        hint = hint or "Use a number such as 30 or 0.5" + (", or None." if allow_none else ".")
        problems.append(Problem("echomq.E005", f"{where} must be a positive number of seconds up to "
                                f"{most}, not {value!r}.", hint))
        return None
    return max(1, round(value * 1000))


def limit_ms(value: Any, where: str, problems: list[Problem]) -> int | None:
    """A time limit in ms, 0 for None (no limit); None when it is wrong."""
    if value is None:
        return 0
    return seconds_to_ms(value, where, problems, allow_none=True)


def rate_limit(value: Any, where: str, problems: list[Problem]) -> RateLimit | None:
    if value is None:
        return None
    hint = 'Use {"MAX": jobs, "DURATION": seconds}, e.g. {"MAX": 10, "DURATION": 1} for 10 jobs a second.'
    if not isinstance(value, dict) or set(value) != {"MAX", "DURATION"}:
        problems.append(Problem("echomq.E006", f"{where} must be a dict with MAX and DURATION, not {value!r}.", hint))
        return None
    jobs = count(value["MAX"], f"{where}['MAX']", problems, minimum=1)
    window_ms = seconds_to_ms(value["DURATION"], f"{where}['DURATION']", problems,
                               most_s=MAX_RATE_WINDOW_MS / 1000, most=f"a day ({MAX_RATE_WINDOW_MS // 1000:,})",
                               hint="The window keeps a record of every start in it; for a daily quota use 86400.")
    if jobs is None or window_ms is None:
        return None
    return RateLimit(jobs, window_ms)


def flag(value: Any, where: str, problems: list[Problem], *, allow_none: bool = False) -> bool | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, bool):
        problems.append(Problem("echomq.E006", f"{where} must be True or False{' or None' if allow_none else ''}, "
                                f"not {value!r}.", "Use True or False."))
        return None
    return value


def pool(value: Any, where: str, problems: list[Problem]) -> str:
    if not isinstance(value, str) or value not in POOLS:
        problems.append(Problem("echomq.E006", f"{where} must be one of {', '.join(map(repr, POOLS))}, "
                                f"not {value!r}.",
                                '"threads" (the default) runs jobs on threads of the worker; "processes" in '
                                "child processes, which use every core and can be killed at a time limit."))
    return value


def count(value: Any, where: str, problems: list[Problem], *, minimum: int, maximum: int | None = None,
           allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (maximum and value > maximum):
        bounds = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum:,}"
        problems.append(Problem("echomq.E005", f"{where} must be a whole number {bounds}, not {value!r}.",
                                "Use a whole number."))
        return None
    return value


def retention(value: Any, where: str, problems: list[Problem], *, fallback: dict[str, Any]) -> Retention:
    if not isinstance(value, dict) or set(value) - {"COUNT", "AGE"}:
        problems.append(Problem("echomq.E006", f"{where} must be a dict with COUNT and/or AGE.",
                                'For example {"COUNT": 1000, "AGE": 86400}; None means no limit.'))
        return Retention()  # a wrong value: the caller falls back to the default
    # A limit left out keeps its default (KEEP_COMPLETED's COUNT is 1000); None says "no limit".
    kept = count(value.get("COUNT", fallback["COUNT"]), f"{where}['COUNT']", problems, minimum=0, allow_none=True)
    age_ms = seconds_to_ms(value.get("AGE", fallback["AGE"]), f"{where}['AGE']", problems, allow_none=True)
    return Retention(count=-1 if kept is None else kept, age_ms=age_ms or 0)


def backoff(value: Any, where: str, problems: list[Problem]) -> Backoff:
    hint = 'Use {"TYPE": "fixed" or "exponential", "DELAY": seconds}.'
    if not isinstance(value, dict) or set(value) - {"TYPE", "DELAY"}:
        problems.append(Problem("echomq.E006", f"{where} must be a dict with TYPE and DELAY.", hint))
        return Backoff()
    delay = value.get("DELAY", 0)
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay <= MAX_SECONDS:
        problems.append(Problem("echomq.E005", f"{where}['DELAY'] must be seconds from 0 to {MAX_SECONDS:,} "
                                f"(ten years), not {delay!r}.", hint))
        delay = 0
    try:
        return Backoff(str(value.get("TYPE", "fixed")), round(delay * 1000))
    except ValueError as error:
        problems.append(Problem("echomq.E006", f"{where}: {error}.", hint))
        return Backoff()


# How one option is read: (value, where, problems) -> the resolved value; a wrong
# value adds to `problems`.
Parse = Callable[[Any, str, list[Problem]], Any]


def option(values: dict[str, Any], known: dict[str, Any], key: str, where: str, problems: list[Problem],
            parse: Parse) -> Any:
    """The option `key` of `values`, parsed; a wrong value is reported and its default used instead.

    A value with only warnings (a short token) is reported and kept.
    """
    found: list[Problem] = []
    value = parse(values[key], f"{where}[{key!r}]", found)
    problems += found
    if all(problem.warning for problem in found):
        return value
    return parse(known[key], f"{where}[{key!r}]", [])


def threads_time_limit_warning(what: str, queue: str) -> Problem:
    """echomq.W017: `what` (a hard time limit) applies on `queue`, whose jobs run on threads, which cannot be killed."""
    return Problem(
        "echomq.W017", f"{what}, but queue {queue!r} runs its jobs on threads (POOL \"threads\"), and a thread "
        "cannot be killed.",
        "At the limit the worker fails the attempt (retried per its attempts) and stops renewing its lock, but the "
        "thread runs on, keeping its worker slot taken, until the job returns (or checks current_job()). Set the "
        "queue's POOL to \"processes\" (or run echomq_worker --pool processes) to enforce the limit.",
        warning=True)


def redis_url(value: Any, where: str, problems: list[Problem]) -> str:
    try:
        parse_redis_url(value)
    except RedisURLError as error:
        problems.append(Problem("echomq.E002", f"{where} is wrong: {error}.",
                                "Use redis://host:port/db (rediss:// for TLS, unix:///path.sock), "
                                "redis+cluster://host:port,host:port or redis+sentinel://host:port/service."))
    return value


def prefix(value: Any, where: str, problems: list[Problem]) -> str:
    try:
        validate_name(value, where)
    except InvalidNameError as error:
        problems.append(Problem("echomq.E003", f"{error}.", f"Use {ALPHABET}."))
    return value


def max_log_lines(value: Any, where: str, problems: list[Problem]) -> int | None:
    lines = count(value, where, problems, minimum=1)
    if lines is not None and lines > MAX_LOG_LINES:
        problems.append(Problem("echomq.E005", f"{where} must be at most {MAX_LOG_LINES:,}, not {lines!r}.",
                                "The default, 1000, keeps a job's newest 1,000 lines."))
        return None
    return lines


def metrics_minutes(value: Any, where: str, problems: list[Problem]) -> int | None:
    minutes = count(value, where, problems, minimum=0)
    if minutes is not None and minutes > defaults.MAX_METRICS_MINUTES:
        # (the scripts keep no more, whatever they are asked)
        problems.append(Problem("echomq.E005", f"{where} must be at most {defaults.MAX_METRICS_MINUTES:,} (a year), "
                                f"not {minutes!r}.", "The default, 1440, keeps a day."))
        return None
    return minutes


def token(value: Any, where: str, problems: list[Problem]) -> str | None:
    # `env.str("METRICS_TOKEN", default="")` is the natural way to read it: empty or blank means none,
    # never a token that an empty "Authorization: Bearer" header would match.
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str) or not value.isascii() or not value.isprintable() or " " in value:
        problems.append(Problem("echomq.E015", f"{where} must be None or a token of printable ASCII without "
                                "spaces (the scraper sends it as 'Authorization: Bearer <token>').",
                                "Generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'."))
        return None
    return value


def short_token_problem(token: str | None, *, debug: bool) -> Problem | None:
    """The problem of a METRICS_TOKEN too short to be safe: a warning under DEBUG, an error in production.

    Read apart from the settings (DEBUG can change without ECHOMQ changing): the
    check reports it, and the metrics view refuses such a token in production.
    """
    if token is None or len(token) >= MIN_TOKEN_LENGTH:
        return None
    hint = "Generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'."
    message = f"ECHOMQ['METRICS_TOKEN'] is {len(token)} characters long; a token shorter than {MIN_TOKEN_LENGTH} " \
              "is easy to guess"
    if debug:
        return Problem("echomq.W015", f"{message}.", hint, warning=True)
    return Problem("echomq.E023", f"{message}, and with DEBUG = False /echomq/metrics/ refuses it.", hint)

"""What a schedule's name, Temporal id and cron expression may be, and the errors of schedules.

A schedule's Temporal Schedule id holds its name and its tenant, so that two tenants may use the same
name and neither learns the other has it: schedule ``daily`` of tenant ``acme`` is
``agent-schedule-daily@acme``; a schedule without a tenant is ``agent-schedule-daily`` (the form every
schedule had before tenants got ids of their own, which lookups still find).
"""

from __future__ import annotations

import hashlib
import re
import string
import zoneinfo

from durable_agents.agent_client._errors import AgentClientError
from workflows.schedule_types import MAX_SCHEDULE_NAME_CHARS, SCHEDULE_ID_PREFIX, SCHEDULE_NAME

# Between a schedule's name and its tenant in its id: never in a name (SCHEDULE_NAME), escaped in a tenant.
TENANT_MARK = "@"
# A tenant's characters kept as they are in an id; every other one is its UTF-8 bytes as ``_XX``. "_" is
# the escape, so it is escaped too: two tenants never give the same text, and the id stays plain ASCII
# (safe in a workflow id, a visibility query, a URL and a shell).
_KEPT = frozenset(string.ascii_letters + string.digits + ".-")
# An escaped tenant longer than this is its SHA-256 instead (after "~", which an escaped tenant never
# holds), so that the id and its runs' ids stay well under Temporal's 1000-character limit.
MAX_TENANT_ID_CHARS = 200
MAX_CRON_CHARS = 200


class ScheduleNotFound(AgentClientError):
    """No schedule of this name (or none the caller's tenant may see)."""


class ScheduleExists(AgentClientError):
    """A schedule of this name exists already (for the same tenant)."""


class InvalidSchedule(AgentClientError, ValueError):
    """A bad name, cron expression or action (checked before anything reaches Temporal)."""


def schedule_id(name: str, tenant: str = "") -> str:
    """The Temporal Schedule id of schedule ``name`` of ``tenant`` (the name checked: ``InvalidSchedule``).

    Distinct for every (tenant, name) pair: the name never holds ``TENANT_MARK`` and the tenant part is
    an injective escape of the tenant. Without a tenant it is ``legacy_id(name)``.
    """
    if not tenant:
        return legacy_id(name)
    return legacy_id(name) + TENANT_MARK + tenant_part(tenant)


def legacy_id(name: str) -> str:
    """``agent-schedule-<name>``: the id of a schedule without a tenant, and of any made before tenant ids."""
    return SCHEDULE_ID_PREFIX + check_name(name)


def tenant_part(tenant: str) -> str:
    """``tenant`` as it is written in a schedule id (see ``_KEPT`` and ``MAX_TENANT_ID_CHARS``)."""
    raw = tenant.encode("utf-8", "surrogatepass")
    escaped = "".join(chr(byte) if chr(byte) in _KEPT else f"_{byte:02X}" for byte in raw)
    if len(escaped) <= MAX_TENANT_ID_CHARS:
        return escaped
    return "~" + hashlib.sha256(raw).hexdigest()


def name_of_id(sid: str) -> str:
    """The schedule name a schedule id holds (its tenant part dropped)."""
    return sid.removeprefix(SCHEDULE_ID_PREFIX).partition(TENANT_MARK)[0]


def check_name(name: str) -> str:
    """``name`` when it is a valid schedule name; ``InvalidSchedule`` with one line otherwise."""
    if len(name) > MAX_SCHEDULE_NAME_CHARS or not SCHEDULE_NAME.fullmatch(name):
        raise InvalidSchedule(
            f"bad schedule name {name[: MAX_SCHEDULE_NAME_CHARS + 1]!r}: expected 1 to {MAX_SCHEDULE_NAME_CHARS} "
            "letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


# The cron dialect Temporal Schedules accept (ScheduleSpec.cron_string), checked here so that a typo is one
# line before any call: 5 fields (minute hour day-of-month month day-of-week), 6 (+ year) or 7 (second
# first), a shorthand, or ``@every <n><s|m|h|d>[/<phase>]``; optionally after ``CRON_TZ=<zone>``.
_SHORTHANDS = ("@yearly", "@monthly", "@weekly", "@daily", "@hourly")
_DURATION = r"[1-9][0-9]{0,6}[smhd]"
_EVERY = re.compile(rf"@every ({_DURATION})(?:/([0-9]{{1,7}}[smhd]))?")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_EVERY_S = 366 * 86400
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# (name, lowest, highest, names) of each field of the 7-field form
_FIELDS: tuple[tuple[str, int, int, tuple[str, ...]], ...] = (
    ("second", 0, 59, ()),
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 6, _DAYS),
    ("year", 1970, 2200, ()),
)
_TOKEN = re.compile(r"(\*|\?|[0-9a-zA-Z]+(?:-[0-9a-zA-Z]+)?)(?:/([0-9]+))?")


def check_cron(cron: str) -> str:
    """``cron`` when Temporal's Schedules accept it; ``InvalidSchedule`` with one line saying why otherwise."""
    text = " ".join(cron.split())
    if not text or len(cron) > MAX_CRON_CHARS:
        raise InvalidSchedule(f"bad cron expression: expected 1 to {MAX_CRON_CHARS} characters")
    body = text
    if match := re.match(r"(?:CRON_TZ|TZ)=(\S+) ", text):
        try:
            zoneinfo.ZoneInfo(match.group(1))
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise InvalidSchedule(f"bad cron expression {cron!r}: unknown time zone {match.group(1)!r}") from None
        body = text[match.end() :]
    if body in _SHORTHANDS:
        return text
    if body.startswith("@"):
        every = _EVERY.fullmatch(body)
        if every is None:
            raise InvalidSchedule(
                f"bad cron expression {cron!r}: expected one of {', '.join(_SHORTHANDS)} or '@every <n>[s|m|h|d]'"
            )
        if _seconds(every.group(1)) > MAX_EVERY_S:
            raise InvalidSchedule(f"bad cron expression {cron!r}: @every is at most 366d")
        if every.group(2) and _seconds(every.group(2)) >= _seconds(every.group(1)):
            raise InvalidSchedule(f"bad cron expression {cron!r}: the phase must be shorter than the interval")
        return text
    fields = body.split(" ")
    if len(fields) not in (5, 6, 7):
        raise InvalidSchedule(
            f"bad cron expression {cron!r}: expected 5 fields (minute hour day-of-month month day-of-week), "
            f"6 (and year) or 7 (second first), got {len(fields)}"
        )
    specs = _FIELDS if len(fields) == 7 else _FIELDS[1 : 1 + len(fields)]
    for value, spec in zip(fields, specs, strict=True):
        problem = _field_problem(value, *spec)
        if problem:
            raise InvalidSchedule(f"bad cron expression {cron!r}: {problem}")
    return text


def _seconds(duration: str) -> int:
    return int(duration[:-1]) * _UNIT_S[duration[-1]]


def _field_problem(value: str, what: str, low: int, high: int, names: tuple[str, ...]) -> str:
    for token in value.split(","):
        match = _TOKEN.fullmatch(token)
        if match is None:
            return f"{what} {value!r}: expected *, a number, a range a-b, a list or a step /n"
        if match.group(2) is not None and not 1 <= int(match.group(2)) <= high - low + 1:
            return f"{what} {value!r}: step {match.group(2)} out of range"
        if match.group(1) in ("*", "?"):
            continue
        bounds = [_number(part, names) for part in match.group(1).split("-")]
        for number, part in zip(bounds, match.group(1).split("-"), strict=True):
            if number is None or not low <= number <= high:
                return f"{what} {part!r} is not in {low}-{high}" + (f" or {names[0]}-{names[-1]}" if names else "")
        if len(bounds) == 2 and bounds[0] is not None and bounds[1] is not None and bounds[0] > bounds[1]:
            return f"{what} range {match.group(1)!r} goes backwards"
    return ""


def _number(part: str, names: tuple[str, ...]) -> int | None:
    if part.isdigit() and len(part) <= 4:
        return int(part)
    lower = part.lower()
    if lower in names:
        return names.index(lower) + (1 if names is _MONTHS else 0)
    return None


__all__ = [
    "InvalidSchedule",
    "ScheduleExists",
    "ScheduleNotFound",
    "check_cron",
    "check_name",
    "legacy_id",
    "name_of_id",
    "schedule_id",
    "tenant_part",
]

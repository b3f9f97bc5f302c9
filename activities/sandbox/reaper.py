"""Find sandboxes whose run is over and kill them.

A run kills its own sandbox when it ends, fails or is cancelled; the reaper is the
safety net for the cases where that did not happen (a worker that died at the
wrong moment, a workflow terminated from the UI, a kill that kept failing). It
lists what the backend owns (E2B: VMs with ``da_app`` metadata; local: the
directories under the sandboxes root, with ``meta.json``) and asks
``is_run_closed(run_id)`` — the run id is the conversation id the sandbox was
created for — whether the run is still going.

Wiring (done by the worker and the CLI)::

    report = await reap(runtime.sandbox_backend(), is_run_closed)
    print(report.summary())

``is_run_closed`` should answer ``True`` only when it *knows* the run is closed
(e.g. the workflow execution is completed/failed/cancelled/terminated/timed out,
or does not exist any more); when it raises, the sandbox is kept and the error is
reported. Sandboxes without a run id (created by hand, or by an older version)
are kept and counted as ``unknown`` unless ``kill_unknown=True``; sandboxes
younger than ``min_age_s`` are kept, so a run that is just starting is never raced.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from activities.sandbox.base import SandboxBackend, SandboxRecord


@dataclass
class ReapReport:
    """What one pass of :func:`reap` saw and did (sandbox ids are the logical ``sbx-...`` ids)."""

    checked: int = 0
    killed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # the run is still open, or the sandbox is too young
    unknown: list[str] = field(default_factory=list)  # no run id in the metadata
    errors: dict[str, str] = field(default_factory=dict)  # sandbox id -> what went wrong (kept)

    def summary(self) -> str:
        text = (
            f"checked {self.checked} sandbox(es): killed {len(self.killed)}, kept {len(self.kept)}, "
            f"unknown {len(self.unknown)}, errors {len(self.errors)}"
        )
        lines = [text]
        lines += [f"  killed {sid}" for sid in self.killed]
        lines += [f"  error  {sid}: {why}" for sid, why in self.errors.items()]
        return "\n".join(lines)


async def reap(
    backend: SandboxBackend,
    is_run_closed: Callable[[str], Awaitable[bool]],
    *,
    min_age_s: float = 60.0,
    kill_unknown: bool = False,
    now: Callable[[], float] = time.time,
) -> ReapReport:
    """Kill every sandbox of ``backend`` whose run ``is_run_closed`` says is over; never raises per sandbox.

    Listing failures (the backend is unreachable) propagate: there is nothing to
    report on. Each run is asked about once, however many sandboxes it has.
    """
    report = ReapReport()
    records = await backend.list_sandboxes()
    verdicts: dict[str, bool | BaseException] = {}
    for record in records:
        report.checked += 1
        sid = record.sandbox_id
        if _too_young(record, min_age_s, now()):
            report.kept.append(sid)
            continue
        if not record.run_id:
            if not kill_unknown:
                report.unknown.append(sid)
                continue
            closed: bool | BaseException = True
        else:
            if record.run_id not in verdicts:
                try:
                    verdicts[record.run_id] = bool(await is_run_closed(record.run_id))
                except Exception as exc:  # one bad lookup must not stop the pass
                    verdicts[record.run_id] = exc
            closed = verdicts[record.run_id]
        if isinstance(closed, BaseException):
            report.errors[sid] = f"could not tell whether run {record.run_id!r} is closed: {closed}"
            continue
        if not closed:
            report.kept.append(sid)
            continue
        try:
            await backend.kill(sid)
        except Exception as exc:  # one sandbox that cannot be removed must never stop the pass
            report.errors[sid] = f"kill failed: {type(exc).__name__}: {exc}"
            continue
        if sid not in report.killed:
            report.killed.append(sid)
    return report


def _too_young(record: SandboxRecord, min_age_s: float, now: float) -> bool:
    return min_age_s > 0 and record.created_at is not None and now - record.created_at < min_age_s

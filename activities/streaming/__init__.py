"""Streamed model text, out of band of workflow history.

The ``model`` activity streams a reply from providers that can (``activities.models.streaming``) when
someone listens to its run, and writes the text as it comes to the run store's ``stream_deltas`` table
(batched: a reply is a handful of rows), never to workflow history. Readers
(:class:`durable_agents.streaming.DeltaReader`) read the rows after a per-run sequence number and wait
for new ones: PostgreSQL wakes them with ``NOTIFY``, SQLite readers poll. A reader announces itself in
``stream_listeners``; with no listener a turn makes the plain, whole-reply request.

Rows are the run's (its workflow id): erasure deletes them with the run, a run keeps at most
``MAX_ROWS_PER_RUN``, and rows of a finished turn go ``RETAIN_S`` after they were written.
"""

from activities.streaming.base import Delta, DeltaChannel
from activities.streaming.factory import open_channel

__all__ = ["Delta", "DeltaChannel", "open_channel"]

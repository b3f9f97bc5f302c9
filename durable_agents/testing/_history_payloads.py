"""Walk a Temporal history for its payloads (used by the history-size test and benchmark)."""

from __future__ import annotations

from collections.abc import Iterator

from google.protobuf.message import Message as ProtoMessage
from temporalio.api.common.v1 import Payload


def payloads(message: ProtoMessage) -> Iterator[Payload]:
    """Every ``Payload`` anywhere inside ``message`` (inputs, results, markers, failures, memos...)."""
    if isinstance(message, Payload):
        yield message
        return
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        if isinstance(value, ProtoMessage):
            items = [value]
        elif field.message_type.GetOptions().map_entry:
            items = [v for v in value.values() if isinstance(v, ProtoMessage)]
        else:  # a repeated field
            items = list(value)
        for item in items:
            yield from payloads(item)

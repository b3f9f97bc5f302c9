"""The transcript prefixes a worker has already read or written, so each model turn reads only what is new.

A model turn needs the whole conversation so far. Reading it from the run store every turn makes a
run of N turns read O(N²) entries (at 200 turns a fifth of a worker's busy time went to decoding
the same rows again). Transcript entries are write-once (``put_message`` inserts if absent, and a
reset or fork continues in a new conversation id), so a prefix read once stays true: the cache
keeps it and asks the store only for the entries past it. Another worker may have written those;
nothing here assumes this worker saw the run before.

The cache is bounded by characters held (plus a per-entry allowance for the objects) and by
conversations; the least recently used conversation goes first. A conversation larger than the
whole bound is never cached (it is read as before). A worker sizes the conversation bound from its
workflow cache (:func:`conversations_for`): a run out of the worker's workflow cache is parked
(on a human, a timer or a message), and keeping its transcript too would only hold memory.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from activities.store.base import RunStore, StoredMessage
from workflows.types import Message

DEFAULT_MAX_CHARS = 32 * 1024 * 1024
DEFAULT_MAX_CONVERSATIONS = 4096
# Floor of the worker's bound, for a worker that caches few or no workflows (each of its runs still
# reads its transcript once per turn).
MIN_CONVERSATIONS = 64
_ENTRY_OVERHEAD_CHARS = 512  # a message object's memory besides its text, roughly
PAGE = 1000


def conversations_for(max_cached_workflows: int) -> int:
    """The conversation bound of a worker caching ``max_cached_workflows`` workflows: twice that, at least
    :data:`MIN_CONVERSATIONS`, at most :data:`DEFAULT_MAX_CONVERSATIONS`.

    Twice, because a run's model and tool activities may run on a worker other than the one caching its
    workflow. At the default cache of 500 this holds 1,000 conversations; in ``bench.scale waiting``
    (10,000 runs parked on approvals) a parked run's transcript is ~3 KB.
    """
    return max(MIN_CONVERSATIONS, min(DEFAULT_MAX_CONVERSATIONS, 2 * max_cached_workflows))


def _size(message: Message) -> int:
    return (
        len(message.content)
        + sum(len(call.name) + len(call.arguments_json) + len(call.id) for call in message.tool_calls)
        + _ENTRY_OVERHEAD_CHARS
    )


@dataclass
class _Prefix:
    messages: list[Message] = field(default_factory=list)
    chars: int = 0


class TranscriptCache:
    """Entries ``[0, n)`` of recently used conversations, in front of a :class:`RunStore`."""

    def __init__(
        self,
        store: RunStore,
        *,
        max_chars: int = DEFAULT_MAX_CHARS,
        max_conversations: int = DEFAULT_MAX_CONVERSATIONS,
    ) -> None:
        self._store = store
        self._max_chars = max_chars
        self._max_conversations = max_conversations
        self._prefixes: OrderedDict[str, _Prefix] = OrderedDict()
        self._chars = 0

    @property
    def chars(self) -> int:
        """Characters held now (for tests and the bound)."""
        return self._chars

    def __len__(self) -> int:
        return len(self._prefixes)

    async def messages(self, conversation_id: str, upto: int) -> list[Message]:
        """Entries ``[0, upto)`` in order, as :meth:`RunStore.messages` (``StoreError`` if one is missing)."""
        prefix = self._prefixes.get(conversation_id)
        have = len(prefix.messages) if prefix else 0
        if prefix is not None:
            self._prefixes.move_to_end(conversation_id)
            if have >= upto:
                return prefix.messages[:upto]
        fresh: list[Message] = []
        position = have
        while position < upto:
            page = await self._store.entries_after(conversation_id, position - 1, min(PAGE, upto - position))
            if not page or any(entry.seq != position + i for i, entry in enumerate(page)):
                # A gap: the store's own read names the missing positions.
                return [entry.message for entry in await self._store.messages(conversation_id, upto)]
            fresh.extend(entry.message for entry in page)
            position += len(page)
        known = prefix.messages if prefix else []
        self._extend(conversation_id, fresh, start=have)
        return [*known[:have], *fresh]

    def remember(self, conversation_id: str, stored: StoredMessage) -> None:
        """Note an entry just written or read back (kept only when it extends the cached prefix)."""
        prefix = self._prefixes.get(conversation_id)
        if prefix is not None and stored.seq == len(prefix.messages):
            self._extend(conversation_id, [stored.message], start=stored.seq)

    def _extend(self, conversation_id: str, messages: list[Message], *, start: int) -> None:
        prefix = self._prefixes.get(conversation_id)
        if prefix is None:
            if start != 0:
                return
            prefix = self._prefixes[conversation_id] = _Prefix()
        elif len(prefix.messages) != start:  # another coroutine extended it meanwhile: entries are equal
            return
        added = sum(_size(m) for m in messages)
        prefix.messages.extend(messages)
        prefix.chars += added
        self._chars += added
        self._prefixes.move_to_end(conversation_id)
        self._evict()

    def _evict(self) -> None:
        while self._prefixes and (self._chars > self._max_chars or len(self._prefixes) > self._max_conversations):
            _, prefix = self._prefixes.popitem(last=False)
            self._chars -= prefix.chars

"""Checkpoint ids the workflow carries, beyond a manifest's digest: the "no checkpoint of its own" id.

A sandbox tool whose workspace could not be checkpointed (its run's checkpoints stopped at
``AGENT_CHECKPOINT_RUN_MAX_MB`` / ``_COUNT``, the workspace is over ``AGENT_CHECKPOINT_MAX_MB``, or
taking it failed) still returns an id, ``unsaved:<nonce>:<base>``: ``base`` is the last real
checkpoint before it ("" for the empty workspace), ``nonce`` is derived from the tool call, so each
uncheckpointed step has an id of its own. The workflow adopts it like any other, which keeps three
things right without any workflow change:

* the next sandbox tool finds the sandbox's marker naming that same id: nothing is restored (the
  run goes on with its files);
* a rewind to an earlier, checkpointed step expects another id: that checkpoint is restored
  (with only ``base`` recorded, the marker would still claim it and the later files would stay);
* a fork or rewind *at* such a step sees that it has no checkpoint of its own and is refused,
  instead of silently getting ``base``'s files under a transcript that describes later ones.

A sandbox that must be brought back to an ``unsaved`` id (recreated after it was lost) gets
``base``, and the model is told that the files changed since were lost.
"""

from __future__ import annotations

import hashlib

UNSAVED_PREFIX = "unsaved:"
_BRANCH = "~"


def unsaved_id(base: str, call_key: str) -> str:
    """The id of a step that has no checkpoint of its own, after the last real checkpoint ``base``."""
    nonce = hashlib.sha256(call_key.encode()).hexdigest()[:8]
    return f"{UNSAVED_PREFIX}{nonce}:{real_base(base)}"


def unsaved_base(checkpoint_id: str) -> str | None:
    """The last real checkpoint an ``unsaved`` id follows (``""``: the empty workspace); None for other ids."""
    if not checkpoint_id.startswith(UNSAVED_PREFIX):
        return None
    return checkpoint_id[len(UNSAVED_PREFIX) :].partition(":")[2]


def real_base(checkpoint_id: str) -> str:
    """``checkpoint_id`` itself, or the last real checkpoint of an ``unsaved`` one."""
    base = unsaved_base(checkpoint_id)
    return checkpoint_id if base is None else base


def run_key(conversation_id: str) -> str:
    """The key a run's checkpoint budget is counted under: its conversation without rewind branches.

    Conversation ids are ``<workflow_id>/<run_id>[~<branch>...]`` (a workflow id may hold ``/`` and
    ``~``; run ids and branch suffixes hold neither).
    """
    head, slash, tail = conversation_id.rpartition("/")
    return f"{head}{slash}{tail.partition(_BRANCH)[0]}" if slash else conversation_id

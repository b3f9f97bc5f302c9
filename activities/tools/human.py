"""``ask_human``: the model asks a person a question and the run waits for the answer.

Offered to the model like any tool (leave it out with a run's ``tools`` or deny it by policy). The
workflow answers it itself: it opens a question a person answers with the ``answer`` signal, the
``decide`` update or ``starter.py answer``, and hands the answer (or that nobody answered in
time) to the model as the call's result. No activity runs for it; the declaration here gives the
model its description and arguments, and the worker validates calls against it.
"""

from __future__ import annotations

from activities.tools.spec import ToolContext, ToolError, tool
from workflows.types import ASK_HUMAN, AskHumanArgs


@tool(
    ASK_HUMAN,
    description=(
        "Ask a human a question and wait for the answer (it may take hours). Offer options when the answer "
        "is one of a few choices; set allow_free_text to false to accept only those."
    ),
    args=AskHumanArgs,
)
async def ask_human(args: AskHumanArgs, ctx: ToolContext) -> str:
    # The workflow answers every call of this tool (workflows.questions); reaching here is a wiring bug.
    raise ToolError("ask_human is answered by a person through the run; it never runs as an activity")

"""The floor: a bare Temporal workflow doing what an agent turn must do at least, and nothing more.

Per turn one no-op "model" activity and one "tool" activity returning ``kb`` KB (which,
unlike our tool outputs, lands in history), then one last model activity: the same
activity count as an ``AgentWorkflow`` run of ``turns`` tool-calling turns and an answer.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    from bench.fixtures_scale import blob

TIMEOUT = timedelta(seconds=60)


@activity.defn(name="floor_model")
async def floor_model(turn: int) -> str:
    return ""


@activity.defn(name="floor_tool")
async def floor_tool(kb: int) -> str:
    return blob(kb)


@workflow.defn(name="BenchFloorWorkflow")
class FloorWorkflow:
    @workflow.run
    async def run(self, turns: int, kb: int) -> int:
        total = 0
        for turn in range(turns):
            await workflow.execute_activity(floor_model, turn, start_to_close_timeout=TIMEOUT)
            total += len(await workflow.execute_activity(floor_tool, kb, start_to_close_timeout=TIMEOUT))
        await workflow.execute_activity(floor_model, turns, start_to_close_timeout=TIMEOUT)
        return total


FLOOR_ACTIVITIES = [floor_model, floor_tool]

"""Record the histories replayed by ``tests/test_replay.py``.

    .venv/bin/python -m scripts.record_histories            # every scenario
    .venv/bin/python -m scripts.record_histories approvals  # one

Run it when you add a scenario, never to "fix" a failing replay: a replay
failure means the loop's command sequence changed, which must be guarded with
``workflow.patched`` so that runs started before the change still replay.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import uuid
from pathlib import Path

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from activities.settings import ProviderEndpoint, Settings
from tests.fakes.http_sink import HttpSink
from tests.fakes.llm_server import FakeLLMServer
from tests.scenarios import SCENARIOS
from worker import build_worker

OUT = Path(__file__).resolve().parent.parent / "tests" / "histories"
TEMPORAL = Path(sys.executable).parent / "temporal"


async def record(names: list[str]) -> None:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL), data_converter=pydantic_data_converter
    )
    try:
        for name in names:
            with tempfile.TemporaryDirectory() as tmp, FakeLLMServer() as llm, HttpSink() as sink:
                settings = Settings(
                    model="openai:test-model",
                    openai=ProviderEndpoint(llm.openai_url),
                    http_allow=("127.0.0.1:1024-65535",),
                    store_url=f"{tmp}/store.sqlite3",
                    state_dir=Path(tmp),
                )
                runtime = Runtime.from_settings(settings)
                tq = f"record-{uuid.uuid4().hex[:8]}"
                async with build_worker(env.client, runtime, task_queue=tq):
                    handle = await SCENARIOS[name](env.client, tq, llm, sink, f"history-{name}")
                history = await handle.fetch_history()
                (OUT / f"{name}.json").write_text(history.to_json())
                print(f"recorded {name}: {len(history.events)} events")
                await runtime.aclose()
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(record(sys.argv[1:] or list(SCENARIOS)))

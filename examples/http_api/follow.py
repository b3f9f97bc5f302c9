"""A front end over the HTTP API: start a run, follow its events (resuming after a dropped connection),
read its result. Nothing here imports Durable Agents: any HTTP client in any language does the same.

    python -m examples.http_api.follow --api http://127.0.0.1:8080 --token TOKEN [--task TEXT]

``starter.py serve`` must serve ``--api`` (with ``TOKEN`` in its ``AGENT_API_TOKENS_FILE``, role
``starter``) and a worker must poll its task queue. The script drops the event stream after the first
event on purpose and reconnects with ``Last-Event-ID``: it still prints every event once, in order.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import Any

import httpx


def events(http: httpx.Client, workflow_id: str, last_event_id: str = "") -> Iterator[tuple[str, str, Any]]:
    """(id, kind, data) of each Server-Sent Event of the run after ``last_event_id``, until ``end``."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    with http.stream("GET", f"/v1/runs/{workflow_id}/events", headers=headers) as response:
        response.raise_for_status()
        frame: dict[str, str] = {}
        for line in response.iter_lines():
            if line:
                if not line.startswith(":"):  # ":" starts a heartbeat comment
                    field, _, value = line.partition(": ")
                    frame[field] = value
                continue
            if "event" in frame:
                yield frame.get("id", ""), frame["event"], json.loads(frame.get("data") or "{}")
            frame = {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", required=True, help="the API's base URL")
    parser.add_argument("--token", required=True, help="a bearer token of the API")
    parser.add_argument("--task", default="Say hello.")
    args = parser.parse_args()
    auth = {"Authorization": f"Bearer {args.token}"}
    with httpx.Client(base_url=args.api, headers=auth, timeout=httpx.Timeout(30, read=120)) as http:
        started = http.post("/v1/runs", json={"task": args.task})
        started.raise_for_status()
        workflow_id = started.json()["workflow_id"]
        print(f"started: {workflow_id}")

        last = ""
        for event_id, kind, _ in events(http, workflow_id):
            print(f"event {event_id}: {kind}")
            last = event_id
            break  # the connection drops here ...
        for event_id, kind, data in events(http, workflow_id, last_event_id=last):  # ... and resumes after it
            if kind == "end":
                break
            detail = data.get("progress", {}).get("text", "") if kind != "delta" else data.get("text", "")
            print(f"event {event_id}: {kind} {detail[:60]}".rstrip())

        view = http.get(f"/v1/runs/{workflow_id}").json()
        print(f"state: {view['state']}")
        print(f"output: {view['output']}")
    return 0 if view["state"] == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())

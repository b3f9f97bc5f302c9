"""The RunStore contract, run against both backends (SQLite file, real PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from activities.store import RunStore, StoreError, open_store
from activities.store.ledger import ClaimRequest
from activities.store.postgres import PostgresRunStore
from tests.waiting import eventually, eventually_sync
from workflows.types import Message

ROOT = Path(__file__).resolve().parent.parent


# ``store_url`` and ``store`` (SQLite and PostgreSQL) come from tests/pg.py.


def req(
    key: str = "k1", owner: str = "a", lease_s: float = 30.0, force: bool = False, attempt: int = 1
) -> ClaimRequest:
    return ClaimRequest(
        key=key,
        tool="http_request",
        args_hash="h",
        workflow_id="wf-1",
        owner=owner,
        attempt=attempt,
        lease_s=lease_s,
        force=force,
    )


def msg(text: str) -> Message:
    return Message(role="tool", content=text, tool_call_id="c1", name="t")


# --- transcript -------------------------------------------------------------------------


async def test_put_message_is_insert_if_absent(store: RunStore) -> None:
    first = await store.put_message("conv", 0, msg("first"), {"by": "a"})
    second = await store.put_message("conv", 0, msg("second"), {"by": "b"})
    assert first.message.content == "first" and first.meta == {"by": "a"}
    assert second == first  # the second writer reads back the first writer's entry
    got = await store.get_message("conv", 0)
    assert got == first
    assert await store.get_message("conv", 1) is None
    assert await store.get_message("other", 0) is None


async def test_messages_in_order_and_gap_is_an_error(store: RunStore) -> None:
    for seq in (2, 0, 1):
        await store.put_message("conv", seq, msg(f"m{seq}"))
    await store.put_message("other", 0, msg("elsewhere"))
    got = await store.messages("conv", 3)
    assert [(m.seq, m.message.content) for m in got] == [(0, "m0"), (1, "m1"), (2, "m2")]
    assert [m.seq for m in await store.messages("conv", 2)] == [0, 1]
    assert await store.messages("conv", 0) == []
    await store.put_message("conv", 4, msg("m4"))
    with pytest.raises(StoreError, match=r"missing entries \[3\]"):
        await store.messages("conv", 5)


async def test_message_content_round_trips_exactly(store: RunStore) -> None:
    text = 'NUL \x00, quotes "\'", unicode ✓ 🙂, backslash \\ and {"json": 1}'
    stored = await store.put_message("conv", 0, msg(text), {"nested": {"a": [1, 2]}})
    again = await store.get_message("conv", 0)
    assert stored.message.content == text and again is not None and again.message.content == text
    assert again.meta == {"nested": {"a": [1, 2]}}


async def test_concurrent_writers_of_one_position_agree(store_url: str) -> None:
    stores = [open_store(store_url) for _ in range(8)]
    try:
        results = await asyncio.gather(*(s.put_message("conv", 0, msg(f"w{i}")) for i, s in enumerate(stores)))
        assert len({r.message.content for r in results}) == 1
    finally:
        for s in stores:
            await s.close()


# --- ledger -----------------------------------------------------------------------------


async def test_claim_fresh_busy_recovered_done(store: RunStore) -> None:
    fresh = await store.claim(req(owner="a", lease_s=30))
    assert fresh.status == "fresh"
    assert (fresh.entry.state, fresh.entry.owner, fresh.entry.executions) == ("intent", "a", 0)
    assert fresh.entry.lease_until > time.time() + 20

    busy = await store.claim(req(owner="b", attempt=2))
    assert busy.status == "busy" and busy.entry.owner == "a"  # nothing changed

    await store.started("k1", "a")
    # "a" dies; its lease runs out (a lease of 0 is already over)
    assert await store.renew("k1", "a", 0)
    recovered = await store.claim(req(owner="b", attempt=2))
    assert recovered.status == "recovered"
    assert (recovered.entry.owner, recovered.entry.attempt, recovered.entry.executions) == ("b", 2, 1)

    await store.started("k1", "b")
    await store.finish("k1", "b", "done", "HTTP 200", False, note="ok")
    done = await store.claim(req(owner="c", attempt=3))
    assert done.status == "done"
    assert (done.entry.result, done.entry.is_error, done.entry.note, done.entry.executions) == (
        "HTTP 200",
        False,
        "ok",
        2,
    )
    assert done.entry.owner == "b"


async def test_expired_lease_is_recovered(store: RunStore) -> None:
    # Long enough that the second claim meets a live lease on a busy machine; a busy claim changes nothing.
    assert (await store.claim(req(owner="a", lease_s=3))).status == "fresh"
    assert (await store.claim(req(owner="b"))).status == "busy"

    async def recovered() -> bool:
        status = (await store.claim(req(owner="b"))).status
        assert status in ("busy", "recovered"), status
        return status == "recovered"

    await eventually(recovered, "the expired lease is recovered", every_s=0.1)


async def test_same_owner_reclaiming_its_live_key_is_recovered(store: RunStore) -> None:
    await store.claim(req(owner="a"))
    assert (await store.claim(req(owner="a"))).status == "recovered"


async def test_finish_never_overwrites_done(store: RunStore) -> None:
    await store.claim(req(owner="a"))
    await store.finish("k1", "a", "done", "first", False)
    await store.finish("k1", "zombie", "done", "second", True)
    await store.finish("k1", "zombie", "unknown", "", False, note="late")
    [entry] = await store.ledger()
    assert (entry.state, entry.result, entry.is_error, entry.note, entry.lease_until) == ("done", "first", False, "", 0)


async def test_unknown_outcome_is_recovered_and_can_become_done(store: RunStore) -> None:
    await store.claim(req(owner="a"))
    await store.finish("k1", "a", "unknown", "", False, note="died")
    again = await store.claim(req(owner="b"))
    assert again.status == "recovered" and again.entry.state == "intent"
    await store.finish("k1", "human", "done", "confirmed", False, note="resolved")
    assert (await store.claim(req(owner="c"))).entry.result == "confirmed"


async def test_force_takes_the_key_whatever_its_state(store: RunStore) -> None:
    await store.claim(req(owner="a"))
    forced = await store.claim(req(owner="b", force=True, attempt=2))
    assert forced.status == "fresh" and forced.entry.owner == "b" and forced.entry.state == "intent"
    await store.finish("k1", "b", "done", "r", False)
    forced = await store.claim(req(owner="c", force=True, attempt=3))
    assert forced.status == "fresh" and forced.entry.state == "intent" and forced.entry.owner == "c"


async def test_renew_only_by_the_holder(store: RunStore) -> None:
    await store.claim(req(owner="a", lease_s=5))
    assert await store.renew("k1", "a", 60)
    [entry] = await store.ledger()
    assert entry.lease_until > time.time() + 50
    assert not await store.renew("k1", "b", 60)
    assert not await store.renew("missing", "a", 60)
    await store.finish("k1", "a", "done", "r", False)
    assert not await store.renew("k1", "a", 60)  # no lease on a finished key


async def test_renew_zero_releases_the_lease(store: RunStore) -> None:
    await store.claim(req(owner="a", lease_s=60))
    assert (await store.claim(req(owner="b"))).status == "busy"
    assert await store.renew("k1", "a", 0)
    assert (await store.claim(req(owner="b"))).status == "recovered"


async def test_started_counts_executions_of_the_owner_only(store: RunStore) -> None:
    await store.claim(req(owner="a"))
    await store.started("k1", "a")
    await store.started("k1", "a")
    await store.started("k1", "someone-else")
    [entry] = await store.ledger()
    assert entry.executions == 2


async def test_a_fresh_claim_can_count_its_start_in_the_same_write(store: RunStore) -> None:
    starting = req(owner="a", lease_s=0.0).model_copy(update={"start_if_fresh": True})
    fresh = await store.claim(starting)
    assert (fresh.status, fresh.entry.executions) == ("fresh", 1)
    # Only a fresh claim counts: a recovered one leaves the count to ``started`` (recovery may not run it).
    recovered = await store.claim(starting.model_copy(update={"owner": "b", "attempt": 2}))
    assert (recovered.status, recovered.entry.executions) == ("recovered", 1)
    forced = await store.claim(starting.model_copy(update={"owner": "c", "attempt": 3, "force": True}))
    assert (forced.status, forced.entry.executions) == ("fresh", 2)
    [entry] = await store.ledger()
    assert (entry.owner, entry.executions) == ("c", 2)


async def test_ledger_lists_in_claim_order_and_by_workflow(store: RunStore) -> None:
    for key in ("z", "a", "m"):
        await store.claim(req(key=key))
    await store.claim(req(key="o").model_copy(update={"workflow_id": "wf-2"}))
    assert [e.key for e in await store.ledger()] == ["z", "a", "m", "o"]
    assert [e.key for e in await store.ledger("wf-1")] == ["z", "a", "m"]
    assert [e.key for e in await store.ledger("wf-2")] == ["o"]
    assert await store.ledger("none") == []


async def test_concurrent_claims_of_one_key_yield_exactly_one_fresh(store_url: str) -> None:
    stores = [open_store(store_url) for _ in range(20)]
    try:
        await asyncio.gather(*(s.ledger() for s in stores))  # connected (and migrated) before the race
        claims = await asyncio.gather(*(s.claim(req(owner=f"w{i}")) for i, s in enumerate(stores)))
        statuses = sorted(c.status for c in claims)
        assert statuses == ["busy"] * 19 + ["fresh"]
        winner = next(c.entry.owner for c in claims if c.status == "fresh")
        assert all(c.entry.owner == winner for c in claims)
    finally:
        for s in stores:
            await s.close()


async def test_concurrent_recovery_of_an_expired_key_yields_exactly_one_holder(store_url: str) -> None:
    stores = [open_store(store_url) for _ in range(20)]
    try:
        await stores[0].claim(req(owner="dead", lease_s=0))  # intent whose lease is already over
        await asyncio.gather(*(s.ledger() for s in stores))
        claims = await asyncio.gather(*(s.claim(req(owner=f"w{i}", attempt=2)) for i, s in enumerate(stores)))
        assert sorted(c.status for c in claims) == ["busy"] * 19 + ["recovered"]
        [entry] = await stores[0].ledger()
        assert entry.owner == next(c.entry.owner for c in claims if c.status == "recovered")
    finally:
        for s in stores:
            await s.close()


# --- PostgreSQL specifics ------------------------------------------------------------------

_RACER = """
import asyncio, json, sys, time
from pathlib import Path
from activities.store import open_store
from activities.store.ledger import ClaimRequest

url, name, barrier = sys.argv[1], sys.argv[2], Path(sys.argv[3])

async def main() -> None:
    store = open_store(url)
    await store.ledger()  # connected before the start signal
    (barrier / f"ready-{name}").touch()
    while not (barrier / "go").exists():
        time.sleep(0.0005)
    claim = await store.claim(ClaimRequest(key="race", tool="t", args_hash="h", workflow_id="wf",
                                           owner=name, attempt=1, lease_s=30))
    print(json.dumps({"status": claim.status, "owner": claim.entry.owner}))
    await store.close()

asyncio.run(main())
"""


def test_cross_process_claim_race_has_one_winner(postgres_db_url: str, tmp_path: Path) -> None:
    names = ("p1", "p2")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, postgres_db_url, name, str(tmp_path)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in names
    ]

    def ready() -> bool:
        if not all(p.poll() is None for p in procs):
            raise RuntimeError(f"a racer exited: {[p.communicate() for p in procs]}")
        return all((tmp_path / f"ready-{n}").exists() for n in names)

    eventually_sync(ready, "the racers get ready", every_s=0.005)
    (tmp_path / "go").touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    assert sorted(r["status"] for r in results) == ["busy", "fresh"]
    assert results[0]["owner"] == results[1]["owner"]


async def test_a_conninfo_store_url_opens_postgresql(
    postgres_db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``host=... dbname=... user=... password=...`` opens PostgreSQL (issue 21: it was a SQLite file name)."""
    monkeypatch.chdir(tmp_path)
    params = psycopg.conninfo.conninfo_to_dict(postgres_db_url)
    params["password"] = "pw-conninfo-not-a-file-name"  # the embedded server trusts its socket; libpq sends it
    url = psycopg.conninfo.make_conninfo("", **params)
    assert "://" not in url and "password=" in url
    store = open_store(url)
    try:
        assert isinstance(store, PostgresRunStore)
        await store.put_message("conv", 0, msg("over conninfo"))
        got = await store.get_message("conv", 0)
        assert got is not None and got.message.content == "over conninfo"
    finally:
        await store.close()
    shared = open_store(postgres_db_url)  # the same database through a URL: one store, not a file per worker
    try:
        again = await shared.get_message("conv", 0)
        assert again is not None and again.message.content == "over conninfo"
    finally:
        await shared.close()
    assert os.listdir(tmp_path) == [], "no SQLite file was created"


async def test_migrations_are_idempotent_and_race_free(postgres_db_url: str) -> None:
    stores = [PostgresRunStore(postgres_db_url) for _ in range(8)]
    try:
        await asyncio.gather(*(s.ledger() for s in stores))  # every one migrates at once
        await stores[0].put_message("conv", 0, msg("kept"))
    finally:
        for s in stores:
            await s.close()
    reopened = PostgresRunStore(postgres_db_url)
    try:
        assert (await reopened.get_message("conv", 0)) is not None
    finally:
        await reopened.close()
    async with await psycopg.AsyncConnection.connect(postgres_db_url) as conn:
        cur = await conn.execute("SELECT version, count(*) FROM schema_migrations GROUP BY version ORDER BY version")
        rows = await cur.fetchall()
    assert rows and all(count == 1 for _, count in rows)
    assert [v for v, _ in rows] == list(range(1, len(rows) + 1))


async def test_unreachable_server_is_a_store_error_without_the_password() -> None:
    store = open_store("postgresql://agent:s3cret-pw@127.0.0.1:1/agents")  # constructing does not connect
    assert isinstance(store, PostgresRunStore)
    with pytest.raises(StoreError) as caught:
        await store.get_message("conv", 0)
    text = str(caught.value)
    assert "s3cret-pw" not in text and "***" in text and "127.0.0.1" in text
    await store.close()


async def test_closed_store_refuses_work(postgres_db_url: str) -> None:
    store = PostgresRunStore(postgres_db_url)
    await store.ledger()
    await store.close()
    with pytest.raises(StoreError, match="closed"):
        await store.ledger()


async def test_nul_in_a_ledger_result_is_stored(postgres_db_url: str) -> None:
    store = PostgresRunStore(postgres_db_url)
    try:
        await store.claim(req(owner="a"))
        await store.finish("k1", "a", "done", "body \x00 end", False)
        [entry] = await store.ledger()
        assert entry.result == "body \ufffd end"
    finally:
        await store.close()


async def test_budget_grants_one_turn_alone_then_only_what_fits(store: RunStore) -> None:
    root = f"tree-{uuid.uuid4().hex[:8]}"
    assert await store.budget_reserve(root, "a/2", 100, 0, 150) == "granted"  # alone: may overshoot
    assert await store.budget_reserve(root, "a/2", 100, 0, 150) == "granted"  # its retry
    assert await store.budget_reserve(root, "b/2", 100, 0, 10) == "wait"  # 150 in flight already
    await store.budget_settle(root, "a/2", 30, 0.0)  # the reservation becomes what it spent
    await store.budget_settle(root, "a/2", 99, 0.0)  # the first settlement wins
    assert await store.budget_reserve(root, "b/2", 100, 0, 40) == "granted"  # alone in flight
    assert await store.budget_reserve(root, "c/2", 100, 0, 30) == "granted"  # 30 + 40 + 30 fit
    assert await store.budget_reserve(root, "d/2", 100, 0, 1) == "wait"  # 30 + 40 + 30 + 1 do not
    await store.budget_release(root, "c/2")
    assert await store.budget_reserve(root, "d/2", 100, 0, 30) == "granted"
    await store.budget_settle(root, "b/2", 40, 0.0)
    await store.budget_settle(root, "d/2", 40, 0.0)
    assert await store.budget_reserve(root, "e/2", 100, 0, 1) == "exhausted"
    spent = await store.budget_spent(root)
    assert (spent.tokens, spent.turns, spent.in_flight) == (110, 3, 0)


async def test_budget_caps_cost_too(store: RunStore) -> None:
    root = f"tree-{uuid.uuid4().hex[:8]}"
    assert await store.budget_reserve(root, "a", 10**6, 1.0, 10, 0.7) == "granted"
    assert await store.budget_reserve(root, "b", 10**6, 1.0, 10, 0.4) == "wait"  # 0.7 + 0.4 > 1
    await store.budget_settle(root, "a", 10, 0.6)
    assert await store.budget_reserve(root, "b", 10**6, 1.0, 10, 0.5) == "granted"
    assert await store.budget_reserve(root, "c", 10**6, 1.0, 10, 0.1) == "wait"
    await store.budget_settle(root, "b", 10, 0.6)
    assert await store.budget_reserve(root, "c", 10**6, 1.0, 10, 0.1) == "exhausted"
    assert (await store.budget_spent(root)).cost_usd == 1.2


async def test_tree_runs_are_counted_up_to_the_cap(store: RunStore) -> None:
    root = f"tree-{uuid.uuid4().hex[:8]}"
    assert [await store.tree_run_reserve(root, f"child-{i}", 3) for i in range(5)] == [True] * 3 + [False] * 2
    assert await store.tree_run_reserve(root, "child-1", 3)  # a retry of a counted start
    assert await store.tree_runs(root) == 3
    assert await store.tree_run_reserve(f"{root}-other", "child-0", 3)  # trees are counted apart


async def test_a_tenants_open_runs_are_counted_up_to_the_cap_and_given_back(store: RunStore) -> None:
    tenant = f"tenant-{uuid.uuid4().hex[:8]}"
    verdicts = [await store.tenant_run_reserve(tenant, f"run-{i}", 2) for i in range(3)]
    assert verdicts == [(True, []), (True, []), (False, ["run-0", "run-1"])]
    assert await store.tenant_run_reserve(tenant, "run-1", 2) == (True, [])  # a retry of a counted start
    assert await store.tenant_run_reserve(f"{tenant}-other", "run-0", 2) == (True, [])  # tenants are counted apart
    assert await store.tenant_runs(tenant) == [(tenant, "run-0"), (tenant, "run-1")]
    assert await store.tenant_run_release(tenant, "run-0") and not await store.tenant_run_release(tenant, "run-0")
    assert await store.tenant_run_reserve(tenant, "run-2", 2) == (True, [])
    assert (f"{tenant}-other", "run-0") in await store.tenant_runs()

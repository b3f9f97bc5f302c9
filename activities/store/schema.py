"""The run store's tables, in each database's dialect: SQLite's (created if missing) and PostgreSQL's migrations.

Both hold the same tables (transcript, ledger, budget, tree_runs, blobs, checkpoint_usage, tenant_runs,
blob_refs, streamed text's: stream_deltas, stream_listeners, and long-term memory's: memory_entries,
memory_namespaces, memory_terms, plus its full-text index); a change to one is a change to the other.
PostgreSQL applies its migrations in order, once each, recorded in
``schema_migrations`` (:meth:`activities.store.postgres.PostgresRunStore._migrate`).
"""

SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS transcript (
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    message TEXT NOT NULL,
    meta TEXT NOT NULL DEFAULT '{}',
    created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP,
    PRIMARY KEY (conversation_id, seq)
);
CREATE TABLE IF NOT EXISTS ledger (
    key TEXT PRIMARY KEY,
    tool TEXT NOT NULL,
    args_hash TEXT NOT NULL,
    workflow_id TEXT NOT NULL,
    state TEXT NOT NULL,
    owner TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    lease_until REAL NOT NULL,
    executions INTEGER NOT NULL DEFAULT 0,
    result TEXT NOT NULL DEFAULT '',
    is_error INTEGER NOT NULL DEFAULT 0,
    note TEXT NOT NULL DEFAULT '',
    updated_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP
);
CREATE INDEX IF NOT EXISTS ledger_workflow ON ledger (workflow_id);
CREATE TABLE IF NOT EXISTS budget (
    root TEXT NOT NULL,
    key TEXT NOT NULL,
    settled INTEGER NOT NULL DEFAULT 0,
    tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL NOT NULL DEFAULT 0,
    at REAL NOT NULL,
    PRIMARY KEY (root, key)
);
CREATE TABLE IF NOT EXISTS tree_runs (
    root TEXT NOT NULL,
    key TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (root, key)
);
CREATE TABLE IF NOT EXISTS blobs (
    digest TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    encoding TEXT NOT NULL,
    data BLOB NOT NULL,
    created_at REAL NOT NULL
);
-- Covering, so that listing old blobs never reads their data (which sits before created_at in a row).
CREATE INDEX IF NOT EXISTS blobs_created ON blobs (created_at, digest);
CREATE TABLE IF NOT EXISTS checkpoint_usage (
    run TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (run, checkpoint_id)
);
CREATE TABLE IF NOT EXISTS tenant_runs (
    tenant TEXT NOT NULL,
    workflow_id TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (tenant, workflow_id)
);
-- Which runs (and their tenant and user) use a blob: forget and retention delete a blob only when no other
-- run uses it (activities.erasure).
CREATE TABLE IF NOT EXISTS blob_refs (
    digest TEXT NOT NULL,
    run TEXT NOT NULL,
    tenant TEXT NOT NULL DEFAULT '',
    user_name TEXT NOT NULL DEFAULT '',
    at REAL NOT NULL,
    PRIMARY KEY (digest, run)
);
CREATE INDEX IF NOT EXISTS blob_refs_run ON blob_refs (run);
-- Streamed model text (activities.streaming): deltas by run and a per-run sequence, and who listens.
CREATE TABLE IF NOT EXISTS stream_deltas (
    workflow_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    turn INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    restart INTEGER NOT NULL DEFAULT 0,
    text TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (workflow_id, seq)
);
CREATE INDEX IF NOT EXISTS stream_deltas_created ON stream_deltas (created_at);
CREATE TABLE IF NOT EXISTS stream_listeners (
    workflow_id TEXT PRIMARY KEY,
    until REAL NOT NULL
);
-- Long-term memory (activities.memory). "user_name": "user" is a reserved word in PostgreSQL.
CREATE TABLE IF NOT EXISTS memory_entries (
    id INTEGER PRIMARY KEY,
    tenant TEXT NOT NULL,
    user_name TEXT NOT NULL,
    key TEXT NOT NULL,
    idem_key TEXT NOT NULL,
    text TEXT NOT NULL,
    size INTEGER NOT NULL,
    length INTEGER NOT NULL,
    sealed INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    expires_at REAL,
    UNIQUE (tenant, user_name, key)
);
CREATE UNIQUE INDEX IF NOT EXISTS memory_entries_idem ON memory_entries (tenant, user_name, idem_key);
CREATE INDEX IF NOT EXISTS memory_entries_expiry ON memory_entries (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS memory_namespaces (
    tenant TEXT NOT NULL,
    user_name TEXT NOT NULL,
    entries INTEGER NOT NULL DEFAULT 0,
    bytes INTEGER NOT NULL DEFAULT 0,
    terms INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, user_name)
);
CREATE TABLE IF NOT EXISTS memory_terms (
    term BLOB NOT NULL,
    entry INTEGER NOT NULL,
    tf INTEGER NOT NULL,
    PRIMARY KEY (term, entry)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS memory_terms_entry ON memory_terms (entry);
-- External content: the index holds terms only; plaintext entries are added and removed explicitly.
CREATE VIRTUAL TABLE IF NOT EXISTS memory_fts USING fts5(
    text, content='memory_entries', content_rowid='id', tokenize='unicode61 remove_diacritics 2'
);
-- How many entries hold each term: a search leaves out the words most entries hold (activities.memory.scoring).
CREATE VIRTUAL TABLE IF NOT EXISTS memory_vocab USING fts5vocab(memory_fts, 'row');
"""

# Ordered: version N is POSTGRES_MIGRATIONS[N - 1]. Append only; never edit an applied one.
POSTGRES_MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE transcript (
        conversation_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        message TEXT NOT NULL,
        meta TEXT NOT NULL DEFAULT '{}',
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        PRIMARY KEY (conversation_id, seq)
    );
    CREATE TABLE ledger (
        id BIGINT GENERATED ALWAYS AS IDENTITY,
        key TEXT PRIMARY KEY,
        tool TEXT NOT NULL,
        args_hash TEXT NOT NULL,
        workflow_id TEXT NOT NULL,
        state TEXT NOT NULL,
        owner TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        lease_until DOUBLE PRECISION NOT NULL,
        executions INTEGER NOT NULL DEFAULT 0,
        result TEXT NOT NULL DEFAULT '',
        is_error BOOLEAN NOT NULL DEFAULT FALSE,
        note TEXT NOT NULL DEFAULT '',
        updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
    );
    CREATE INDEX ledger_workflow ON ledger (workflow_id, id);
    """,
    """
    CREATE TABLE budget (
        root TEXT NOT NULL,
        key TEXT NOT NULL,
        settled BOOLEAN NOT NULL DEFAULT FALSE,
        tokens BIGINT NOT NULL DEFAULT 0,
        cost_usd DOUBLE PRECISION NOT NULL DEFAULT 0,
        at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (root, key)
    );
    """,
    # STORAGE EXTERNAL: the data is zlib-compressed already (or incompressible), so TOAST need not try again.
    """
    CREATE TABLE blobs (
        digest TEXT PRIMARY KEY,
        size BIGINT NOT NULL,
        encoding TEXT NOT NULL,
        data BYTEA NOT NULL,
        created_at DOUBLE PRECISION NOT NULL
    );
    ALTER TABLE blobs ALTER COLUMN data SET STORAGE EXTERNAL;
    """,
    # Garbage collection lists the blobs older than its grace period.
    """
    CREATE INDEX blobs_created ON blobs (created_at);
    """,
    # One row per sub-agent run a tree started (activities.store.base: tree_run_reserve).
    """
    CREATE TABLE tree_runs (
        root TEXT NOT NULL,
        key TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (root, key)
    );
    """,
    # What each run's checkpoints added to the store (AGENT_CHECKPOINT_RUN_MAX_*).
    """
    CREATE TABLE checkpoint_usage (
        run TEXT NOT NULL,
        checkpoint_id TEXT NOT NULL,
        bytes BIGINT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (run, checkpoint_id)
    );
    """,
    # One row per open top-level run or session of a tenant (AGENT_TENANT_MAX_OPEN_RUNS; tenant_run_reserve).
    """
    CREATE TABLE tenant_runs (
        tenant TEXT NOT NULL,
        workflow_id TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (tenant, workflow_id)
    );
    """,
    # Which runs use a blob (activities.erasure): forget and retention keep a blob another run still uses.
    """
    CREATE TABLE blob_refs (
        digest TEXT NOT NULL,
        run TEXT NOT NULL,
        tenant TEXT NOT NULL DEFAULT '',
        user_name TEXT NOT NULL DEFAULT '',
        at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (digest, run)
    );
    CREATE INDEX blob_refs_run ON blob_refs (run);
    """,
    # Long-term memory (activities.memory): entries, per-namespace usage, the keyed term index of sealed ones.
    """
    CREATE TABLE memory_entries (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        tenant TEXT NOT NULL,
        user_name TEXT NOT NULL,
        key TEXT NOT NULL,
        idem_key TEXT NOT NULL,
        text TEXT NOT NULL,
        size INTEGER NOT NULL,
        length INTEGER NOT NULL,
        sealed BOOLEAN NOT NULL DEFAULT FALSE,
        created_at DOUBLE PRECISION NOT NULL,
        expires_at DOUBLE PRECISION,
        tsv TSVECTOR,
        UNIQUE (tenant, user_name, key)
    );
    CREATE UNIQUE INDEX memory_entries_idem ON memory_entries (tenant, user_name, idem_key);
    CREATE INDEX memory_entries_expiry ON memory_entries (expires_at) WHERE expires_at IS NOT NULL;
    CREATE INDEX memory_entries_tsv ON memory_entries USING GIN (tsv);
    CREATE TABLE memory_namespaces (
        tenant TEXT NOT NULL,
        user_name TEXT NOT NULL,
        entries BIGINT NOT NULL DEFAULT 0,
        bytes BIGINT NOT NULL DEFAULT 0,
        terms BIGINT NOT NULL DEFAULT 0,
        PRIMARY KEY (tenant, user_name)
    );
    CREATE TABLE memory_terms (
        term BYTEA NOT NULL,
        entry BIGINT NOT NULL,
        tf INTEGER NOT NULL,
        PRIMARY KEY (term, entry)
    );
    CREATE INDEX memory_terms_entry ON memory_terms (entry);
    """,
    # Streamed model text (activities.streaming): deltas out of band of workflow history, and who listens.
    """
    CREATE TABLE stream_deltas (
        workflow_id TEXT NOT NULL,
        seq BIGINT NOT NULL,
        turn INTEGER NOT NULL,
        attempt INTEGER NOT NULL,
        restart BOOLEAN NOT NULL DEFAULT FALSE,
        text TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (workflow_id, seq)
    );
    CREATE INDEX stream_deltas_created ON stream_deltas (created_at);
    CREATE TABLE stream_listeners (
        workflow_id TEXT PRIMARY KEY,
        until DOUBLE PRECISION NOT NULL
    );
    """,
)

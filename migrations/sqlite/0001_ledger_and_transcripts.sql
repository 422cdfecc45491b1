-- Projects, sessions and transcripts: the durable sources learning reads.
CREATE TABLE project (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    worktree    TEXT,
    created_at  INTEGER NOT NULL
);

CREATE TABLE session (
    id           TEXT PRIMARY KEY,
    project_id   TEXT NOT NULL REFERENCES project (id) ON DELETE CASCADE,
    parent_id    TEXT REFERENCES session (id) ON DELETE SET NULL,
    title        TEXT,
    model        TEXT,
    external_ref TEXT,
    created_at   INTEGER NOT NULL
);
CREATE INDEX session_project ON session (project_id, created_at);
CREATE UNIQUE INDEX session_external_ref ON session (project_id, external_ref) WHERE external_ref IS NOT NULL;

CREATE TABLE message (
    id           TEXT PRIMARY KEY,
    session_id   TEXT NOT NULL REFERENCES session (id) ON DELETE CASCADE,
    seq          INTEGER NOT NULL,
    role         TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'system')),
    status       TEXT NOT NULL CHECK (status IN ('in_progress', 'completed', 'failed', 'truncated', 'pending_tools')),
    revision     INTEGER NOT NULL DEFAULT 1 CHECK (revision >= 1),
    created_at   INTEGER NOT NULL,
    completed_at INTEGER,
    UNIQUE (session_id, seq)
);

CREATE TABLE message_part (
    message_id       TEXT NOT NULL REFERENCES message (id) ON DELETE CASCADE,
    ordinal          INTEGER NOT NULL CHECK (ordinal >= 0),
    kind             TEXT NOT NULL CHECK (kind IN ('text', 'tool_call', 'artifact', 'error')),
    text             TEXT,
    tool_name        TEXT,
    tool_call_id     TEXT,
    tool_arguments   TEXT,
    tool_result      TEXT,
    tool_status      TEXT CHECK (tool_status IN ('pending', 'completed', 'error')),
    artifact_name    TEXT,
    artifact_uri     TEXT,
    external_context BOOLEAN NOT NULL DEFAULT FALSE,
    injected         BOOLEAN NOT NULL DEFAULT FALSE,
    content_digest   TEXT NOT NULL,
    PRIMARY KEY (message_id, ordinal),
    CHECK (kind <> 'tool_call' OR (tool_name IS NOT NULL AND tool_status IS NOT NULL)),
    CHECK (kind <> 'artifact' OR artifact_name IS NOT NULL)
);

-- The job ledger: one durable row per job identity, for every job kind.
CREATE TABLE learning_job (
    id                TEXT PRIMARY KEY,
    kind              TEXT NOT NULL CHECK (kind IN ('extract', 'maintain', 'aggregate_project', 'aggregate_global', 'evaluate')),
    identity_key      TEXT NOT NULL,
    project_id        TEXT,
    session_id        TEXT,
    source_message_id TEXT,
    extractor_version TEXT,
    input_digest      TEXT,
    bucket_start      INTEGER,
    claim_scope       TEXT,
    origin            TEXT NOT NULL CHECK (origin IN ('closed_turn', 'manual', 'legacy', 'periodic', 'explicit')),
    priority          INTEGER NOT NULL,
    state             TEXT NOT NULL CHECK (state IN ('queued', 'running', 'completed', 'failed', 'skipped', 'uncertain')),
    run_at            INTEGER NOT NULL,
    attempts          INTEGER NOT NULL DEFAULT 0,
    max_attempts      INTEGER NOT NULL DEFAULT 3,
    lease_token       TEXT,
    lease_owner       TEXT,
    lease_expires_at  INTEGER,
    heartbeat_at      INTEGER,
    payload           TEXT NOT NULL DEFAULT '{}',
    result            TEXT,
    last_error        TEXT,
    trace_parent      TEXT,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    finished_at       INTEGER,
    -- The attempt ceiling lives in the schema, not only in code.
    CHECK (max_attempts BETWEEN 1 AND 3),
    CHECK (attempts BETWEEN 0 AND max_attempts),
    CHECK ((state = 'running') = (lease_token IS NOT NULL)),
    CHECK (state <> 'running' OR lease_expires_at IS NOT NULL),
    UNIQUE (kind, identity_key)
);
CREATE INDEX learning_job_claim ON learning_job (kind, priority DESC, run_at, id) WHERE state = 'queued';
CREATE INDEX learning_job_lease ON learning_job (lease_expires_at) WHERE state = 'running';
CREATE INDEX learning_job_source ON learning_job (session_id, source_message_id);
CREATE INDEX learning_job_project ON learning_job (project_id, created_at);

-- Exceptional ledger events (fenced settlements, lease expiries, skips), kept for audit and tests.
CREATE TABLE learning_job_event (
    id         TEXT PRIMARY KEY,
    job_id     TEXT NOT NULL,
    event      TEXT NOT NULL CHECK (event IN ('fenced', 'lease_expired', 'skipped', 'released', 'revoked')),
    worker_id  TEXT,
    detail     TEXT,
    at         INTEGER NOT NULL
);
CREATE INDEX learning_job_event_job ON learning_job_event (job_id, at);

-- The closed-turn source bound at admission; rechecked at claim, heartbeat and settlement.
CREATE TABLE learning_source_snapshot (
    job_id            TEXT PRIMARY KEY REFERENCES learning_job (id) ON DELETE CASCADE,
    project_id        TEXT NOT NULL,
    session_id        TEXT NOT NULL,
    start_message_id  TEXT NOT NULL,
    end_message_id    TEXT NOT NULL,
    start_seq         INTEGER NOT NULL,
    end_seq           INTEGER NOT NULL,
    completed_at      INTEGER NOT NULL,
    terminal_digest   TEXT NOT NULL,
    manifest_digest   TEXT NOT NULL,
    CHECK (start_seq <= end_seq)
);

-- Bearer tokens scoped to the projects they name. Only digests are stored.
CREATE TABLE api_token (
    id           TEXT PRIMARY KEY,
    name         TEXT NOT NULL,
    token_sha256 TEXT NOT NULL UNIQUE,
    projects     TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    revoked_at   INTEGER
);

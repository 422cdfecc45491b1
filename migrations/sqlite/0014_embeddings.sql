-- no-transaction
-- The optional semantic recall layer: an `embed` job kind and the vectors it stores.
--
-- SQLite cannot alter a CHECK constraint, so the ledger table is rebuilt (the documented
-- twelve-step procedure). Foreign keys are off meanwhile, or dropping the old table would
-- cascade into every table that references a job (every row is copied, so none dangles).
PRAGMA foreign_keys = OFF;
BEGIN;
CREATE TABLE learning_job_rebuilt (
    id                TEXT PRIMARY KEY,
    kind              TEXT NOT NULL CHECK (kind IN ('extract', 'maintain', 'aggregate_project', 'aggregate_global', 'evaluate', 'embed')),
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
    releases          BIGINT NOT NULL DEFAULT 0 CHECK (releases BETWEEN 0 AND 1),
    -- The attempt ceiling lives in the schema, not only in code.
    CHECK (max_attempts BETWEEN 1 AND 3),
    CHECK (attempts BETWEEN 0 AND max_attempts),
    CHECK ((state = 'running') = (lease_token IS NOT NULL)),
    CHECK (state <> 'running' OR lease_expires_at IS NOT NULL),
    UNIQUE (kind, identity_key)
);
INSERT INTO learning_job_rebuilt SELECT * FROM learning_job;
DROP TABLE learning_job;
ALTER TABLE learning_job_rebuilt RENAME TO learning_job;
CREATE INDEX learning_job_claim ON learning_job (kind, priority DESC, run_at, id) WHERE state = 'queued';
CREATE INDEX learning_job_lease ON learning_job (lease_expires_at) WHERE state = 'running';
CREATE INDEX learning_job_source ON learning_job (session_id, source_message_id);
CREATE INDEX learning_job_project ON learning_job (project_id, created_at);

-- One vector per (experience, embedding model): little-endian f32s, `dims` of them, computed
-- from the experience text whose digest is kept (a changed text is re-embedded).
CREATE TABLE experience_embedding (
    experience_id  TEXT NOT NULL REFERENCES experience_record (id) ON DELETE CASCADE,
    model          TEXT NOT NULL,
    project_id     TEXT NOT NULL,
    dims           INTEGER NOT NULL CHECK (dims > 0),
    vector         BLOB NOT NULL CHECK (length(vector) = 4 * dims),
    content_digest TEXT NOT NULL,
    created_at     INTEGER NOT NULL,
    PRIMARY KEY (experience_id, model)
);
-- The bounded per-project scan reads a project's newest vectors of one model.
CREATE INDEX experience_embedding_scan ON experience_embedding (project_id, model, created_at);
COMMIT;
PRAGMA foreign_keys = ON;

-- Pruning (a session's or project's jobs deleted with it) is a ledger operation and leaves a
-- `pruned` audit event. SQLite cannot alter a CHECK constraint, so the event table (which nothing
-- references) is rebuilt.
CREATE TABLE learning_job_event_rebuilt (
    id         TEXT PRIMARY KEY,
    job_id     TEXT NOT NULL,
    event      TEXT NOT NULL CHECK (event IN ('fenced', 'lease_expired', 'skipped', 'released', 'revoked', 'pruned')),
    worker_id  TEXT,
    detail     TEXT,
    at         INTEGER NOT NULL
);
INSERT INTO learning_job_event_rebuilt (id, job_id, event, worker_id, detail, at)
    SELECT id, job_id, event, worker_id, detail, at FROM learning_job_event;
DROP TABLE learning_job_event;
ALTER TABLE learning_job_event_rebuilt RENAME TO learning_job_event;
CREATE INDEX learning_job_event_job ON learning_job_event (job_id, at);

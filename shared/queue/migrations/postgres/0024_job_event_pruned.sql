-- Pruning (a session's or project's jobs deleted with it) is a ledger operation and leaves a
-- `pruned` audit event.
ALTER TABLE learning_job_event DROP CONSTRAINT learning_job_event_event_check;
ALTER TABLE learning_job_event ADD CONSTRAINT learning_job_event_event_check
    CHECK (event IN ('fenced', 'lease_expired', 'skipped', 'released', 'revoked', 'pruned'));

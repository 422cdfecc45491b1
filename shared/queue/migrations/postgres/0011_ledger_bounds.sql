-- Graceful releases (SIGTERM past the grace period) give the attempt back at most once per job;
-- later releases spend it, so the attempt ceiling bounds how often a job runs, not only the
-- counter.
ALTER TABLE learning_job ADD COLUMN releases BIGINT NOT NULL DEFAULT 0 CHECK (releases BETWEEN 0 AND 1);

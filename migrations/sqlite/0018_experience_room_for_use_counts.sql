-- Postgres leaves room on `experience_record` pages so use-count bumps stay HOT updates (see
-- migrations/postgres/0018). SQLite updates a row in place in its B-tree and its FTS5 tables
-- are kept by triggers on the text columns only, so it has nothing to change; this file keeps
-- the two histories at the same version.
SELECT 1;

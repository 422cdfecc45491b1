-- Recall: a project-scoped full-text index (issue #4, docs/benchmarks.md).
--
-- Recall always searches one project. With only the global `experience_search` GIN index and
-- the `experience_recall` b-tree, Postgres intersects the posting lists of the whole table with
-- the project's rows (a bitmap of every matching record of every project). A GIN index over
-- (project_id, search_vector) answers `project_id = $1 AND search_vector @@ q` inside the index
-- and reads only the project's matches. `btree_gin` supplies the GIN operator class for the
-- text column; like `pg_trgm` (migration 0003) it is a trusted contrib extension.
--
-- SQLite's counterpart (its 0005) gives the trigram table a scope token that is one trigram
-- long, for the same purpose: the project's matches only.
CREATE EXTENSION IF NOT EXISTS btree_gin;
CREATE INDEX experience_project_search ON experience_record USING GIN (project_id, search_vector);

-- Automatic recall bumps `use_count` and `last_used_at` of every experience a prompt selects.
-- Neither column is indexed, so Postgres can make that update HOT (no new entries in the GIN
-- full-text and trigram indexes) when the row's page has room for the new version. At the
-- default fillfactor of 100 a bulk-loaded or long-lived table's pages are full: every bump then
-- inserts into the GIN pending lists, and the statement that fills a list flushes it (70–140 ms
-- `UPDATE`s inside `context` at 100k experiences, docs/benchmarks.md). 80 leaves room on pages
-- written from now on; existing pages gain it as rows move, or at once with
-- `VACUUM FULL experience_record` in a maintenance window.
ALTER TABLE experience_record SET (fillfactor = 80);

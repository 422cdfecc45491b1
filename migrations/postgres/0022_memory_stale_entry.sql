-- Entries maintenance withheld as stale: every file they name left the worktree, or (when
-- `memory.stale_after_unused_days` is set) nothing supported them for that long. Marking is a
-- journaled `remove` candidate (`candidate_id`), so the revision history keeps the text; this row
-- says why and whether a person restored it (`restored_candidate_id`: the `add` that brought it
-- back as the user's own entry, which is never marked stale again).
CREATE TABLE memory_stale_entry (
    candidate_id          TEXT PRIMARY KEY REFERENCES memory_candidate (id) ON DELETE CASCADE,
    document_id           TEXT NOT NULL REFERENCES memory_document (id) ON DELETE CASCADE,
    content               TEXT NOT NULL,
    reason                TEXT NOT NULL CHECK (reason IN ('missing_files', 'unused')),
    missing_paths         TEXT NOT NULL DEFAULT '[]',
    marked_at             BIGINT NOT NULL,
    restored_candidate_id TEXT
);
CREATE INDEX memory_stale_entry_document ON memory_stale_entry (document_id, marked_at);

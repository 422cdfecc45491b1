-- Recall: a derived lexical index that `context` ranks from without scoring every full-text
-- match (docs/adr/0005-recall-ranking-and-feedback.md, docs/benchmarks.md).
--
-- For each project and search key (a stemmed word, a whole identifier, a CJK bigram) one row
-- holds the key's whole posting list: (document number, impact) pairs, encoded by
-- `learning::recall::index`. A prompt reads one row per key, so ranking costs what its keys'
-- lists weigh, not a scan of every match. The index is derived: `experience_record` is the
-- source of truth, the triggers below mark every change of an experience's searchable text as
-- pending in the same transaction, and whoever indexes (any process) takes pending rows in its
-- own transaction. A reader never trusts a stale list: it scores a project's pending records
-- from their text, and falls back to the full-text indexes when too many are pending.
CREATE TABLE recall_doc (
    num           INTEGER PRIMARY KEY,
    experience_id TEXT NOT NULL UNIQUE,
    -- The project whose lists hold the document (NULL until indexed).
    project_id    TEXT,
    -- The keys the document was indexed under, newline-separated (NULL until indexed), so
    -- re-indexing knows which lists to take it out of.
    indexed_keys  TEXT
);
CREATE INDEX recall_doc_project ON recall_doc (project_id);

CREATE TABLE recall_project (
    project_id TEXT PRIMARY KEY REFERENCES project (id) ON DELETE CASCADE,
    -- Documents indexed in the project (the N of the inverse document frequency).
    docs       INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE recall_list (
    project_id TEXT NOT NULL REFERENCES project (id) ON DELETE CASCADE,
    key        TEXT NOT NULL,
    postings   BLOB NOT NULL,
    PRIMARY KEY (project_id, key)
);

CREATE TABLE recall_pending (
    experience_id TEXT PRIMARY KEY
);

CREATE TRIGGER recall_pending_insert AFTER INSERT ON experience_record BEGIN
    INSERT OR IGNORE INTO recall_doc (experience_id) VALUES (new.id);
    INSERT OR IGNORE INTO recall_pending (experience_id) VALUES (new.id);
END;

CREATE TRIGGER recall_pending_update AFTER UPDATE OF title, summary, resolution, keywords, project_id ON experience_record BEGIN
    INSERT OR IGNORE INTO recall_pending (experience_id) VALUES (new.id);
END;

CREATE TRIGGER recall_pending_delete AFTER DELETE ON experience_record BEGIN
    INSERT OR IGNORE INTO recall_pending (experience_id) VALUES (old.id);
END;

-- Everything stored before this migration is pending until first indexed.
INSERT INTO recall_doc (experience_id) SELECT id FROM experience_record ORDER BY created_at, id;
INSERT INTO recall_pending (experience_id) SELECT id FROM experience_record;

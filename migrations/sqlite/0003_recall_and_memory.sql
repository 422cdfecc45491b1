-- Recall: derived-source state and the feedback loop (spec 003 reinforce/violate).
ALTER TABLE experience_record ADD COLUMN source_state TEXT NOT NULL DEFAULT 'current' CHECK (source_state IN ('current', 'changed'));
ALTER TABLE experience_record ADD COLUMN reinforcements INTEGER NOT NULL DEFAULT 0;
ALTER TABLE experience_record ADD COLUMN violations INTEGER NOT NULL DEFAULT 0;
ALTER TABLE experience_record ADD COLUMN feedback_score REAL NOT NULL DEFAULT 0;

-- Full-text search, created once here and maintained by triggers; reads never rebuild it.
-- FTS rows are keyed by a stable integer (a table's implicit rowid may change on VACUUM).
-- `scope` holds one token per project so a MATCH can be confined to one project's posting list.
CREATE TABLE experience_search_key (
    num            INTEGER PRIMARY KEY,
    experience_id  TEXT NOT NULL UNIQUE
);
CREATE VIRTUAL TABLE experience_fts USING fts5(scope, title, summary, resolution, tokenize = 'unicode61 remove_diacritics 2');
CREATE VIRTUAL TABLE experience_trigram USING fts5(scope, title, summary, resolution, tokenize = 'trigram');

CREATE TRIGGER experience_search_insert AFTER INSERT ON experience_record BEGIN
    INSERT INTO experience_search_key (experience_id) VALUES (new.id);
    INSERT INTO experience_fts (rowid, scope, title, summary, resolution)
        VALUES ((SELECT num FROM experience_search_key WHERE experience_id = new.id),
                'p' || lower(hex(new.project_id)), new.title, new.summary, COALESCE(new.resolution, ''));
    INSERT INTO experience_trigram (rowid, scope, title, summary, resolution)
        VALUES ((SELECT num FROM experience_search_key WHERE experience_id = new.id),
                'p' || lower(hex(new.project_id)), new.title, new.summary, COALESCE(new.resolution, ''));
END;

CREATE TRIGGER experience_search_update AFTER UPDATE OF title, summary, resolution, project_id ON experience_record BEGIN
    UPDATE experience_fts SET scope = 'p' || lower(hex(new.project_id)), title = new.title, summary = new.summary,
        resolution = COALESCE(new.resolution, '')
        WHERE rowid = (SELECT num FROM experience_search_key WHERE experience_id = new.id);
    UPDATE experience_trigram SET scope = 'p' || lower(hex(new.project_id)), title = new.title, summary = new.summary,
        resolution = COALESCE(new.resolution, '')
        WHERE rowid = (SELECT num FROM experience_search_key WHERE experience_id = new.id);
END;

CREATE TRIGGER experience_search_delete AFTER DELETE ON experience_record BEGIN
    DELETE FROM experience_fts WHERE rowid = (SELECT num FROM experience_search_key WHERE experience_id = old.id);
    DELETE FROM experience_trigram WHERE rowid = (SELECT num FROM experience_search_key WHERE experience_id = old.id);
    DELETE FROM experience_search_key WHERE experience_id = old.id;
END;

-- Index what earlier migrations stored.
INSERT INTO experience_search_key (experience_id) SELECT id FROM experience_record ORDER BY created_at, id;
INSERT INTO experience_fts (rowid, scope, title, summary, resolution)
    SELECT k.num, 'p' || lower(hex(e.project_id)), e.title, e.summary, COALESCE(e.resolution, '')
    FROM experience_record e JOIN experience_search_key k ON k.experience_id = e.id;
INSERT INTO experience_trigram (rowid, scope, title, summary, resolution)
    SELECT k.num, 'p' || lower(hex(e.project_id)), e.title, e.summary, COALESCE(e.resolution, '')
    FROM experience_record e JOIN experience_search_key k ON k.experience_id = e.id;

-- Editing or deleting a source message invalidates derived recall immediately.
CREATE TRIGGER experience_source_part_deleted AFTER DELETE ON message_part BEGIN
    UPDATE experience_record SET source_state = 'changed'
    WHERE source_state = 'current' AND id IN (SELECT experience_id FROM experience_evidence WHERE message_id = old.message_id);
END;
CREATE TRIGGER experience_source_part_updated AFTER UPDATE ON message_part BEGIN
    UPDATE experience_record SET source_state = 'changed'
    WHERE source_state = 'current' AND id IN (SELECT experience_id FROM experience_evidence WHERE message_id = old.message_id);
END;

-- Resident Memory: authoritative documents, entries and revisions.
CREATE TABLE memory_document (
    id          TEXT PRIMARY KEY,
    scope       TEXT NOT NULL CHECK (scope IN ('global', 'project')),
    project_id  TEXT REFERENCES project (id) ON DELETE CASCADE,
    revision    INTEGER NOT NULL DEFAULT 0 CHECK (revision >= 0),
    updated_at  INTEGER NOT NULL,
    CHECK ((scope = 'global') = (project_id IS NULL))
);
CREATE UNIQUE INDEX memory_document_global ON memory_document (scope) WHERE scope = 'global';
CREATE UNIQUE INDEX memory_document_project ON memory_document (project_id) WHERE project_id IS NOT NULL;

CREATE TABLE memory_entry (
    id                  TEXT PRIMARY KEY,
    document_id         TEXT NOT NULL REFERENCES memory_document (id) ON DELETE CASCADE,
    content             TEXT NOT NULL,
    owner               TEXT NOT NULL CHECK (owner IN ('user', 'automatic', 'imported')),
    -- Derived from evidence by learning: withheld from prompts once all its sources are gone.
    derived             BOOLEAN NOT NULL DEFAULT FALSE,
    position            INTEGER NOT NULL,
    created_revision    INTEGER NOT NULL,
    retracted_revision  INTEGER,
    created_at          INTEGER NOT NULL
);
CREATE INDEX memory_entry_current ON memory_entry (document_id, position) WHERE retracted_revision IS NULL;

CREATE TABLE memory_revision (
    document_id   TEXT NOT NULL REFERENCES memory_document (id) ON DELETE CASCADE,
    revision      INTEGER NOT NULL,
    entries       TEXT NOT NULL,
    change        TEXT NOT NULL CHECK (change IN ('apply', 'undo', 'import', 'adopt', 'retract')),
    candidate_id  TEXT,
    at            INTEGER NOT NULL,
    PRIMARY KEY (document_id, revision)
);

CREATE TABLE memory_candidate (
    id               TEXT PRIMARY KEY,
    document_id      TEXT NOT NULL REFERENCES memory_document (id) ON DELETE CASCADE,
    project_id       TEXT,
    target           TEXT NOT NULL CHECK (target IN ('global', 'project')),
    action           TEXT NOT NULL CHECK (action IN ('add', 'replace', 'remove')),
    content          TEXT,
    old_text         TEXT,
    reason           TEXT NOT NULL,
    confidence       REAL NOT NULL CHECK (confidence >= 0 AND confidence <= 1),
    origin           TEXT NOT NULL CHECK (origin IN ('tool', 'maintenance', 'user')),
    state            TEXT NOT NULL CHECK (state IN ('pending', 'applying', 'applied', 'rejected', 'undoing', 'undone', 'uncertain', 'stale')),
    base_revision    INTEGER NOT NULL,
    before_entries   TEXT,
    after_entries    TEXT,
    applied_revision INTEGER,
    undone_revision  INTEGER,
    detail           TEXT,
    job_id           TEXT,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
);
CREATE INDEX memory_candidate_document ON memory_candidate (document_id, state, created_at);

-- What supports each entry and each candidate. The composite key pins the experience's kind:
-- an unresolved issue can never support Memory.
CREATE TABLE memory_provenance (
    entry_id         TEXT NOT NULL REFERENCES memory_entry (id) ON DELETE CASCADE,
    experience_id    TEXT NOT NULL,
    experience_kind  TEXT NOT NULL CHECK (experience_kind <> 'unresolved_issue'),
    PRIMARY KEY (entry_id, experience_id),
    FOREIGN KEY (experience_id, experience_kind) REFERENCES experience_record (id, kind) ON UPDATE CASCADE ON DELETE CASCADE
);
CREATE INDEX memory_provenance_experience ON memory_provenance (experience_id);

CREATE TABLE memory_candidate_evidence (
    candidate_id     TEXT NOT NULL REFERENCES memory_candidate (id) ON DELETE CASCADE,
    experience_id    TEXT NOT NULL,
    experience_kind  TEXT NOT NULL CHECK (experience_kind <> 'unresolved_issue'),
    PRIMARY KEY (candidate_id, experience_id),
    FOREIGN KEY (experience_id, experience_kind) REFERENCES experience_record (id, kind) ON UPDATE CASCADE ON DELETE CASCADE
);
CREATE INDEX memory_candidate_evidence_experience ON memory_candidate_evidence (experience_id);

-- Texts explicitly forgotten, undone or retracted: never resurrected automatically.
CREATE TABLE memory_forgotten_text (
    document_id     TEXT NOT NULL REFERENCES memory_document (id) ON DELETE CASCADE,
    content_digest  TEXT NOT NULL,
    reason          TEXT NOT NULL,
    at              INTEGER NOT NULL,
    PRIMARY KEY (document_id, content_digest)
);

-- The Markdown projection of each document and what Zuno last wrote there.
CREATE TABLE memory_projection (
    document_id       TEXT PRIMARY KEY REFERENCES memory_document (id) ON DELETE CASCADE,
    path              TEXT NOT NULL,
    written_digest    TEXT,
    written_revision  INTEGER,
    state             TEXT NOT NULL CHECK (state IN ('synced', 'external_edit', 'error')),
    detail            TEXT,
    updated_at        INTEGER NOT NULL
);

-- Maintenance watermark: experiences already consumed by a successful maintenance plan.
CREATE TABLE memory_maintenance (
    project_id     TEXT PRIMARY KEY REFERENCES project (id) ON DELETE CASCADE,
    watermark_at   INTEGER NOT NULL,
    watermark_id   TEXT NOT NULL,
    updated_at     INTEGER NOT NULL
);

-- The exact prompt sections a request used, persisted before the request goes out.
CREATE TABLE prompt_receipt (
    id                TEXT PRIMARY KEY,
    session_id        TEXT REFERENCES session (id) ON DELETE SET NULL,
    project_id        TEXT NOT NULL,
    sections          TEXT NOT NULL,
    memory_revisions  TEXT NOT NULL,
    experience_ids    TEXT NOT NULL,
    retrieval         TEXT NOT NULL,
    created_at        INTEGER NOT NULL
);
CREATE INDEX prompt_receipt_session ON prompt_receipt (session_id, created_at);

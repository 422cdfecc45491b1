-- Recall: derived-source state and the feedback loop (spec 003 reinforce/violate).
ALTER TABLE experience_record ADD COLUMN source_state TEXT NOT NULL DEFAULT 'current' CHECK (source_state IN ('current', 'changed'));
ALTER TABLE experience_record ADD COLUMN reinforcements BIGINT NOT NULL DEFAULT 0;
ALTER TABLE experience_record ADD COLUMN violations BIGINT NOT NULL DEFAULT 0;
ALTER TABLE experience_record ADD COLUMN feedback_score DOUBLE PRECISION NOT NULL DEFAULT 0;

-- Full-text search, created once here and maintained by Postgres (a stored generated
-- tsvector and a trigram index); reads never rebuild them. 'simple' keeps every language's
-- words unstemmed; CJK text is found through the trigram index.
ALTER TABLE experience_record ADD COLUMN search_vector tsvector GENERATED ALWAYS AS (
    setweight(to_tsvector('simple', coalesce(title, '')), 'A')
    || setweight(to_tsvector('simple', coalesce(summary, '')), 'B')
    || setweight(to_tsvector('simple', coalesce(resolution, '')), 'C')) STORED;
CREATE INDEX experience_search ON experience_record USING GIN (search_vector);
CREATE EXTENSION IF NOT EXISTS pg_trgm;
CREATE INDEX experience_trigram ON experience_record
    USING GIN ((coalesce(title, '') || ' ' || coalesce(summary, '') || ' ' || coalesce(resolution, '')) gin_trgm_ops);
CREATE INDEX experience_recall ON experience_record (project_id, status, source_state);

-- Editing or deleting a source message invalidates derived recall immediately.
CREATE FUNCTION zuno_invalidate_experience_sources() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE experience_record SET source_state = 'changed'
    WHERE source_state = 'current' AND id IN (SELECT experience_id FROM experience_evidence WHERE message_id = OLD.message_id);
    RETURN NULL;
END
$$;
CREATE TRIGGER experience_source_part_changed AFTER UPDATE OR DELETE ON message_part
    FOR EACH ROW EXECUTE FUNCTION zuno_invalidate_experience_sources();

-- Resident Memory: authoritative documents, entries and revisions.
CREATE TABLE memory_document (
    id          TEXT PRIMARY KEY,
    scope       TEXT NOT NULL CHECK (scope IN ('global', 'project')),
    project_id  TEXT REFERENCES project (id) ON DELETE CASCADE,
    revision    BIGINT NOT NULL DEFAULT 0 CHECK (revision >= 0),
    updated_at  BIGINT NOT NULL,
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
    position            BIGINT NOT NULL,
    created_revision    BIGINT NOT NULL,
    retracted_revision  BIGINT,
    created_at          BIGINT NOT NULL
);
CREATE INDEX memory_entry_current ON memory_entry (document_id, position) WHERE retracted_revision IS NULL;

CREATE TABLE memory_revision (
    document_id   TEXT NOT NULL REFERENCES memory_document (id) ON DELETE CASCADE,
    revision      BIGINT NOT NULL,
    entries       TEXT NOT NULL,
    change        TEXT NOT NULL CHECK (change IN ('apply', 'undo', 'import', 'adopt', 'retract')),
    candidate_id  TEXT,
    at            BIGINT NOT NULL,
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
    confidence       DOUBLE PRECISION NOT NULL CHECK (confidence >= 0 AND confidence <= 1),
    origin           TEXT NOT NULL CHECK (origin IN ('tool', 'maintenance', 'user')),
    state            TEXT NOT NULL CHECK (state IN ('pending', 'applying', 'applied', 'rejected', 'undoing', 'undone', 'uncertain', 'stale')),
    base_revision    BIGINT NOT NULL,
    before_entries   TEXT,
    after_entries    TEXT,
    applied_revision BIGINT,
    undone_revision  BIGINT,
    detail           TEXT,
    job_id           TEXT,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL
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
    at              BIGINT NOT NULL,
    PRIMARY KEY (document_id, content_digest)
);

-- The Markdown projection of each document and what Zuno last wrote there.
CREATE TABLE memory_projection (
    document_id       TEXT PRIMARY KEY REFERENCES memory_document (id) ON DELETE CASCADE,
    path              TEXT NOT NULL,
    written_digest    TEXT,
    written_revision  BIGINT,
    state             TEXT NOT NULL CHECK (state IN ('synced', 'external_edit', 'error')),
    detail            TEXT,
    updated_at        BIGINT NOT NULL
);

-- Maintenance watermark: experiences already consumed by a successful maintenance plan.
CREATE TABLE memory_maintenance (
    project_id     TEXT PRIMARY KEY REFERENCES project (id) ON DELETE CASCADE,
    watermark_at   BIGINT NOT NULL,
    watermark_id   TEXT NOT NULL,
    updated_at     BIGINT NOT NULL
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
    created_at        BIGINT NOT NULL
);
CREATE INDEX prompt_receipt_session ON prompt_receipt (session_id, created_at);

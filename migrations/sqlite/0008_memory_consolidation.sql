-- Consolidation at the cap: a write that would cross its document's character cap merges
-- entries stating the same rule and drops the lowest-value derived entries in its own
-- transaction. The revision and the candidate record what was merged and dropped, as JSON
-- ({limit, charsBefore, charsAfter, merged: [{entryId, content, evidence, intoEntryId, into}],
-- dropped: [{entryId, content, reason, evidence}]}); NULL when nothing was consolidated.
ALTER TABLE memory_revision ADD COLUMN consolidation TEXT;
ALTER TABLE memory_candidate ADD COLUMN consolidation TEXT;

-- Text dropped (or merged away) to keep a document under its cap. Unlike forgotten text it may
-- come back, but only with evidence that did not support it when it went: the same unchanged
-- input never resurrects it.
CREATE TABLE memory_dropped_text (
    document_id     TEXT NOT NULL REFERENCES memory_document (id) ON DELETE CASCADE,
    content_digest  TEXT NOT NULL,
    -- JSON array of every experience id that supported the text when it was dropped.
    evidence        TEXT NOT NULL,
    revision        INTEGER NOT NULL,
    at              INTEGER NOT NULL,
    PRIMARY KEY (document_id, content_digest)
);

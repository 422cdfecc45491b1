-- The optional semantic recall layer: an `embed` job kind and the vectors it stores.
ALTER TABLE learning_job DROP CONSTRAINT learning_job_kind_check;
ALTER TABLE learning_job ADD CONSTRAINT learning_job_kind_check
    CHECK (kind IN ('extract', 'maintain', 'aggregate_project', 'aggregate_global', 'evaluate', 'embed'));

-- One vector per (experience, embedding model): little-endian f32s, `dims` of them, computed
-- from the experience text whose digest is kept (a changed text is re-embedded).
CREATE TABLE experience_embedding (
    experience_id  TEXT NOT NULL REFERENCES experience_record (id) ON DELETE CASCADE,
    model          TEXT NOT NULL,
    project_id     TEXT NOT NULL,
    dims           BIGINT NOT NULL CHECK (dims > 0),
    vector         BYTEA NOT NULL CHECK (length(vector) = 4 * dims),
    content_digest TEXT NOT NULL,
    created_at     BIGINT NOT NULL,
    PRIMARY KEY (experience_id, model)
);
-- The bounded per-project scan reads a project's newest vectors of one model.
CREATE INDEX experience_embedding_scan ON experience_embedding (project_id, model, created_at);

-- A closed-turn snapshot may bind the turn before it as read-only context (what a correction
-- such as "undo that" refers to): the first message of that context, NULL for snapshots
-- without one. The context is revalidated with the snapshot; its records are flagged.
ALTER TABLE learning_source_snapshot ADD COLUMN context_start_seq BIGINT;
ALTER TABLE learning_source_record ADD COLUMN context BOOLEAN NOT NULL DEFAULT FALSE;

-- Retrieval keywords of an experience (the situation it applies to: tools, commands, files,
-- the request it answered), searched like its text but never rendered into prompts. The
-- generated search vector and the trigram index are rebuilt with the new column.
ALTER TABLE experience_record ADD COLUMN keywords TEXT NOT NULL DEFAULT '';

DROP INDEX experience_project_search;
DROP INDEX experience_search;
ALTER TABLE experience_record DROP COLUMN search_vector;
ALTER TABLE experience_record ADD COLUMN search_vector tsvector GENERATED ALWAYS AS (
    setweight(to_tsvector('simple', coalesce(title, '')), 'A')
    || setweight(to_tsvector('simple', coalesce(summary, '')), 'B')
    || setweight(to_tsvector('simple', coalesce(resolution, '')), 'C')
    || setweight(to_tsvector('simple', keywords), 'D')) STORED;
CREATE INDEX experience_search ON experience_record USING GIN (search_vector);
CREATE INDEX experience_project_search ON experience_record USING GIN (project_id, search_vector);

DROP INDEX experience_trigram;
CREATE INDEX experience_trigram ON experience_record
    USING GIN ((coalesce(title, '') || ' ' || coalesce(summary, '') || ' ' || coalesce(resolution, '') || ' ' || keywords) gin_trgm_ops);

-- A closed-turn snapshot may bind the turn before it as read-only context (what a correction
-- such as "undo that" refers to): the first message of that context, NULL for snapshots
-- without one. The context is revalidated with the snapshot; its records are flagged.
ALTER TABLE learning_source_snapshot ADD COLUMN context_start_seq INTEGER;
ALTER TABLE learning_source_record ADD COLUMN context BOOLEAN NOT NULL DEFAULT FALSE;

-- Retrieval keywords of an experience (the situation it applies to: tools, commands, files,
-- the request it answered), searched like its text but never rendered into prompts. Both
-- full-text tables are rebuilt with the new column, and their triggers with them.
ALTER TABLE experience_record ADD COLUMN keywords TEXT NOT NULL DEFAULT '';

DROP TRIGGER experience_search_insert;
DROP TRIGGER experience_search_update;
DROP TRIGGER experience_search_delete;
DROP TABLE experience_fts;
DROP TABLE experience_trigram;
CREATE VIRTUAL TABLE experience_fts USING fts5(scope, title, summary, resolution, keywords, tokenize = 'unicode61 remove_diacritics 2');
CREATE VIRTUAL TABLE experience_trigram USING fts5(scope, title, summary, resolution, keywords, tokenize = 'trigram');
INSERT INTO experience_fts (rowid, scope, title, summary, resolution, keywords)
    SELECT k.num, 'p' || lower(hex(e.project_id)), e.title, e.summary, COALESCE(e.resolution, ''), e.keywords
    FROM experience_record e JOIN experience_search_key k ON k.experience_id = e.id;
INSERT INTO experience_trigram (rowid, scope, title, summary, resolution, keywords)
    SELECT k.num, s.code, e.title, e.summary, COALESCE(e.resolution, ''), e.keywords
    FROM experience_record e
    JOIN experience_search_key k ON k.experience_id = e.id
    JOIN experience_search_scope_code s ON s.project_id = e.project_id;

CREATE TRIGGER experience_search_insert AFTER INSERT ON experience_record BEGIN
    INSERT OR IGNORE INTO experience_search_scope (project_id) VALUES (new.project_id);
    INSERT INTO experience_search_key (experience_id) VALUES (new.id);
    INSERT INTO experience_fts (rowid, scope, title, summary, resolution, keywords)
        VALUES ((SELECT num FROM experience_search_key WHERE experience_id = new.id),
                'p' || lower(hex(new.project_id)), new.title, new.summary, COALESCE(new.resolution, ''), new.keywords);
    INSERT INTO experience_trigram (rowid, scope, title, summary, resolution, keywords)
        VALUES ((SELECT num FROM experience_search_key WHERE experience_id = new.id),
                (SELECT code FROM experience_search_scope_code WHERE project_id = new.project_id),
                new.title, new.summary, COALESCE(new.resolution, ''), new.keywords);
END;

CREATE TRIGGER experience_search_update AFTER UPDATE OF title, summary, resolution, keywords, project_id ON experience_record BEGIN
    INSERT OR IGNORE INTO experience_search_scope (project_id) VALUES (new.project_id);
    UPDATE experience_fts SET scope = 'p' || lower(hex(new.project_id)), title = new.title, summary = new.summary,
        resolution = COALESCE(new.resolution, ''), keywords = new.keywords
        WHERE rowid = (SELECT num FROM experience_search_key WHERE experience_id = new.id);
    UPDATE experience_trigram SET scope = (SELECT code FROM experience_search_scope_code WHERE project_id = new.project_id),
        title = new.title, summary = new.summary, resolution = COALESCE(new.resolution, ''), keywords = new.keywords
        WHERE rowid = (SELECT num FROM experience_search_key WHERE experience_id = new.id);
END;

CREATE TRIGGER experience_search_delete AFTER DELETE ON experience_record BEGIN
    DELETE FROM experience_fts WHERE rowid = (SELECT num FROM experience_search_key WHERE experience_id = old.id);
    DELETE FROM experience_trigram WHERE rowid = (SELECT num FROM experience_search_key WHERE experience_id = old.id);
    DELETE FROM experience_search_key WHERE experience_id = old.id;
END;

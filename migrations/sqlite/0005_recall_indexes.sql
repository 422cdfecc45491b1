-- Recall: a project scope the trigram index can look up (issue #4, docs/benchmarks.md).
--
-- Both full-text tables confine a match to one project with a scope column. In the unicode61
-- table the scope `p<hex of the project id>` is one token, whose posting list is the project's
-- rows. The trigram tokenizer instead splits it into ~70 overlapping trigrams that every
-- project's scope shares, so `scope:"p…"` was a 70-trigram phrase over posting lists covering the
-- whole table: a project-scoped CJK query took hundreds of milliseconds at 100,000 records.
--
-- Each project that has experiences gets a number (`slot`), and the trigram table's scope becomes
-- three private-use characters spelling it in base 4096 (U+E000 + each digit): exactly one
-- trigram, whose posting list is the project's rows. Query terms never reach it (they are
-- confined to the text columns, and `query::parse` cannot produce a term made of private-use
-- characters only); text that happens to contain the same characters is kept out by the
-- `scope:` column filter. The unicode61 table is unchanged.
CREATE TABLE experience_search_scope (
    slot        INTEGER PRIMARY KEY,
    project_id  TEXT NOT NULL UNIQUE REFERENCES project (id) ON DELETE CASCADE
);

-- The scope text of each project: the only place the spelling is defined (the triggers below and
-- the trigram query read it from here).
CREATE VIEW experience_search_scope_code AS
    SELECT project_id, char(57344 + (slot & 4095), 57344 + ((slot >> 12) & 4095), 57344 + ((slot >> 24) & 4095)) AS code
    FROM experience_search_scope;

INSERT INTO experience_search_scope (project_id)
    SELECT DISTINCT project_id FROM experience_record ORDER BY project_id;

-- Rebuild the trigram table with the new scope, and the triggers that maintain both tables.
DROP TRIGGER experience_search_insert;
DROP TRIGGER experience_search_update;
DROP TRIGGER experience_search_delete;
DROP TABLE experience_trigram;
CREATE VIRTUAL TABLE experience_trigram USING fts5(scope, title, summary, resolution, tokenize = 'trigram');
INSERT INTO experience_trigram (rowid, scope, title, summary, resolution)
    SELECT k.num, s.code, e.title, e.summary, COALESCE(e.resolution, '')
    FROM experience_record e
    JOIN experience_search_key k ON k.experience_id = e.id
    JOIN experience_search_scope_code s ON s.project_id = e.project_id;

CREATE TRIGGER experience_search_insert AFTER INSERT ON experience_record BEGIN
    INSERT OR IGNORE INTO experience_search_scope (project_id) VALUES (new.project_id);
    INSERT INTO experience_search_key (experience_id) VALUES (new.id);
    INSERT INTO experience_fts (rowid, scope, title, summary, resolution)
        VALUES ((SELECT num FROM experience_search_key WHERE experience_id = new.id),
                'p' || lower(hex(new.project_id)), new.title, new.summary, COALESCE(new.resolution, ''));
    INSERT INTO experience_trigram (rowid, scope, title, summary, resolution)
        VALUES ((SELECT num FROM experience_search_key WHERE experience_id = new.id),
                (SELECT code FROM experience_search_scope_code WHERE project_id = new.project_id),
                new.title, new.summary, COALESCE(new.resolution, ''));
END;

CREATE TRIGGER experience_search_update AFTER UPDATE OF title, summary, resolution, project_id ON experience_record BEGIN
    INSERT OR IGNORE INTO experience_search_scope (project_id) VALUES (new.project_id);
    UPDATE experience_fts SET scope = 'p' || lower(hex(new.project_id)), title = new.title, summary = new.summary,
        resolution = COALESCE(new.resolution, '')
        WHERE rowid = (SELECT num FROM experience_search_key WHERE experience_id = new.id);
    UPDATE experience_trigram SET scope = (SELECT code FROM experience_search_scope_code WHERE project_id = new.project_id),
        title = new.title, summary = new.summary, resolution = COALESCE(new.resolution, '')
        WHERE rowid = (SELECT num FROM experience_search_key WHERE experience_id = new.id);
END;

CREATE TRIGGER experience_search_delete AFTER DELETE ON experience_record BEGIN
    DELETE FROM experience_fts WHERE rowid = (SELECT num FROM experience_search_key WHERE experience_id = old.id);
    DELETE FROM experience_trigram WHERE rowid = (SELECT num FROM experience_search_key WHERE experience_id = old.id);
    DELETE FROM experience_search_key WHERE experience_id = old.id;
END;

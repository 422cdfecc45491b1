-- Mining reads project experiences in the order the database committed them, not by a host's
-- clock: `seq` is assigned inside the inserting transaction from a per-project counter row. The
-- counter row stays locked until that transaction ends, so a later `seq` of the same project is
-- never visible before an earlier one: a reader that saw `seq = n` can never later find a new
-- row below `n`, and a watermark on `seq` loses nothing.
CREATE TABLE experience_sequence (
    project_id  TEXT PRIMARY KEY REFERENCES project (id) ON DELETE CASCADE,
    last_seq    INTEGER NOT NULL CHECK (last_seq >= 0)
);

ALTER TABLE experience_record ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;
UPDATE experience_record SET seq = ranked.n
FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY project_id ORDER BY created_at, id) AS n FROM experience_record) AS ranked
WHERE ranked.id = experience_record.id;
INSERT INTO experience_sequence (project_id, last_seq)
    SELECT project_id, MAX(seq) FROM experience_record GROUP BY project_id;
CREATE UNIQUE INDEX experience_project_seq ON experience_record (project_id, seq);

CREATE TRIGGER experience_assign_seq AFTER INSERT ON experience_record BEGIN
    INSERT OR IGNORE INTO experience_sequence (project_id, last_seq) VALUES (NEW.project_id, 0);
    UPDATE experience_sequence SET last_seq = last_seq + 1 WHERE project_id = NEW.project_id;
    UPDATE experience_record SET seq = (SELECT last_seq FROM experience_sequence WHERE project_id = NEW.project_id)
    WHERE rowid = NEW.rowid;
END;

-- The aggregation watermark is the last `seq` a completed aggregation read (0: none yet).
ALTER TABLE learning_aggregation ADD COLUMN watermark_seq INTEGER NOT NULL DEFAULT 0;
UPDATE learning_aggregation SET watermark_seq = COALESCE((
    SELECT MAX(e.seq) FROM experience_record e
    WHERE 'project:' || e.project_id = learning_aggregation.scope_key
      AND (e.created_at < learning_aggregation.watermark_at
           OR (e.created_at = learning_aggregation.watermark_at AND e.id <= learning_aggregation.watermark_id))), 0);
ALTER TABLE learning_aggregation DROP COLUMN watermark_at;
ALTER TABLE learning_aggregation DROP COLUMN watermark_id;

-- Turns start-up catch-up inspected and found with nothing to admit (not eligible, or refused
-- by the session's policy), so later start-ups move on to older turns instead of re-reading them.
CREATE TABLE learning_turn_inspection (
    message_id    TEXT PRIMARY KEY REFERENCES message (id) ON DELETE CASCADE,
    outcome       TEXT NOT NULL CHECK (outcome IN ('not_eligible', 'not_admitted')),
    detail        TEXT,
    inspected_at  INTEGER NOT NULL
);

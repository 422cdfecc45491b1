-- A lesson restated in a later extraction (same rule, other words, another session) reinforces
-- the existing experience: the new citations join its evidence, and `job_id` says which job's
-- source manifest they point into (NULL: the experience's own job).
ALTER TABLE experience_evidence ADD COLUMN job_id TEXT;

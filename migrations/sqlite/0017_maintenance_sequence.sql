-- Memory maintenance reads its inputs in the order the database committed them (experience
-- `seq`, see 0012), not by the inserting host's clock: with a `created_at` watermark, an
-- experience stamped by a host whose clock runs behind, or committed after a later-stamped one,
-- sorted below the watermark and was never maintained. `watermark_id` stays: the last input's id.
ALTER TABLE memory_maintenance ADD COLUMN watermark_seq INTEGER NOT NULL DEFAULT 0;
UPDATE memory_maintenance SET watermark_seq = COALESCE((
    SELECT MAX(e.seq) FROM experience_record e
    WHERE e.project_id = memory_maintenance.project_id
      AND (e.created_at < memory_maintenance.watermark_at
           OR (e.created_at = memory_maintenance.watermark_at AND e.id <= memory_maintenance.watermark_id))), 0);
ALTER TABLE memory_maintenance DROP COLUMN watermark_at;

-- The label trigger of 0019 rewrote the record's row on every evidence insert. A reinforcement
-- appends a citation at a higher ordinal, which cannot change the label, yet the rewrite took
-- the record's row lock early in the settlement (on Postgres every job reinforcing a popular
-- lesson then queued behind that row for the rest of its transaction). The new row can change
-- the label only when no lower ordinal precedes it that already decides it: none at all (the
-- address), or none with a message when the new row has one (the message).
DROP TRIGGER experience_source_label;

CREATE TRIGGER experience_source_label AFTER INSERT ON experience_evidence
WHEN NOT EXISTS (SELECT 1 FROM experience_evidence v
                 WHERE v.experience_id = new.experience_id AND v.ordinal < new.ordinal
                   AND (new.message_id IS NULL OR v.message_id IS NOT NULL))
BEGIN
    UPDATE experience_record SET
        source_message = (SELECT v.message_id FROM experience_evidence v
                          WHERE v.experience_id = new.experience_id AND v.message_id IS NOT NULL
                          ORDER BY v.ordinal LIMIT 1),
        source_address = (SELECT v.address FROM experience_evidence v
                          WHERE v.experience_id = new.experience_id
                          ORDER BY v.ordinal LIMIT 1)
    WHERE id = new.experience_id;
END;

-- The label trigger of 0019 rewrote the record's row on every evidence insert. A reinforcement
-- appends a citation at a higher ordinal, which cannot change the label, yet the rewrite took
-- the record's row lock early in the settlement (every job reinforcing a popular lesson then
-- queued behind that row for the rest of its transaction). The new row can change the label
-- only when no lower ordinal precedes it that already decides it: none at all (the address),
-- or none with a message when the new row has one (the message).
CREATE OR REPLACE FUNCTION experience_source_label() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM experience_evidence v
               WHERE v.experience_id = NEW.experience_id AND v.ordinal < NEW.ordinal
                 AND (NEW.message_id IS NULL OR v.message_id IS NOT NULL)) THEN
        RETURN NULL;
    END IF;
    UPDATE experience_record SET
        source_message = (SELECT v.message_id FROM experience_evidence v
                          WHERE v.experience_id = NEW.experience_id AND v.message_id IS NOT NULL
                          ORDER BY v.ordinal LIMIT 1),
        source_address = (SELECT v.address FROM experience_evidence v
                          WHERE v.experience_id = NEW.experience_id
                          ORDER BY v.ordinal LIMIT 1)
    WHERE id = NEW.experience_id;
    RETURN NULL;
END;
$$;

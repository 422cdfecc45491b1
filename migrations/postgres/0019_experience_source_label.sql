-- `context` labels each experience it shows with its source: the first citation's message and
-- address. Reading them from `experience_evidence` at prompt time cost two more index lookups
-- per candidate into the largest table (the excerpts). The label is written here, by the
-- trigger below, whoever inserts the evidence; the prompt path reads the record row only. The
-- definition is the one the read used: the address of the lowest ordinal, and the message of
-- the lowest ordinal that has one. Evidence rows are append-only (no statement updates one;
-- they go only with their record), so an insert is the only write that can change the label.
-- Neither column is indexed, so the write stays a HOT update.
ALTER TABLE experience_record ADD COLUMN source_message TEXT;
ALTER TABLE experience_record ADD COLUMN source_address TEXT;

UPDATE experience_record SET
    source_message = (SELECT v.message_id FROM experience_evidence v
                      WHERE v.experience_id = experience_record.id AND v.message_id IS NOT NULL
                      ORDER BY v.ordinal LIMIT 1),
    source_address = (SELECT v.address FROM experience_evidence v
                      WHERE v.experience_id = experience_record.id
                      ORDER BY v.ordinal LIMIT 1);

CREATE FUNCTION experience_source_label() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
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

CREATE TRIGGER experience_source_label AFTER INSERT ON experience_evidence
    FOR EACH ROW EXECUTE FUNCTION experience_source_label();

-- Whether every source of a session was written by a caller allowed to change global Memory.
-- A project-scoped token (no global write) that sends a message or feedback clears it for good,
-- so a lesson learned from that session cannot reach global Memory without review: learning
-- must not be a way around the scope check of `POST …/memory` with `target: global`. A manual
-- record (`learn remember`) made by such a caller carries the same mark itself.
ALTER TABLE session ADD COLUMN global_write_sources BOOLEAN NOT NULL DEFAULT TRUE;
ALTER TABLE experience_record ADD COLUMN global_write_source BOOLEAN NOT NULL DEFAULT TRUE;

-- Tokens held for an automatic model call from its claim until its spend is recorded, so that
-- concurrent claims near the daily cap see each other and cannot together pass it. One row per
-- job attempt; a row counts only while its attempt still runs and its call has not recorded.
CREATE TABLE provider_token_reservation (
    job_id      TEXT NOT NULL REFERENCES learning_job (id) ON DELETE CASCADE,
    attempt     INTEGER NOT NULL,
    day         INTEGER NOT NULL,
    tokens      INTEGER NOT NULL CHECK (tokens >= 0),
    released    BOOLEAN NOT NULL DEFAULT FALSE,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (job_id, attempt)
);
CREATE INDEX provider_token_reservation_day ON provider_token_reservation (day, released);

-- Session learning policy, frozen at session creation (spec 001 "Session policy").
CREATE TABLE session_memory_policy (
    session_id    TEXT PRIMARY KEY REFERENCES session (id) ON DELETE CASCADE,
    use_memories  BOOLEAN NOT NULL,
    generation    TEXT NOT NULL CHECK (generation IN ('enabled', 'disabled', 'excluded')),
    revision      INTEGER NOT NULL CHECK (revision >= 1),
    reason        TEXT,
    updated_at    INTEGER NOT NULL
);

-- Current feedback on a persisted assistant message; every change also appends an event.
CREATE TABLE message_feedback (
    message_id  TEXT PRIMARY KEY REFERENCES message (id) ON DELETE CASCADE,
    session_id  TEXT NOT NULL REFERENCES session (id) ON DELETE CASCADE,
    value       TEXT NOT NULL CHECK (value IN ('positive', 'negative')),
    note        TEXT,
    revision    INTEGER NOT NULL CHECK (revision >= 1),
    updated_at  INTEGER NOT NULL
);

-- Durable learning events: extraction requests and outcomes, feedback changes, retrieval skips.
CREATE TABLE learning_event (
    id          TEXT PRIMARY KEY,
    kind        TEXT NOT NULL,
    project_id  TEXT,
    session_id  TEXT,
    job_id      TEXT,
    message_id  TEXT,
    payload     TEXT NOT NULL,
    at          INTEGER NOT NULL
);
CREATE INDEX learning_event_job ON learning_event (job_id, at);
CREATE INDEX learning_event_session ON learning_event (session_id, at);
CREATE INDEX learning_event_kind ON learning_event (kind, at);

-- The exact bounded manifest an extraction attempt read, persisted before the provider request.
CREATE TABLE learning_source_record (
    job_id          TEXT NOT NULL REFERENCES learning_job (id) ON DELETE CASCADE,
    source_id       TEXT NOT NULL,
    address         TEXT NOT NULL,
    message_id      TEXT,
    part_ordinal    INTEGER,
    kind            TEXT NOT NULL,
    verification    TEXT NOT NULL,
    text            TEXT NOT NULL,
    raw_digest      TEXT NOT NULL,
    redacted_digest TEXT NOT NULL,
    clipped         BOOLEAN NOT NULL,
    PRIMARY KEY (job_id, source_id)
);

-- Experience: cited evidence of one outcome, problem, correction, feedback item or procedure.
CREATE TABLE experience_record (
    id                TEXT PRIMARY KEY,
    project_id        TEXT NOT NULL REFERENCES project (id) ON DELETE CASCADE,
    session_id        TEXT REFERENCES session (id) ON DELETE SET NULL,
    job_id            TEXT REFERENCES learning_job (id) ON DELETE SET NULL,
    ordinal           INTEGER,
    origin            TEXT NOT NULL CHECK (origin IN ('extraction', 'remember', 'issue')),
    extractor_version TEXT,
    kind              TEXT NOT NULL CHECK (kind IN ('outcome', 'problem', 'correction', 'feedback', 'verified_procedure', 'unresolved_issue')),
    title             TEXT NOT NULL,
    summary           TEXT NOT NULL,
    resolution        TEXT,
    confidence        REAL NOT NULL CHECK (confidence >= 0 AND confidence <= 1),
    verification      TEXT NOT NULL CHECK (verification IN ('verified', 'unverified')),
    status            TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'forgotten')),
    content_digest    TEXT NOT NULL,
    use_count         INTEGER NOT NULL DEFAULT 0,
    last_used_at      INTEGER,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    forgotten_at      INTEGER,
    UNIQUE (job_id, ordinal),
    UNIQUE (id, kind)
);
CREATE INDEX experience_project ON experience_record (project_id, created_at);
CREATE INDEX experience_session ON experience_record (session_id);

CREATE TABLE experience_evidence (
    experience_id   TEXT NOT NULL REFERENCES experience_record (id) ON DELETE CASCADE,
    ordinal         INTEGER NOT NULL,
    source_id       TEXT NOT NULL,
    address         TEXT,
    message_id      TEXT,
    excerpt         TEXT NOT NULL,
    raw_digest      TEXT,
    redacted_digest TEXT,
    verified        BOOLEAN NOT NULL,
    detail          TEXT,
    PRIMARY KEY (experience_id, ordinal)
);
CREATE INDEX experience_evidence_message ON experience_evidence (message_id);

-- Raw memory hints from extraction. The composite key pins the cited experience's kind, so an
-- unresolved issue can never become (or later turn into) a memory hint.
CREATE TABLE memory_hint (
    job_id             TEXT NOT NULL REFERENCES learning_job (id) ON DELETE CASCADE,
    ordinal            INTEGER NOT NULL,
    experience_id      TEXT NOT NULL,
    experience_kind    TEXT NOT NULL CHECK (experience_kind <> 'unresolved_issue'),
    project_id         TEXT NOT NULL,
    target             TEXT NOT NULL CHECK (target IN ('global', 'project')),
    action             TEXT NOT NULL CHECK (action IN ('add', 'replace', 'remove')),
    content            TEXT,
    old_text           TEXT,
    reason             TEXT NOT NULL,
    confidence         REAL NOT NULL CHECK (confidence >= 0 AND confidence <= 1),
    created_at         INTEGER NOT NULL,
    PRIMARY KEY (job_id, ordinal),
    FOREIGN KEY (experience_id, experience_kind) REFERENCES experience_record (id, kind)
        ON UPDATE CASCADE ON DELETE CASCADE
);

-- Provider token usage, one row per provider call sequence of an attempt.
CREATE TABLE provider_usage (
    id             TEXT PRIMARY KEY,
    job_id         TEXT,
    project_id     TEXT,
    provider       TEXT NOT NULL,
    model          TEXT NOT NULL,
    automatic      BOOLEAN NOT NULL,
    day            INTEGER NOT NULL,
    input_tokens   INTEGER NOT NULL CHECK (input_tokens >= 0),
    output_tokens  INTEGER NOT NULL CHECK (output_tokens >= 0),
    at             INTEGER NOT NULL
);
CREATE INDEX provider_usage_day ON provider_usage (day, automatic);
CREATE INDEX provider_usage_project ON provider_usage (project_id, day);
CREATE INDEX provider_usage_job ON provider_usage (job_id);

CREATE TABLE provider_health (
    provider    TEXT PRIMARY KEY,
    healthy     BOOLEAN NOT NULL,
    status      INTEGER,
    code        TEXT,
    detail      TEXT,
    updated_at  INTEGER NOT NULL
);

-- Sources whose evidence was explicitly forgotten: never re-admitted or reverified while unchanged.
CREATE TABLE forgotten_source (
    message_id     TEXT NOT NULL,
    raw_digest     TEXT NOT NULL,
    experience_id  TEXT,
    at             INTEGER NOT NULL,
    PRIMARY KEY (message_id, raw_digest)
);

-- The input bound a snapshot's manifest was built with, so a later configuration change cannot
-- make an unchanged source look changed.
ALTER TABLE learning_source_snapshot ADD COLUMN input_bound INTEGER NOT NULL DEFAULT 131072;

-- History repair bookkeeping: which legacy jobs were examined for which extractor version.
CREATE TABLE learning_repair (
    job_id            TEXT NOT NULL REFERENCES learning_job (id) ON DELETE CASCADE,
    extractor_version TEXT NOT NULL,
    outcome           TEXT NOT NULL,
    detail            TEXT,
    repaired_at       INTEGER NOT NULL,
    PRIMARY KEY (job_id, extractor_version)
);

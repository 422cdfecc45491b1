-- The slow path (spec 002 "Slow path: consolidate repeated evidence", "Skill candidates and
-- evaluation", "At-most-once file effects"): patterns, Skill candidates, offline evaluation and
-- the file operations that apply or undo a Skill.

-- A pattern groups repeated, verified evidence under one rule set. Project patterns are mined
-- from one project's experiences; global patterns from promoted project patterns. A rejected
-- pattern keeps the evidence version and digest it was rejected at, so unchanged evidence stays
-- suppressed and new evidence reopens it.
CREATE TABLE learning_pattern (
    id                TEXT PRIMARY KEY,
    scope             TEXT NOT NULL CHECK (scope IN ('project', 'global')),
    project_id        TEXT REFERENCES project (id) ON DELETE CASCADE,
    concept           TEXT NOT NULL,
    rules             TEXT NOT NULL,
    origin            TEXT NOT NULL CHECK (origin IN ('mined', 'promote')),
    state             TEXT NOT NULL CHECK (state IN ('open', 'promoted', 'rejected')),
    version           BIGINT NOT NULL CHECK (version >= 1),
    evidence_digest   TEXT NOT NULL,
    evidence_count    BIGINT NOT NULL CHECK (evidence_count >= 1),
    session_count     BIGINT NOT NULL CHECK (session_count >= 0),
    project_count     BIGINT NOT NULL CHECK (project_count >= 0),
    rejected_version  BIGINT,
    rejected_digest   TEXT,
    job_id            TEXT,
    created_at        BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL,
    CHECK ((scope = 'global') = (project_id IS NULL))
);
CREATE INDEX learning_pattern_project ON learning_pattern (project_id, state, updated_at);

-- What supports a pattern. The composite key pins the experience's kind: an unresolved issue can
-- never be pattern evidence. Global patterns carry the flattened project evidence with the
-- promoted project pattern it came through.
CREATE TABLE learning_pattern_evidence (
    pattern_id         TEXT NOT NULL REFERENCES learning_pattern (id) ON DELETE CASCADE,
    experience_id      TEXT NOT NULL,
    experience_kind    TEXT NOT NULL CHECK (experience_kind <> 'unresolved_issue'),
    project_id         TEXT NOT NULL,
    session_id         TEXT,
    source_pattern_id  TEXT,
    PRIMARY KEY (pattern_id, experience_id),
    FOREIGN KEY (experience_id, experience_kind) REFERENCES experience_record (id, kind)
        ON UPDATE CASCADE ON DELETE CASCADE
);
CREATE INDEX learning_pattern_evidence_experience ON learning_pattern_evidence (experience_id);

-- Aggregation watermarks: the newest input a completed aggregation consumed, per scope key
-- (`project:<id>` or `global`).
CREATE TABLE learning_aggregation (
    scope_key     TEXT PRIMARY KEY,
    watermark_at  BIGINT NOT NULL,
    watermark_id  TEXT NOT NULL,
    updated_at    BIGINT NOT NULL
);

-- A proposed Skill change: the complete SKILL.md, its unified diff against the source, learned
-- rules, evidence, the exact source identity and digest, the target and its writability, the
-- operation, and review/evaluation/effect/reconciliation state.
CREATE TABLE skill_candidate (
    id                TEXT PRIMARY KEY,
    project_id        TEXT NOT NULL REFERENCES project (id) ON DELETE CASCADE,
    pattern_id        TEXT REFERENCES learning_pattern (id) ON DELETE SET NULL,
    pattern_version   BIGINT,
    revokes_id        TEXT REFERENCES skill_candidate (id) ON DELETE SET NULL,
    name              TEXT NOT NULL,
    operation         TEXT NOT NULL CHECK (operation IN ('apply', 'revoke')),
    source_path       TEXT NOT NULL,
    source_kind       TEXT NOT NULL CHECK (source_kind IN ('absent', 'writable', 'read_only')),
    source_digest     TEXT,
    target_path       TEXT NOT NULL,
    writable          BOOLEAN NOT NULL,
    companion         BOOLEAN NOT NULL,
    content           TEXT,
    content_digest    TEXT,
    diff              TEXT NOT NULL,
    rules             TEXT NOT NULL,
    state             TEXT NOT NULL CHECK (state IN ('pending', 'evaluating', 'approved', 'rejected', 'stale',
                          'applying', 'applied', 'undoing', 'undone', 'uncertain')),
    evaluation_state  TEXT NOT NULL CHECK (evaluation_state IN ('none', 'running', 'passed', 'failed', 'expired', 'cancelled')),
    review_token      TEXT,
    operation_id      TEXT,
    detail            TEXT,
    created_at        BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL
);
CREATE INDEX skill_candidate_project ON skill_candidate (project_id, state, created_at);
-- One automatic candidate per pattern version.
CREATE UNIQUE INDEX skill_candidate_pattern_version ON skill_candidate (pattern_id, pattern_version)
    WHERE pattern_id IS NOT NULL AND operation = 'apply';

CREATE TABLE skill_candidate_evidence (
    candidate_id     TEXT NOT NULL REFERENCES skill_candidate (id) ON DELETE CASCADE,
    experience_id    TEXT NOT NULL,
    experience_kind  TEXT NOT NULL CHECK (experience_kind <> 'unresolved_issue'),
    PRIMARY KEY (candidate_id, experience_id),
    FOREIGN KEY (experience_id, experience_kind) REFERENCES experience_record (id, kind)
        ON UPDATE CASCADE ON DELETE CASCADE
);
CREATE INDEX skill_candidate_evidence_experience ON skill_candidate_evidence (experience_id);

-- An apply or undo effect, persisted with its exact before/after snapshots (NULL = absent) before
-- the file is touched; reconciliation classifies what the filesystem shows and never replays it.
CREATE TABLE skill_operation (
    id             TEXT PRIMARY KEY,
    candidate_id   TEXT NOT NULL REFERENCES skill_candidate (id) ON DELETE CASCADE,
    kind           TEXT NOT NULL CHECK (kind IN ('apply', 'undo')),
    path           TEXT NOT NULL,
    before_content TEXT,
    before_digest  TEXT,
    after_content  TEXT,
    after_digest   TEXT,
    state          TEXT NOT NULL CHECK (state IN ('prepared', 'applied', 'not_applied', 'uncertain')),
    detail         TEXT,
    created_at     BIGINT NOT NULL,
    settled_at     BIGINT
);
CREATE INDEX skill_operation_candidate ON skill_operation (candidate_id, created_at);

-- Immutable, versioned offline suites: cases with their recorded tool calls and hidden expected
-- answers.
CREATE TABLE evaluation_suite (
    id            TEXT PRIMARY KEY,
    candidate_id  TEXT NOT NULL REFERENCES skill_candidate (id) ON DELETE CASCADE,
    version       BIGINT NOT NULL CHECK (version >= 1),
    digest        TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    UNIQUE (candidate_id, version)
);

CREATE TABLE evaluation_case (
    suite_id    TEXT NOT NULL REFERENCES evaluation_suite (id) ON DELETE CASCADE,
    ordinal     BIGINT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('failure', 'protection')),
    weight      DOUBLE PRECISION NOT NULL CHECK (weight > 0),
    experience_id TEXT,
    task        TEXT NOT NULL,
    calls       TEXT NOT NULL,
    expected    TEXT NOT NULL,
    PRIMARY KEY (suite_id, ordinal)
);

-- One review of a candidate: an absolute deadline and an ownership token that fences its result.
CREATE TABLE evaluation_run (
    id               TEXT PRIMARY KEY,
    suite_id         TEXT NOT NULL REFERENCES evaluation_suite (id) ON DELETE CASCADE,
    candidate_id     TEXT NOT NULL REFERENCES skill_candidate (id) ON DELETE CASCADE,
    job_id           TEXT,
    owner_token      TEXT NOT NULL,
    state            TEXT NOT NULL CHECK (state IN ('running', 'passed', 'failed', 'expired', 'cancelled')),
    deadline_at      BIGINT NOT NULL,
    baseline_score   DOUBLE PRECISION,
    candidate_score  DOUBLE PRECISION,
    diagnostic       TEXT,
    started_at       BIGINT NOT NULL,
    finished_at      BIGINT
);
CREATE INDEX evaluation_run_state ON evaluation_run (state, deadline_at);
CREATE INDEX evaluation_run_candidate ON evaluation_run (candidate_id, started_at);

CREATE TABLE evaluation_result (
    run_id        TEXT NOT NULL REFERENCES evaluation_run (id) ON DELETE CASCADE,
    case_ordinal  BIGINT NOT NULL,
    variant       TEXT NOT NULL CHECK (variant IN ('baseline', 'candidate')),
    answer        TEXT NOT NULL,
    trace         TEXT NOT NULL,
    score         DOUBLE PRECISION NOT NULL CHECK (score >= 0 AND score <= 1),
    passed        BOOLEAN NOT NULL,
    critical      BOOLEAN NOT NULL,
    reason        TEXT,
    PRIMARY KEY (run_id, case_ordinal, variant)
);

-- Guards: checkable lessons compiled into tool-call matchers that the agents' PreToolUse hooks
-- enforce. A guard is a candidate first (`pending`); `guards.promotion` decides whether it takes
-- effect at once (`active`) or waits for a person. `project_id` NULL: compiled from global Memory,
-- it applies in every project. `matcher_key` is the matcher's canonical text: one guard per thing
-- guarded per scope. The counters are what `learn status` shows per rule.
CREATE TABLE guard (
    id               TEXT PRIMARY KEY,
    project_id       TEXT REFERENCES project (id) ON DELETE CASCADE,
    matcher          TEXT NOT NULL,
    matcher_key      TEXT NOT NULL,
    alternative      TEXT,
    reason           TEXT NOT NULL,
    source_entry_id  TEXT,
    evidence         TEXT NOT NULL DEFAULT '[]',
    origin           TEXT NOT NULL CHECK (origin IN ('rules', 'model', 'user')),
    state            TEXT NOT NULL CHECK (state IN ('pending', 'active', 'disabled', 'rejected', 'retired')),
    decision         TEXT NOT NULL CHECK (decision IN ('ask', 'deny')),
    blocks           INTEGER NOT NULL DEFAULT 0,
    violations       INTEGER NOT NULL DEFAULT 0,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
);
CREATE UNIQUE INDEX guard_identity ON guard (COALESCE(project_id, ''), matcher_key);
CREATE INDEX guard_enforced ON guard (project_id, state);

-- What happened to each guard: its audit trail (proposed, approved, rejected, disabled,
-- enabled, retired) and its evidence (a call it stopped, a transcript that broke it).
CREATE TABLE guard_event (
    id          TEXT PRIMARY KEY,
    guard_id    TEXT NOT NULL REFERENCES guard (id) ON DELETE CASCADE,
    kind        TEXT NOT NULL CHECK (kind IN ('proposed', 'approved', 'rejected', 'disabled', 'enabled', 'retired', 'blocked', 'violated')),
    session_id  TEXT,
    detail      TEXT,
    at          INTEGER NOT NULL
);
CREATE INDEX guard_event_guard ON guard_event (guard_id, at);

-- Token scopes that include global Memory and mark the user's own tokens.
--
-- `global_scope` is what a token may do with global Memory (its candidates, revisions, inspect
-- and import): `none` (project-scoped tokens until now), `read` or `write`. `is_user` marks a token
-- as the user's: only such a token may state `origin: "user"` on a Memory change or bind a
-- project's worktree. Existing tokens keep exactly the access they had: projects only.
ALTER TABLE api_token ADD COLUMN global_scope TEXT NOT NULL DEFAULT 'none'
    CHECK (global_scope IN ('none', 'read', 'write'));
ALTER TABLE api_token ADD COLUMN is_user BOOLEAN NOT NULL DEFAULT FALSE;

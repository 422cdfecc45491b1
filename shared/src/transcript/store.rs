//! Storage of projects, sessions and messages.

use std::collections::HashMap;

use super::model::{Message, MessageStatus, Part, Project, Role, Session, StoredPart, ToolStatus};
use crate::clock::SharedClock;
use crate::db::{Backend, Db, StoreError, Tx};

/// Errors from transcript operations. Each names what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum TranscriptError {
    #[error("{what} `{id}` was not found")]
    NotFound { what: &'static str, id: String },
    #[error("{0}")]
    Conflict(String),
    #[error("invalid `{field}`: {reason}")]
    Invalid { field: String, reason: String },
    /// A worktree inside, above or equal to another project's worktree.
    #[error("the worktree overlaps the worktree of project `{project}`")]
    WorktreeClaimed { project: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for TranscriptError {
    fn from(error: sqlx::Error) -> Self {
        TranscriptError::Store(StoreError::Database(error))
    }
}

#[derive(Debug, Clone)]
pub struct NewProject {
    pub id: String,
    pub name: String,
    pub worktree: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct NewSession {
    pub id: Option<String>,
    pub project_id: String,
    pub parent_id: Option<String>,
    pub title: Option<String>,
    pub model: Option<String>,
    pub external_ref: Option<String>,
}

#[derive(Debug, Clone)]
pub struct NewMessage {
    pub id: Option<String>,
    pub role: Role,
    pub status: Option<MessageStatus>,
    pub parts: Vec<Part>,
    pub created_at: Option<i64>,
}

/// Handle to transcript storage.
#[derive(Debug, Clone)]
pub struct TranscriptStore {
    db: Db,
    clock: SharedClock,
}

const MESSAGE_COLUMNS: &str =
    "id, session_id, seq, role, status, revision, created_at, completed_at";
const PART_COLUMNS: &str = "message_id, ordinal, kind, text, tool_name, tool_call_id, \
    tool_arguments, tool_result, tool_status, artifact_name, artifact_uri, external_context, \
    injected, content_digest";

#[derive(sqlx::FromRow)]
struct MessageRow {
    id: String,
    session_id: String,
    seq: i64,
    role: String,
    status: String,
    revision: i64,
    created_at: i64,
    completed_at: Option<i64>,
}

#[derive(sqlx::FromRow)]
struct PartRow {
    message_id: String,
    ordinal: i64,
    kind: String,
    text: Option<String>,
    tool_name: Option<String>,
    tool_call_id: Option<String>,
    tool_arguments: Option<String>,
    tool_result: Option<String>,
    tool_status: Option<String>,
    artifact_name: Option<String>,
    artifact_uri: Option<String>,
    external_context: bool,
    injected: bool,
    content_digest: String,
}

/// A row of a window read: a message and one of its parts (all part columns NULL for a message
/// without parts).
#[derive(sqlx::FromRow)]
struct WindowRow {
    #[sqlx(flatten)]
    message: MessageRow,
    part_ordinal: Option<i64>,
    part_kind: Option<String>,
    part_text: Option<String>,
    part_tool_name: Option<String>,
    part_tool_call_id: Option<String>,
    part_tool_arguments: Option<String>,
    part_tool_result: Option<String>,
    part_tool_status: Option<String>,
    part_artifact_name: Option<String>,
    part_artifact_uri: Option<String>,
    part_external_context: Option<bool>,
    part_injected: Option<bool>,
    part_content_digest: Option<String>,
}

impl WindowRow {
    fn split(self) -> (MessageRow, Option<PartRow>) {
        let part = match (self.part_ordinal, self.part_kind, self.part_content_digest) {
            (Some(ordinal), Some(kind), Some(content_digest)) => Some(PartRow {
                message_id: self.message.id.clone(),
                ordinal,
                kind,
                text: self.part_text,
                tool_name: self.part_tool_name,
                tool_call_id: self.part_tool_call_id,
                tool_arguments: self.part_tool_arguments,
                tool_result: self.part_tool_result,
                tool_status: self.part_tool_status,
                artifact_name: self.part_artifact_name,
                artifact_uri: self.part_artifact_uri,
                external_context: self.part_external_context.unwrap_or(false),
                injected: self.part_injected.unwrap_or(false),
                content_digest,
            }),
            _ => None,
        };
        (self.message, part)
    }
}

impl PartRow {
    fn into_part(self) -> Result<(String, StoredPart), StoreError> {
        let corrupt = |what: &str| {
            StoreError::Corrupt(format!(
                "message_part {}#{}: {what}",
                self.message_id, self.ordinal
            ))
        };
        let part = match self.kind.as_str() {
            "text" => Part::Text {
                text: self.text.clone().unwrap_or_default(),
                injected: self.injected,
            },
            "tool_call" => Part::ToolCall {
                tool_name: self.tool_name.clone().ok_or_else(|| corrupt("tool_name"))?,
                call_id: self.tool_call_id.clone(),
                arguments: match &self.tool_arguments {
                    Some(text) => serde_json::from_str(text).map_err(|_| corrupt("arguments"))?,
                    None => serde_json::Value::Null,
                },
                result: self.tool_result.clone(),
                status: self
                    .tool_status
                    .as_deref()
                    .and_then(ToolStatus::parse)
                    .ok_or_else(|| corrupt("tool_status"))?,
                external_context: self.external_context,
                injected: self.injected,
            },
            "artifact" => Part::Artifact {
                name: self
                    .artifact_name
                    .clone()
                    .ok_or_else(|| corrupt("artifact_name"))?,
                uri: self.artifact_uri.clone(),
                text: self.text.clone(),
            },
            "error" => Part::Error {
                text: self.text.clone().unwrap_or_default(),
            },
            _ => return Err(corrupt("kind")),
        };
        Ok((
            self.message_id,
            StoredPart {
                ordinal: self.ordinal,
                part,
                content_digest: self.content_digest,
            },
        ))
    }
}

impl TranscriptStore {
    pub fn new(db: Db, clock: SharedClock) -> TranscriptStore {
        TranscriptStore { db, clock }
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Creates a project, or returns the existing one when it has the same name and worktree.
    /// The boolean is true when the project was created. An existing project without a
    /// worktree takes the one asked for (a repository whose first sessions found its worktree
    /// claimed, or whose worktree was unbound, is bound by its next session); one with another
    /// worktree is a conflict (moving it is [`TranscriptStore::set_worktree`]'s business).
    ///
    /// A worktree is a claim: no other project's worktree may equal it, lie inside it or contain
    /// it. The check and the write happen in one write transaction (on Postgres under an
    /// advisory lock), so two concurrent claims of overlapping directories cannot both succeed.
    /// The caller passes the worktree in canonical form; filesystem checks are its business.
    pub async fn create_project(
        &self,
        new: &NewProject,
    ) -> Result<(Project, bool), TranscriptError> {
        validate_id("id", &new.id)?;
        if new.name.trim().is_empty() || new.name.chars().count() > 200 {
            return Err(invalid("name", "must be 1–200 characters"));
        }
        let mut tx = self.claim_tx().await?;
        if let Some(project) = project_in(&mut tx, &new.id).await? {
            let binds = project.worktree.is_none() && new.worktree.is_some();
            if project.name != new.name || (project.worktree != new.worktree && !binds) {
                tx.rollback().await?;
                return Err(TranscriptError::Conflict(format!(
                    "project `{}` already exists with a different name or worktree",
                    new.id
                )));
            }
            if !binds {
                tx.rollback().await?;
                return Ok((project, false));
            }
            let project = set_worktree_in(&mut tx, project, new.worktree.as_deref()).await?;
            tx.commit().await?;
            return Ok((project, false));
        }
        if let Some(worktree) = &new.worktree {
            check_claim_in(&mut tx, worktree, &new.id).await?;
        }
        let now = self.clock.now_ms();
        let insert = "INSERT INTO project (id, name, worktree, created_at) VALUES ($1, $2, $3, $4)";
        crate::db::execute_in(
            &mut tx,
            insert,
            &[
                (&new.id).into(),
                (&new.name).into(),
                (&new.worktree).into(),
                now.into(),
            ],
        )
        .await?;
        tx.commit().await?;
        Ok((
            Project {
                id: new.id.clone(),
                name: new.name.clone(),
                worktree: new.worktree.clone(),
                created_at: now,
            },
            true,
        ))
    }

    /// Binds a project to `worktree` (canonical, checked by the caller), moving it from any
    /// worktree it had, or unbinds it (`None`). The claim rule of
    /// [`TranscriptStore::create_project`] holds, the project's own claim aside. What Zuno last
    /// wrote at the old place is forgotten, so the project's rules file is written afresh at the
    /// new one (a file already there that Zuno did not write is preserved, not overwritten);
    /// the old file stays where it is.
    pub async fn set_worktree(
        &self,
        id: &str,
        worktree: Option<&str>,
    ) -> Result<Project, TranscriptError> {
        let mut tx = self.claim_tx().await?;
        let Some(project) = project_in(&mut tx, id).await? else {
            tx.rollback().await?;
            return Err(not_found("project", id));
        };
        let project = set_worktree_in(&mut tx, project, worktree).await?;
        tx.commit().await?;
        Ok(project)
    }

    /// A write transaction in which worktree claims are checked and written (on Postgres under
    /// the claim lock; SQLite's write transaction is already exclusive).
    async fn claim_tx(&self) -> Result<Tx, TranscriptError> {
        let mut tx = self.db.begin().await?;
        if tx.backend() == Backend::Postgres {
            crate::db::execute_in(
                &mut tx,
                "SELECT pg_advisory_xact_lock($1)",
                &[WORKTREE_CLAIM_LOCK.into()],
            )
            .await?;
        }
        Ok(tx)
    }

    pub async fn project(&self, id: &str) -> Result<Project, TranscriptError> {
        let sql = "SELECT id, name, worktree, created_at FROM project WHERE id = $1";
        let project: Option<Project> = crate::on_db!(self.db, |pool| sqlx::query_as(sql)
            .bind(id)
            .fetch_optional(pool)
            .await)?;
        project.ok_or_else(|| not_found("project", id))
    }

    pub async fn projects(&self) -> Result<Vec<Project>, TranscriptError> {
        let sql = "SELECT id, name, worktree, created_at FROM project ORDER BY id";
        Ok(crate::on_db!(self.db, |pool| sqlx::query_as(sql)
            .fetch_all(pool)
            .await)?)
    }

    /// Creates a session inside the caller's transaction (so policy rows and child jobs can
    /// commit with it).
    pub async fn create_session_in(
        &self,
        tx: &mut Tx,
        new: &NewSession,
    ) -> Result<Session, TranscriptError> {
        let id = match &new.id {
            Some(id) => {
                validate_id("id", id)?;
                id.clone()
            }
            None => crate::ids::new_id("ses"),
        };
        let project_exists: Option<i64> = crate::on_tx!(tx, |conn| sqlx::query_scalar(
            "SELECT CAST(1 AS BIGINT) FROM project WHERE id = $1"
        )
        .bind(&new.project_id)
        .fetch_optional(conn)
        .await)?;
        if project_exists.is_none() {
            return Err(not_found("project", &new.project_id));
        }
        if let Some(parent) = &new.parent_id {
            let parent_project: Option<String> = crate::on_tx!(tx, |conn| sqlx::query_scalar(
                "SELECT project_id FROM session WHERE id = $1"
            )
            .bind(parent)
            .fetch_optional(conn)
            .await)?;
            // A parent in another project is reported exactly like a missing one: the answer
            // must not tell a caller scoped to this project that the other session exists.
            if parent_project.as_deref() != Some(new.project_id.as_str()) {
                return Err(not_found("parent session", parent));
            }
        }
        let now = self.clock.now_ms();
        let sql = "INSERT INTO session (id, project_id, parent_id, title, model, external_ref, created_at) \
                   VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING";
        let inserted = crate::db::execute_in(
            tx,
            sql,
            &[
                (&id).into(),
                (&new.project_id).into(),
                (&new.parent_id).into(),
                (&new.title).into(),
                (&new.model).into(),
                (&new.external_ref).into(),
                now.into(),
            ],
        )
        .await?;
        if inserted == 0 {
            return Err(TranscriptError::Conflict(format!(
                "session `{id}` already exists"
            )));
        }
        Ok(Session {
            id,
            project_id: new.project_id.clone(),
            parent_id: new.parent_id.clone(),
            title: new.title.clone(),
            model: new.model.clone(),
            external_ref: new.external_ref.clone(),
            created_at: now,
        })
    }

    /// Records that a caller without global-Memory write wrote a source of session `id` (a
    /// message or feedback): lessons learned from it reach global Memory only through review.
    /// Sticky: later writers with global write do not vouch for what was already written.
    pub async fn mark_written_without_global_write(&self, id: &str) -> Result<(), TranscriptError> {
        crate::on_db!(self.db, |pool| sqlx::query(
            "UPDATE session SET global_write_sources = FALSE WHERE id = $1 AND global_write_sources"
        )
        .bind(id)
        .execute(pool)
        .await
        .map(|_| ()))?;
        Ok(())
    }

    pub async fn session(&self, id: &str) -> Result<Session, TranscriptError> {
        let sql = "SELECT id, project_id, parent_id, title, model, external_ref, created_at \
                   FROM session WHERE id = $1";
        let session: Option<Session> = crate::on_db!(self.db, |pool| sqlx::query_as(sql)
            .bind(id)
            .fetch_optional(pool)
            .await)?;
        session.ok_or_else(|| not_found("session", id))
    }

    /// Finds a session by the host's own reference (e.g. a Claude Code session id).
    pub async fn session_by_external_ref(
        &self,
        project_id: &str,
        external_ref: &str,
    ) -> Result<Option<Session>, TranscriptError> {
        let sql = "SELECT id, project_id, parent_id, title, model, external_ref, created_at \
                   FROM session WHERE project_id = $1 AND external_ref = $2";
        Ok(crate::on_db!(self.db, |pool| sqlx::query_as(sql)
            .bind(project_id)
            .bind(external_ref)
            .fetch_optional(pool)
            .await)?)
    }

    /// Appends a message at the end of its session, inside the caller's transaction.
    pub async fn append_message_in(
        &self,
        tx: &mut Tx,
        session_id: &str,
        new: &NewMessage,
    ) -> Result<Message, TranscriptError> {
        let id = match &new.id {
            Some(id) => {
                validate_id("id", id)?;
                id.clone()
            }
            None => crate::ids::new_id("msg"),
        };
        validate_parts(&new.parts)?;
        // Serialize appends per session so sequence numbers cannot collide.
        let lock = match tx.backend() {
            Backend::Postgres => "SELECT id FROM session WHERE id = $1 FOR UPDATE",
            Backend::Sqlite => "SELECT id FROM session WHERE id = $1",
        };
        let exists: Option<String> = crate::on_tx!(tx, |conn| sqlx::query_scalar(lock)
            .bind(session_id)
            .fetch_optional(conn)
            .await)?;
        if exists.is_none() {
            return Err(not_found("session", session_id));
        }
        let seq: i64 = crate::on_tx!(tx, |conn| sqlx::query_scalar(
            "SELECT COALESCE(MAX(seq), 0) + 1 FROM message WHERE session_id = $1"
        )
        .bind(session_id)
        .fetch_one(conn)
        .await)?;
        let status = new.status.unwrap_or(match new.role {
            Role::Assistant => MessageStatus::InProgress,
            Role::User | Role::System => MessageStatus::Completed,
        });
        if new.role != Role::Assistant && status != MessageStatus::Completed {
            return Err(invalid(
                "status",
                "only assistant messages have a completion status",
            ));
        }
        let now = new.created_at.unwrap_or_else(|| self.clock.now_ms());
        let completed_at = status.ends_turn().then_some(now);
        let sql = "INSERT INTO message (id, session_id, seq, role, status, revision, created_at, completed_at) \
                   VALUES ($1, $2, $3, $4, $5, 1, $6, $7) ON CONFLICT DO NOTHING";
        let inserted = crate::db::execute_in(
            tx,
            sql,
            &[
                (&id).into(),
                session_id.into(),
                seq.into(),
                new.role.as_str().into(),
                status.as_str().into(),
                now.into(),
                completed_at.into(),
            ],
        )
        .await?;
        if inserted == 0 {
            return Err(TranscriptError::Conflict(format!(
                "message `{id}` already exists"
            )));
        }
        let parts = insert_parts(tx, &id, &new.parts).await?;
        Ok(Message {
            id,
            session_id: session_id.to_owned(),
            seq,
            role: new.role,
            status,
            revision: 1,
            created_at: now,
            completed_at,
            parts,
        })
    }

    /// Replaces a message's parts (an edit), bumping its revision. Snapshots that covered the
    /// message stop matching, so queued work on it is skipped.
    pub async fn replace_parts_in(
        &self,
        tx: &mut Tx,
        message_id: &str,
        parts: &[Part],
    ) -> Result<Message, TranscriptError> {
        validate_parts(parts)?;
        let bumped = crate::db::execute_in(
            tx,
            "UPDATE message SET revision = revision + 1 WHERE id = $1",
            &[message_id.into()],
        )
        .await?;
        if bumped == 0 {
            return Err(not_found("message", message_id));
        }
        crate::db::execute_in(
            tx,
            "DELETE FROM message_part WHERE message_id = $1",
            &[message_id.into()],
        )
        .await?;
        insert_parts(tx, message_id, parts).await?;
        self.message_in(tx, message_id).await
    }

    /// Sets an assistant message's completion status (a no-op when unchanged).
    pub async fn set_status_in(
        &self,
        tx: &mut Tx,
        message_id: &str,
        status: MessageStatus,
    ) -> Result<Message, TranscriptError> {
        let message = self.message_in(tx, message_id).await?;
        if message.role != Role::Assistant {
            return Err(invalid(
                "status",
                "only assistant messages have a completion status",
            ));
        }
        if message.status == status {
            return Ok(message);
        }
        let now = self.clock.now_ms();
        let completed_at = status.ends_turn().then_some(now);
        // The status is part of every snapshot digest, so changing it invalidates snapshots
        // without a revision bump; the revision counts content edits.
        crate::db::execute_in(
            tx,
            "UPDATE message SET status = $2, completed_at = $3 WHERE id = $1",
            &[
                message_id.into(),
                status.as_str().into(),
                completed_at.into(),
            ],
        )
        .await?;
        self.message_in(tx, message_id).await
    }

    pub async fn message_in(
        &self,
        tx: &mut Tx,
        message_id: &str,
    ) -> Result<Message, TranscriptError> {
        let sql = format!("SELECT {MESSAGE_COLUMNS} FROM message WHERE id = $1");
        let row: Option<MessageRow> =
            crate::on_tx!(tx, |conn| sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
                .bind(message_id)
                .fetch_optional(conn)
                .await)?;
        let row = row.ok_or_else(|| not_found("message", message_id))?;
        let parts_sql = format!(
            "SELECT {PART_COLUMNS} FROM message_part WHERE message_id = $1 ORDER BY ordinal"
        );
        let parts: Vec<PartRow> = crate::on_tx!(tx, |conn| sqlx::query_as(sqlx::AssertSqlSafe(
            parts_sql.as_str()
        ))
        .bind(message_id)
        .fetch_all(conn)
        .await)?;
        let mut messages = assemble(vec![row], parts)?;
        Ok(messages.remove(0))
    }

    pub async fn message(&self, message_id: &str) -> Result<Message, TranscriptError> {
        let mut tx = self.db.begin_read().await?;
        let message = self.message_in(&mut tx, message_id).await;
        tx.rollback().await?;
        message
    }

    /// Messages of a session with `from_seq <= seq <= to_seq`, in order, read inside `tx` so the
    /// caller sees the same snapshot it will write against.
    pub async fn window_in(
        tx: &mut Tx,
        session_id: &str,
        from_seq: i64,
        to_seq: i64,
    ) -> Result<Vec<Message>, TranscriptError> {
        // One statement: each message with its parts (a message without parts is one row with
        // NULL part columns). The source checks of every job read windows, so a second
        // statement for the parts was a tenth of a job's statements.
        let sql = "SELECT m.id, m.session_id, m.seq, m.role, m.status, m.revision, m.created_at, m.completed_at, \
                     p.ordinal AS part_ordinal, p.kind AS part_kind, p.text AS part_text, \
                     p.tool_name AS part_tool_name, p.tool_call_id AS part_tool_call_id, \
                     p.tool_arguments AS part_tool_arguments, p.tool_result AS part_tool_result, \
                     p.tool_status AS part_tool_status, p.artifact_name AS part_artifact_name, \
                     p.artifact_uri AS part_artifact_uri, p.external_context AS part_external_context, \
                     p.injected AS part_injected, p.content_digest AS part_content_digest \
                   FROM message m LEFT JOIN message_part p ON p.message_id = m.id \
                   WHERE m.session_id = $1 AND m.seq BETWEEN $2 AND $3 ORDER BY m.seq, p.ordinal";
        let joined: Vec<WindowRow> = crate::on_tx!(tx, |conn| sqlx::query_as(sql)
            .bind(session_id)
            .bind(from_seq)
            .bind(to_seq)
            .fetch_all(conn)
            .await)?;
        let mut rows: Vec<MessageRow> = Vec::new();
        let mut parts: Vec<PartRow> = Vec::with_capacity(joined.len());
        for row in joined {
            let (message, part) = row.split();
            if rows.last().is_none_or(|last| last.id != message.id) {
                rows.push(message);
            }
            parts.extend(part);
        }
        assemble(rows, parts)
    }

    /// The sequence number of the last turn-ending assistant message before `seq`, or 0.
    pub async fn previous_turn_end_in(
        tx: &mut Tx,
        session_id: &str,
        seq: i64,
    ) -> Result<i64, TranscriptError> {
        let sql = "SELECT COALESCE(MAX(seq), 0) FROM message \
                   WHERE session_id = $1 AND seq < $2 AND role = 'assistant' AND status <> 'in_progress'";
        Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(sql)
            .bind(session_id)
            .bind(seq)
            .fetch_one(conn)
            .await)?)
    }

    /// Messages of a session in order, paged by sequence number: at most `limit` (1–1000)
    /// messages after `after_seq`, and no more than [`MAX_PAGE_BYTES`] of part content, except
    /// that a page always holds at least one message (so paging always advances).
    pub async fn messages(
        &self,
        session_id: &str,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<Message>, TranscriptError> {
        let first = after_seq.saturating_add(1);
        let mut last: i64 = after_seq.saturating_add(limit.clamp(1, 1000));
        let mut tx = self.db.begin_read().await?;
        let backend = tx.backend();
        let bytes = |column: &str| match backend {
            Backend::Postgres => format!("OCTET_LENGTH(COALESCE({column}, ''))"),
            Backend::Sqlite => format!("LENGTH(CAST(COALESCE({column}, '') AS BLOB))"),
        };
        let sizes_sql = format!(
            "SELECT m.seq, CAST(COALESCE(SUM({} + {} + {} + {}), 0) AS BIGINT) \
             FROM message m LEFT JOIN message_part p ON p.message_id = m.id \
             WHERE m.session_id = $1 AND m.seq BETWEEN $2 AND $3 GROUP BY m.seq ORDER BY m.seq",
            bytes("p.text"),
            bytes("p.tool_arguments"),
            bytes("p.tool_result"),
            bytes("p.artifact_uri"),
        );
        let sizes: Vec<(i64, i64)> = crate::on_tx!(&mut tx, |conn| sqlx::query_as(
            sqlx::AssertSqlSafe(sizes_sql.as_str())
        )
        .bind(session_id)
        .bind(first)
        .bind(last)
        .fetch_all(conn)
        .await)?;
        let mut total = 0i64;
        for (index, (seq, bytes)) in sizes.iter().enumerate() {
            total = total.saturating_add(*bytes);
            if index > 0 && total > MAX_PAGE_BYTES {
                last = seq - 1;
                break;
            }
        }
        let messages = Self::window_in(&mut tx, session_id, first, last).await;
        tx.rollback().await?;
        messages
    }

    /// Whether a stored message is what `new` would have created: the same role, status, parts
    /// and (when given) timestamp. A resend of the same message is recognised by this.
    pub fn same_message(stored: &Message, new: &NewMessage) -> bool {
        let status = new.status.unwrap_or(match new.role {
            Role::Assistant => MessageStatus::InProgress,
            Role::User | Role::System => MessageStatus::Completed,
        });
        stored.role == new.role
            && stored.status == status
            && new.created_at.is_none_or(|at| at == stored.created_at)
            && stored.parts.len() == new.parts.len()
            && stored
                .parts
                .iter()
                .zip(&new.parts)
                .all(|(stored, part)| stored.content_digest == part.content_digest())
    }
}

/// The part content one page of messages may carry (text, tool arguments and results, artifact
/// URIs), so a listing cannot be made to hold a whole huge session in memory at once.
pub const MAX_PAGE_BYTES: i64 = 4 * 1024 * 1024;

async fn project_in(tx: &mut Tx, id: &str) -> Result<Option<Project>, TranscriptError> {
    let sql = "SELECT id, name, worktree, created_at FROM project WHERE id = $1";
    Ok(crate::on_tx!(tx, |conn| sqlx::query_as(sql)
        .bind(id)
        .fetch_optional(conn)
        .await)?)
}

/// Refuses `worktree` when it equals, lies inside or contains the worktree of a project other
/// than `project_id`.
async fn check_claim_in(
    tx: &mut Tx,
    worktree: &str,
    project_id: &str,
) -> Result<(), TranscriptError> {
    let claimed: Vec<(String, String)> = crate::on_tx!(tx, |conn| sqlx::query_as(
        "SELECT id, worktree FROM project WHERE worktree IS NOT NULL AND id <> $1 ORDER BY id"
    )
    .bind(project_id)
    .fetch_all(conn)
    .await)?;
    let wanted = std::path::Path::new(worktree);
    match claimed.iter().find(|(_, other)| {
        let other = std::path::Path::new(other);
        wanted.starts_with(other) || other.starts_with(wanted)
    }) {
        Some((project, _)) => Err(TranscriptError::WorktreeClaimed {
            project: project.clone(),
        }),
        None => Ok(()),
    }
}

/// Writes `project`'s new worktree after the claim check, and forgets the projection record of
/// its Memory document (the digest of a file at the old place).
async fn set_worktree_in(
    tx: &mut Tx,
    mut project: Project,
    worktree: Option<&str>,
) -> Result<Project, TranscriptError> {
    if let Some(worktree) = worktree {
        check_claim_in(tx, worktree, &project.id).await?;
    }
    crate::db::execute_in(
        tx,
        "UPDATE project SET worktree = $2 WHERE id = $1",
        &[(&project.id).into(), worktree.into()],
    )
    .await?;
    crate::db::execute_in(
        tx,
        "DELETE FROM memory_projection WHERE document_id IN \
           (SELECT id FROM memory_document WHERE project_id = $1)",
        &[(&project.id).into()],
    )
    .await?;
    project.worktree = worktree.map(str::to_owned);
    Ok(project)
}

/// The Postgres advisory-lock key under which project worktree claims are checked and inserted
/// (`zuno-wtree` in ASCII).
const WORKTREE_CLAIM_LOCK: i64 = 0x7A75_6E6F_7774_7265;

async fn insert_parts(
    tx: &mut Tx,
    message_id: &str,
    parts: &[Part],
) -> Result<Vec<StoredPart>, TranscriptError> {
    let sql = format!(
        "INSERT INTO message_part ({PART_COLUMNS}) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"
    );
    let mut stored = Vec::with_capacity(parts.len());
    for (ordinal, part) in parts.iter().enumerate() {
        let ordinal = i64::try_from(ordinal).unwrap_or(i64::MAX);
        let digest = part.content_digest();
        let mut row = PartColumns::default();
        match part {
            Part::Text { text, injected } => {
                row.text = Some(text.clone());
                row.injected = *injected;
            }
            Part::ToolCall {
                tool_name,
                call_id,
                arguments,
                result,
                status,
                external_context,
                injected,
            } => {
                row.tool_name = Some(tool_name.clone());
                row.call_id = call_id.clone();
                row.arguments = Some(arguments.to_string());
                row.result = result.clone();
                row.status = Some(status.as_str());
                row.external = *external_context;
                row.injected = *injected;
            }
            Part::Artifact { name, uri, text } => {
                row.text = text.clone();
                row.artifact_name = Some(name.clone());
                row.artifact_uri = uri.clone();
            }
            Part::Error { text } => row.text = Some(text.clone()),
        }
        crate::db::execute_in(
            tx,
            sqlx::AssertSqlSafe(sql.as_str()),
            &[
                message_id.into(),
                ordinal.into(),
                part.kind().into(),
                (&row.text).into(),
                (&row.tool_name).into(),
                (&row.call_id).into(),
                (&row.arguments).into(),
                (&row.result).into(),
                row.status.into(),
                (&row.artifact_name).into(),
                (&row.artifact_uri).into(),
                row.external.into(),
                row.injected.into(),
                (&digest).into(),
            ],
        )
        .await?;
        stored.push(StoredPart {
            ordinal,
            part: part.clone(),
            content_digest: digest,
        });
    }
    Ok(stored)
}

/// Column values of one part row.
#[derive(Default)]
struct PartColumns {
    text: Option<String>,
    tool_name: Option<String>,
    call_id: Option<String>,
    arguments: Option<String>,
    result: Option<String>,
    status: Option<&'static str>,
    artifact_name: Option<String>,
    artifact_uri: Option<String>,
    external: bool,
    injected: bool,
}

fn assemble(rows: Vec<MessageRow>, parts: Vec<PartRow>) -> Result<Vec<Message>, TranscriptError> {
    let mut by_message: HashMap<String, Vec<StoredPart>> = HashMap::new();
    for part in parts {
        let (message_id, stored) = part.into_part()?;
        by_message.entry(message_id).or_default().push(stored);
    }
    rows.into_iter()
        .map(|row| {
            Ok(Message {
                parts: by_message.remove(&row.id).unwrap_or_default(),
                role: Role::parse(&row.role)
                    .ok_or_else(|| StoreError::Corrupt(format!("message {} role", row.id)))?,
                status: MessageStatus::parse(&row.status)
                    .ok_or_else(|| StoreError::Corrupt(format!("message {} status", row.id)))?,
                id: row.id,
                session_id: row.session_id,
                seq: row.seq,
                revision: row.revision,
                created_at: row.created_at,
                completed_at: row.completed_at,
            })
        })
        .collect()
}

/// Limits on one message's parts, so a single request cannot exhaust storage.
const MAX_PARTS: usize = 512;
const MAX_PART_BYTES: usize = 1024 * 1024;

fn validate_parts(parts: &[Part]) -> Result<(), TranscriptError> {
    if parts.len() > MAX_PARTS {
        return Err(invalid(
            "parts",
            &format!("at most {MAX_PARTS} parts per message"),
        ));
    }
    for (index, part) in parts.iter().enumerate() {
        let size = serde_json::to_vec(part)
            .map(|v| v.len())
            .unwrap_or(usize::MAX);
        if size > MAX_PART_BYTES {
            return Err(invalid(
                &format!("parts[{index}]"),
                &format!("a part may hold at most {MAX_PART_BYTES} bytes"),
            ));
        }
        if let Part::ToolCall { tool_name, .. } = part
            && (tool_name.is_empty() || tool_name.chars().count() > 256)
        {
            return Err(invalid(
                &format!("parts[{index}].toolName"),
                "must be 1–256 characters",
            ));
        }
    }
    Ok(())
}

fn validate_id(field: &str, id: &str) -> Result<(), TranscriptError> {
    if crate::ids::is_valid_external_id(id) {
        Ok(())
    } else {
        Err(invalid(
            field,
            "must be 1–128 characters of letters, digits and . _ : @ -, starting with a letter or digit",
        ))
    }
}

fn invalid(field: &str, reason: &str) -> TranscriptError {
    TranscriptError::Invalid {
        field: field.to_owned(),
        reason: reason.to_owned(),
    }
}

fn not_found(what: &'static str, id: &str) -> TranscriptError {
    TranscriptError::NotFound {
        what,
        id: id.to_owned(),
    }
}

// Session reads for jobs, inside the job's own transaction.

/// The model a session's host reported, if the session exists and named one.
pub async fn session_model_in(tx: &mut Tx, session_id: &str) -> Result<Option<String>, StoreError> {
    let model: Option<Option<String>> = crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT model FROM session WHERE id = $1"
    )
    .bind(session_id)
    .fetch_optional(conn)
    .await)?;
    Ok(model.flatten())
}

/// The project of a session, if the session exists.
pub async fn session_project_in(
    tx: &mut Tx,
    session_id: &str,
) -> Result<Option<String>, StoreError> {
    Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT project_id FROM session WHERE id = $1"
    )
    .bind(session_id)
    .fetch_optional(conn)
    .await)?)
}

//! Loads a labelled transcript into a fresh store through the same routes a host uses, and
//! remembers which stored message came from which line.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{Value, json};
use zuno_shared::transcript::Role;
use zuno_shared::transcript::import::{Host, Position};

use super::error::EvalError;
use super::labels::Format;
use crate::client::{ApiClient, encode};
use crate::import::{Importer, parse_file};

/// A stored message and the transcript line it came from.
#[derive(Debug, Clone)]
pub struct StoredMessage {
    pub line: u64,
    pub role: Role,
    /// The text of a user message (its text parts, joined), to check label excerpts.
    pub text: String,
}

/// What loading put into the store.
#[derive(Debug, Default)]
pub struct Loaded {
    pub messages: HashMap<String, StoredMessage>,
    /// Assistant message id → the line of the feedback given on it.
    pub feedback: HashMap<String, u64>,
    /// Lines the importer could not use, and messages the API refused.
    pub issues: Vec<String>,
}

pub async fn load(
    client: &ApiClient,
    format: Format,
    path: &Path,
    project: &str,
) -> Result<Loaded, EvalError> {
    match format {
        Format::Zuno => load_zuno(client, path, project).await,
        Format::Aider => load_host(client, Host::Aider, path, project).await,
        Format::ClaudeCode => load_host(client, Host::ClaudeCode, path, project).await,
        Format::Codex => load_host(client, Host::Codex, path, project).await,
    }
}

/// A host transcript, through the importer `zuno import` uses.
async fn load_host(
    client: &ApiClient,
    host: Host,
    path: &Path,
    project: &str,
) -> Result<Loaded, EvalError> {
    let parsed = parse_file(host, path, Position::default()).map_err(EvalError::cli)?;
    let mut importer = Importer::new(client.clone(), Some(project.to_owned()));
    let file = path.display().to_string();
    importer
        .import(&file, &parsed, None)
        .await
        .map_err(EvalError::cli)?;
    let mut loaded = Loaded::default();
    for issue in &importer.report.issues {
        loaded
            .issues
            .push(format!("{}:{}: {}", issue.file, issue.line, issue.reason));
    }
    for session in &parsed.sessions {
        let session_id = session.session_id();
        for message in &session.messages {
            loaded.messages.insert(
                message.message_id(&session_id),
                StoredMessage {
                    line: message.line,
                    role: message.role,
                    text: text_of(&serde_json::to_value(&message.parts).unwrap_or(Value::Null)),
                },
            );
        }
    }
    Ok(loaded)
}

/// The synthetic JSONL format: one message or feedback per line.
async fn load_zuno(client: &ApiClient, path: &Path, project: &str) -> Result<Loaded, EvalError> {
    let text = std::fs::read_to_string(path).map_err(|source| EvalError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut loader = ZunoLoader {
        client,
        path,
        project,
        stem,
        loaded: Loaded::default(),
        sessions: HashMap::new(),
        last_assistant: HashMap::new(),
        feedback_revisions: HashMap::new(),
    };
    for (index, raw) in text.lines().enumerate() {
        let line = index as u64 + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        loader.record(line, trimmed).await?;
    }
    Ok(loader.loaded)
}

/// What loading a synthetic transcript keeps from one line to the next.
struct ZunoLoader<'a> {
    client: &'a ApiClient,
    path: &'a Path,
    project: &'a str,
    /// The file's name without extension: message ids are made from it and the line.
    stem: String,
    loaded: Loaded,
    /// The transcript's session key → the stored session's id.
    sessions: HashMap<String, String>,
    /// Session id → its latest assistant message, the one a `feedback` line is about.
    last_assistant: HashMap<String, String>,
    /// Message id → the revision its next feedback replaces (feedback is compare-and-set).
    feedback_revisions: HashMap<String, i64>,
}

impl ZunoLoader<'_> {
    /// Stores one record: a feedback on the session's last assistant message, or a message.
    async fn record(&mut self, line: u64, trimmed: &str) -> Result<(), EvalError> {
        let record: Value =
            serde_json::from_str(trimmed).map_err(|e| self.bad(line, e.to_string()))?;
        let session_key = record
            .get("session")
            .and_then(Value::as_str)
            .ok_or_else(|| self.bad(line, String::from("`session` is missing")))?;
        let session_id = self.session(session_key, line).await?;
        if let Some(value) = record.get("feedback").and_then(Value::as_str) {
            return self.feedback(&session_id, value, &record, line).await;
        }
        self.message(&session_id, &record, line).await
    }

    /// The stored session of `session_key`, created on its first line.
    async fn session(&mut self, session_key: &str, line: u64) -> Result<String, EvalError> {
        if let Some(id) = self.sessions.get(session_key) {
            return Ok(id.clone());
        }
        let id = safe_id(&format!("ev-{}-{session_key}", self.project));
        let created = self
            .client
            .post(
                &format!("/api/projects/{}/sessions", encode(self.project)),
                &json!({ "id": id, "title": session_key }),
            )
            .await;
        if let Err(error) = created
            && error.status() != Some(409)
        {
            return Err(self.bad(line, error.to_string()));
        }
        self.sessions.insert(session_key.to_owned(), id.clone());
        Ok(id)
    }

    async fn feedback(
        &mut self,
        session_id: &str,
        value: &str,
        record: &Value,
        line: u64,
    ) -> Result<(), EvalError> {
        let message = self
            .last_assistant
            .get(session_id)
            .ok_or_else(|| self.bad(line, String::from("feedback before any assistant message")))?
            .clone();
        let revision = self.feedback_revisions.entry(message.clone()).or_insert(0);
        let body =
            json!({ "value": value, "note": record.get("note"), "expectedRevision": *revision });
        self.client
            .post(
                &format!(
                    "/api/session/{}/messages/{}/feedback",
                    encode(session_id),
                    encode(&message)
                ),
                &body,
            )
            .await
            .map_err(|e| bad(self.path, line, e.to_string()))?;
        *revision += 1;
        self.loaded.feedback.insert(message, line);
        Ok(())
    }

    /// Stores a message. One the API refuses is an issue of the report, not the end of the load.
    async fn message(
        &mut self,
        session_id: &str,
        record: &Value,
        line: u64,
    ) -> Result<(), EvalError> {
        let role = match record.get("role").and_then(Value::as_str) {
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            other => return Err(self.bad(line, format!("unknown role {other:?}"))),
        };
        let parts = match (
            record.get("parts"),
            record.get("text").and_then(Value::as_str),
        ) {
            (Some(parts), _) => parts.clone(),
            (None, Some(text)) => json!([{ "type": "text", "text": text }]),
            (None, None) => {
                return Err(self.bad(line, String::from("a message needs `text` or `parts`")));
            }
        };
        let id = safe_id(&format!("ev-{}-{line}", self.stem));
        let mut body = json!({ "id": id, "role": record["role"], "parts": parts });
        if let Some(status) = record.get("status") {
            body["status"] = status.clone();
        }
        match self
            .client
            .post(
                &format!("/api/session/{}/messages", encode(session_id)),
                &body,
            )
            .await
        {
            Ok(_) => {}
            Err(error) if error.status() == Some(409) => {}
            Err(error) => self
                .loaded
                .issues
                .push(format!("{}:{line}: {error}", self.path.display())),
        }
        if role == Role::Assistant {
            self.last_assistant
                .insert(session_id.to_owned(), id.clone());
        }
        self.loaded.messages.insert(
            id,
            StoredMessage {
                line,
                role,
                text: text_of(&parts),
            },
        );
        Ok(())
    }

    fn bad(&self, line: u64, detail: String) -> EvalError {
        bad(self.path, line, detail)
    }
}

/// A line of `path` that cannot be loaded.
fn bad(path: &Path, line: u64, detail: String) -> EvalError {
    EvalError::Transcript {
        path: path.to_path_buf(),
        line,
        detail,
    }
}

/// The text parts of a message, joined by newlines.
fn text_of(parts: &Value) -> String {
    parts
        .as_array()
        .map(|parts| {
            parts
                .iter()
                .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// An id the API accepts: unsafe characters become `-`, bounded.
pub fn safe_id(raw: &str) -> String {
    let mut id: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '@' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(120)
        .collect();
    if !id.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        id.insert(0, 'x');
    }
    id
}

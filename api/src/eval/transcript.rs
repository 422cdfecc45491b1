//! Loads a labelled transcript into a fresh store through the same routes a host uses, and
//! remembers which stored message came from which line.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{Value, json};
use zuno_shared::transcript::Role;
use zuno_shared::transcript::import::{Host, Position};

use super::EvalError;
use super::labels::Format;
use crate::cli::client::{ApiClient, encode};
use crate::cli::import::{Importer, parse_file};

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
    let mut loaded = Loaded::default();
    let mut sessions: HashMap<String, String> = HashMap::new();
    let mut last_assistant: HashMap<String, String> = HashMap::new();
    let mut feedback_revisions: HashMap<String, i64> = HashMap::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index as u64 + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let bad = |detail: String| EvalError::Transcript {
            path: path.to_path_buf(),
            line,
            detail,
        };
        let record: Value = serde_json::from_str(trimmed).map_err(|e| bad(e.to_string()))?;
        let session_key = record
            .get("session")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(String::from("`session` is missing")))?;
        let session_id = match sessions.get(session_key) {
            Some(id) => id.clone(),
            None => {
                let id = safe_id(&format!("ev-{project}-{session_key}"));
                let created = client
                    .post(
                        &format!("/api/projects/{}/sessions", encode(project)),
                        &json!({ "id": id, "title": session_key }),
                    )
                    .await;
                if let Err(error) = created
                    && error.status() != Some(409)
                {
                    return Err(bad(error.to_string()));
                }
                sessions.insert(session_key.to_owned(), id.clone());
                id
            }
        };
        if let Some(value) = record.get("feedback").and_then(Value::as_str) {
            let message = last_assistant
                .get(&session_id)
                .ok_or_else(|| bad(String::from("feedback before any assistant message")))?
                .clone();
            let revision = feedback_revisions.entry(message.clone()).or_insert(0);
            let body = json!({ "value": value, "note": record.get("note"), "expectedRevision": *revision });
            client
                .post(
                    &format!(
                        "/api/session/{}/messages/{}/feedback",
                        encode(&session_id),
                        encode(&message)
                    ),
                    &body,
                )
                .await
                .map_err(|e| bad(e.to_string()))?;
            *revision += 1;
            loaded.feedback.insert(message, line);
            continue;
        }
        let role = match record.get("role").and_then(Value::as_str) {
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            other => return Err(bad(format!("unknown role {other:?}"))),
        };
        let parts = match (
            record.get("parts"),
            record.get("text").and_then(Value::as_str),
        ) {
            (Some(parts), _) => parts.clone(),
            (None, Some(text)) => json!([{ "type": "text", "text": text }]),
            (None, None) => return Err(bad(String::from("a message needs `text` or `parts`"))),
        };
        let id = safe_id(&format!("ev-{stem}-{line}"));
        let mut body = json!({ "id": id, "role": record["role"], "parts": parts });
        if let Some(status) = record.get("status") {
            body["status"] = status.clone();
        }
        match client
            .post(
                &format!("/api/session/{}/messages", encode(&session_id)),
                &body,
            )
            .await
        {
            Ok(_) => {}
            Err(error) if error.status() == Some(409) => {}
            Err(error) => loaded
                .issues
                .push(format!("{}:{line}: {error}", path.display())),
        }
        if role == Role::Assistant {
            last_assistant.insert(session_id.clone(), id.clone());
        }
        loaded.messages.insert(
            id,
            StoredMessage {
                line,
                role,
                text: text_of(&parts),
            },
        );
    }
    Ok(loaded)
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

//! The questions the harness asks the API: a new session, and `context` for a prompt.

use serde::Serialize;
use serde_json::json;

use super::error::EvalError;
use crate::client::{ApiClient, encode};

/// One `context` answer, reduced to what scoring needs.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Recalled {
    pub experience_ids: Vec<String>,
    /// Names of the memory sections present (`memory.global`, `memory.project`).
    pub memory_sections: Vec<String>,
}

/// Asks `context` for `prompt` in `session`.
pub async fn ask(client: &ApiClient, session: &str, prompt: &str) -> Result<Recalled, EvalError> {
    let answer = client
        .post(
            &format!("/api/session/{}/context", encode(session)),
            &json!({ "prompt": prompt }),
        )
        .await
        .map_err(|e| EvalError::cli(e.into()))?;
    let strings = |key: &str| -> Vec<String> {
        answer
            .get(key)
            .and_then(|v| v.as_array())
            .map(|items| {
                items
                    .iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let memory_sections = answer
        .get("sections")
        .and_then(|v| v.as_array())
        .map(|sections| {
            sections
                .iter()
                .filter_map(|s| s.get("name").and_then(|n| n.as_str()))
                .filter(|name| name.starts_with("memory."))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    Ok(Recalled {
        experience_ids: strings("experienceIds"),
        memory_sections,
    })
}

/// Creates a session in `project` and returns its id.
pub async fn new_session(client: &ApiClient, project: &str) -> Result<String, EvalError> {
    let created = client
        .post(
            &format!("/api/projects/{}/sessions", encode(project)),
            &json!({}),
        )
        .await
        .map_err(|e| EvalError::cli(e.into()))?;
    created
        .get("id")
        .and_then(|v| v.as_str())
        .map(str::to_owned)
        .ok_or_else(|| EvalError::Store(String::from("the session route answered without an id")))
}

//! Projects, sessions and messages: the durable sources learning reads.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Project {
    pub id: String,
    pub name: String,
    pub worktree: Option<String>,
    pub created_at: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Session {
    pub id: String,
    pub project_id: String,
    pub parent_id: Option<String>,
    pub title: Option<String>,
    pub model: Option<String>,
    pub external_ref: Option<String>,
    pub created_at: i64,
}

zuno_queue::text_enum! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum Role {
        User = "user",
        Assistant = "assistant",
        System = "system",
    }
}

zuno_queue::text_enum! {
    /// An assistant message's completion status. User and system messages are `completed`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum MessageStatus {
        InProgress = "in_progress",
        Completed = "completed",
        Failed = "failed",
        Truncated = "truncated",
        PendingTools = "pending_tools",
    }
}

impl MessageStatus {
    /// True when the message ended a turn (successfully or not).
    pub fn ends_turn(self) -> bool {
        self != MessageStatus::InProgress
    }
}

zuno_queue::text_enum! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum ToolStatus {
        Pending = "pending",
        Completed = "completed",
        Error = "error",
    }
}

/// One part of a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Part {
    Text {
        text: String,
        /// Set by Zuno's own clients on sections Zuno injected (context, hook
        /// `additionalContext`, memory tool results). Injected text is never a learning source.
        #[serde(default)]
        injected: bool,
    },
    ToolCall {
        #[serde(rename = "toolName")]
        #[schema(min_length = 1, max_length = 256)]
        tool_name: String,
        #[serde(rename = "callId", default)]
        call_id: Option<String>,
        /// The call's arguments as the tool received them: any JSON value (`null` when none
        /// were recorded).
        #[serde(default)]
        #[schema(value_type = serde_json::Value)]
        arguments: serde_json::Value,
        #[serde(default)]
        result: Option<String>,
        status: ToolStatus,
        /// The durable metadata bit for a successful Web or MCP result (external context, which
        /// `learning.post_turn.disable_on_external_context` excludes a session for): set by the
        /// host from tool metadata, never inferred from text.
        #[serde(rename = "externalContext", default)]
        external_context: bool,
        #[serde(default)]
        injected: bool,
    },
    Artifact {
        name: String,
        #[serde(default)]
        uri: Option<String>,
        #[serde(default)]
        text: Option<String>,
    },
    Error {
        text: String,
    },
}

impl Part {
    pub fn kind(&self) -> &'static str {
        match self {
            Part::Text { .. } => "text",
            Part::ToolCall { .. } => "tool_call",
            Part::Artifact { .. } => "artifact",
            Part::Error { .. } => "error",
        }
    }

    pub fn is_injected(&self) -> bool {
        matches!(
            self,
            Part::Text { injected: true, .. } | Part::ToolCall { injected: true, .. }
        )
    }

    /// SHA-256 over the part's canonical JSON: changes whenever any content field changes.
    pub fn content_digest(&self) -> String {
        let canonical = serde_json::to_vec(self).unwrap_or_default();
        hex::encode(Sha256::digest(&canonical))
    }

    /// The human-visible text of the part, if it has any.
    pub fn text(&self) -> Option<&str> {
        match self {
            Part::Text { text, .. } | Part::Error { text } => Some(text),
            Part::Artifact { text, .. } => text.as_deref(),
            Part::ToolCall { result, .. } => result.as_deref(),
        }
    }
}

/// A stored message with its parts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    pub id: String,
    pub session_id: String,
    pub seq: i64,
    pub role: Role,
    pub status: MessageStatus,
    pub revision: i64,
    pub created_at: i64,
    pub completed_at: Option<i64>,
    pub parts: Vec<StoredPart>,
}

#[cfg(test)]
impl Message {
    /// A message of session `s` at seq 1, revision 1, with `parts` in order: what the unit tests
    /// of turn readers (eligibility, manifests, rules) build their turns from.
    pub(crate) fn sample(id: &str, role: Role, status: MessageStatus, parts: Vec<Part>) -> Self {
        Message {
            id: id.into(),
            session_id: "s".into(),
            seq: 1,
            role,
            status,
            revision: 1,
            created_at: 0,
            completed_at: None,
            parts: parts
                .into_iter()
                .enumerate()
                .map(|(ordinal, part)| StoredPart {
                    ordinal: ordinal as i64,
                    content_digest: part.content_digest(),
                    part,
                })
                .collect(),
        }
    }
}

/// A part with its stored digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoredPart {
    pub ordinal: i64,
    #[serde(flatten)]
    pub part: Part,
    pub content_digest: String,
}

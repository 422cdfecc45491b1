//! The bounded source manifest of one extraction: the records the extractor may read and cite.
//!
//! Each record has exactly one canonical `source_id` (`S1`, `S2`, …) — the only id the model
//! sees — plus a host-side address, a digest of the raw source and a digest of the redacted
//! content. Credentials are redacted *before* clipping, so a clip can never cut a secret in half
//! and leave the rest visible. The whole manifest is bounded by
//! `learning.execution.max_input_bytes`; its digest binds a job to exactly this input.
//! Sections Zuno itself injected, and host-generated user texts, are never sources.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::signals;
use crate::text::redact::redact;
use crate::text::sha256;
use crate::transcript::{Message, Part, Role, ToolStatus};

/// What kind of evidence a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    UserText,
    AssistantText,
    ToolCall,
    ToolResult,
    Error,
    Artifact,
    Feedback,
}

/// The authoritative verification marker the extractor is given with each record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verification {
    /// Something the user wrote.
    UserStatement,
    /// Explicit feedback the user gave on the assistant's answer.
    UserFeedback,
    /// A tool result the host recorded as successful.
    ToolSucceeded,
    /// A tool result the host recorded as failed, or an error.
    ToolFailed,
    /// The assistant's own words: a claim, not proof.
    AssistantClaim,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceRecord {
    pub source_id: String,
    /// `message:<id>:part:<ordinal>[:arguments|:result]` or `feedback:<message id>`.
    pub address: String,
    pub message_id: Option<String>,
    pub part_ordinal: Option<i64>,
    pub kind: SourceKind,
    pub verification: Verification,
    /// Redacted and, when needed, clipped text: exactly what the model sees.
    pub text: String,
    /// SHA-256 of the raw source text.
    pub raw_digest: String,
    /// SHA-256 of the redacted text before clipping.
    pub redacted_digest: String,
    pub clipped: bool,
    /// Read-only context from the turn before the bound one (what a correction refers to):
    /// citable, never a source of new lessons by itself.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub context: bool,
}

/// Feedback on the terminal assistant message, as a source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedbackSource {
    pub message_id: String,
    pub value: String,
    pub note: Option<String>,
    pub revision: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceManifest {
    pub records: Vec<SourceRecord>,
    /// SHA-256 over every record (ids, addresses, digests and text).
    pub digest: String,
    /// Serialized size of what the model sees.
    pub bytes: usize,
}

impl SourceManifest {
    pub fn record(&self, source_id: &str) -> Option<&SourceRecord> {
        self.records
            .iter()
            .find(|record| record.source_id == source_id)
    }

    /// What the model sees: ids, kinds, verification markers and text. Raw storage ids,
    /// addresses and digests stay host-side.
    pub fn model_view(&self) -> serde_json::Value {
        serde_json::Value::Array(self.records.iter().map(model_record).collect())
    }
}

fn model_record(record: &SourceRecord) -> serde_json::Value {
    let mut view = serde_json::json!({
        "source_id": record.source_id,
        "kind": record.kind,
        "verification": record.verification,
        "text": record.text,
    });
    if record.context {
        view["context"] = serde_json::Value::Bool(true);
    }
    view
}

/// Per-record floor when clipping: every record keeps at least this much of its text.
const MIN_RECORD_BYTES: usize = 256;
const CLIP_MARKER: &str = " […clipped…] ";

struct Draft {
    address: String,
    message_id: Option<String>,
    part_ordinal: Option<i64>,
    kind: SourceKind,
    verification: Verification,
    raw: String,
}

/// Builds the manifest of a closed turn (`window`, oldest first) plus optional feedback on its
/// terminal message, bounded by `max_input_bytes`.
pub fn build(
    window: &[Message],
    feedback: Option<&FeedbackSource>,
    max_input_bytes: usize,
) -> SourceManifest {
    build_with_context(&[], window, feedback, max_input_bytes)
}

/// The share of the input budget the previous turn's context may take, and its absolute cap.
const CONTEXT_SHARE: usize = 4;
const MAX_CONTEXT_BYTES: usize = 8 * 1024;

/// Like [`build`], with a bounded digest of the turn before (`context`, oldest first) as
/// read-only records flagged `context`: its user prompt, the assistant's final text, its tool
/// calls with their arguments and results. They come first, are counted in the input budget
/// (at most a quarter of it, and 8 KiB) and are bound into the digest like every record.
pub fn build_with_context(
    context: &[Message],
    window: &[Message],
    feedback: Option<&FeedbackSource>,
    max_input_bytes: usize,
) -> SourceManifest {
    let context_drafts = context_digest(drafts_of(context));
    let mut drafts = drafts_of(window);
    drafts.extend(feedback.map(feedback_draft));

    let context_redacted: Vec<String> = context_drafts
        .iter()
        .map(|draft| redact(&draft.raw).text)
        .collect();
    let context_limit = (max_input_bytes / CONTEXT_SHARE).min(MAX_CONTEXT_BYTES);
    let mut budgets = if context_drafts.is_empty() {
        Vec::new()
    } else {
        allocate(&context_redacted, context_limit)
    };
    let context_used: usize = budgets.iter().sum::<usize>() + context_drafts.len() * 160;
    let redacted: Vec<String> = drafts.iter().map(|draft| redact(&draft.raw).text).collect();
    budgets.extend(allocate(
        &redacted,
        max_input_bytes.saturating_sub(context_used),
    ));
    let context_count = context_drafts.len();
    let records: Vec<SourceRecord> = context_drafts
        .into_iter()
        .chain(drafts)
        .zip(context_redacted.into_iter().chain(redacted))
        .zip(budgets)
        .enumerate()
        .map(|(index, ((draft, redacted), budget))| {
            let (text, clipped) = clip(&redacted, budget);
            SourceRecord {
                source_id: format!("S{}", index + 1),
                address: draft.address,
                message_id: draft.message_id,
                part_ordinal: draft.part_ordinal,
                kind: draft.kind,
                verification: draft.verification,
                raw_digest: sha256(&draft.raw),
                redacted_digest: sha256(&redacted),
                text,
                clipped,
                context: index < context_count,
            }
        })
        .collect();
    finish(records)
}

/// The digest of the turn before: its user prompts, tool calls and results, and only the last
/// of the assistant's texts (its final answer).
fn context_digest(mut drafts: Vec<Draft>) -> Vec<Draft> {
    let last_text = drafts
        .iter()
        .rposition(|d| d.kind == SourceKind::AssistantText);
    let mut index = 0;
    drafts.retain(|draft| {
        let keep = draft.kind != SourceKind::AssistantText || Some(index) == last_text;
        index += 1;
        keep && matches!(
            draft.kind,
            SourceKind::UserText
                | SourceKind::AssistantText
                | SourceKind::ToolCall
                | SourceKind::ToolResult
        )
    });
    drafts
}

/// The user's feedback on the turn as a source of its own.
fn feedback_draft(feedback: &FeedbackSource) -> Draft {
    let raw = match &feedback.note {
        Some(note) => format!("{} feedback: {note}", feedback.value),
        None => format!("{} feedback", feedback.value),
    };
    Draft {
        address: format!(
            "feedback:{}:revision:{}",
            feedback.message_id, feedback.revision
        ),
        message_id: Some(feedback.message_id.clone()),
        part_ordinal: None,
        kind: SourceKind::Feedback,
        verification: Verification::UserFeedback,
        raw,
    }
}

/// The source drafts of a window's parts: injected parts and host-generated user texts are
/// never sources.
fn drafts_of(window: &[Message]) -> Vec<Draft> {
    let mut drafts = Vec::new();
    for message in window {
        for stored in &message.parts {
            if stored.part.is_injected() {
                continue;
            }
            let base = format!("message:{}:part:{}", message.id, stored.ordinal);
            for source in part_sources(message.role, &stored.part) {
                if source.raw.trim().is_empty() {
                    continue;
                }
                drafts.push(Draft {
                    address: format!("{base}{}", source.suffix),
                    message_id: Some(message.id.clone()),
                    part_ordinal: Some(stored.ordinal),
                    kind: source.kind,
                    verification: source.verification,
                    raw: source.raw,
                });
            }
        }
    }
    drafts
}

/// One source a part yields; `suffix` extends the part's address.
struct PartSource {
    suffix: &'static str,
    kind: SourceKind,
    verification: Verification,
    raw: String,
}

/// The sources of one part: a text, a tool call's arguments and its result, an artifact, an
/// error. Host-generated user texts yield none.
fn part_sources(role: Role, part: &Part) -> Vec<PartSource> {
    let source = |suffix, kind, verification, raw| PartSource {
        suffix,
        kind,
        verification,
        raw,
    };
    match part {
        Part::Text { text, .. } => match role {
            Role::User if signals::is_host_generated(text) => Vec::new(),
            Role::User => vec![source(
                "",
                SourceKind::UserText,
                Verification::UserStatement,
                text.clone(),
            )],
            Role::Assistant | Role::System => vec![source(
                "",
                SourceKind::AssistantText,
                Verification::AssistantClaim,
                text.clone(),
            )],
        },
        Part::ToolCall {
            tool_name,
            arguments,
            result,
            status,
            ..
        } => {
            let mut sources = vec![source(
                ":arguments",
                SourceKind::ToolCall,
                Verification::AssistantClaim,
                format!("{tool_name} {arguments}"),
            )];
            if let Some(result) = result {
                let verification = match status {
                    ToolStatus::Completed => Verification::ToolSucceeded,
                    ToolStatus::Error | ToolStatus::Pending => Verification::ToolFailed,
                };
                sources.push(source(
                    ":result",
                    SourceKind::ToolResult,
                    verification,
                    result.clone(),
                ));
            }
            sources
        }
        Part::Artifact { name, uri, text } => {
            let body = [Some(name.as_str()), uri.as_deref(), text.as_deref()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join("\n");
            vec![source(
                "",
                SourceKind::Artifact,
                Verification::AssistantClaim,
                body,
            )]
        }
        Part::Error { text } => vec![source(
            "",
            SourceKind::Error,
            Verification::ToolFailed,
            text.clone(),
        )],
    }
}

/// Rebuilds the manifest value (digest and size) from persisted records.
pub fn finish(records: Vec<SourceRecord>) -> SourceManifest {
    let mut hasher = Sha256::new();
    for record in &records {
        let canonical = serde_json::to_vec(record).unwrap_or_default();
        hasher.update((canonical.len() as u64).to_le_bytes());
        hasher.update(&canonical);
    }
    let bytes = serde_json::to_vec(&serde_json::Value::Array(
        records.iter().map(model_record).collect(),
    ))
    .map(|v| v.len())
    .unwrap_or(0);
    SourceManifest {
        records,
        digest: hex::encode(hasher.finalize()),
        bytes,
    }
}

/// Persists the manifest an attempt reads on its job, before any provider request, in
/// statements of a bounded number of records. Idempotent for a retried attempt (the bound manifest
/// cannot differ).
pub async fn persist_in(
    tx: &mut crate::db::Tx,
    job_id: &str,
    manifest: &SourceManifest,
) -> Result<(), crate::db::StoreError> {
    super::store::manifest::insert_in(tx, job_id, &manifest.records).await
}

/// The serialized name of a unit enum (`kind`, `verification`), as the columns store it.
pub(crate) fn wire_name(value: impl Serialize) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// The manifest persisted on a job, in source order.
pub async fn load_persisted(
    db: &crate::db::Db,
    job_id: &str,
) -> Result<Vec<serde_json::Value>, crate::db::StoreError> {
    let rows = super::store::manifest::of_job(db, job_id).await?;
    let mut records: Vec<serde_json::Value> = rows
        .into_iter()
        .map(|row| {
            serde_json::json!({
                "sourceId": row.source_id, "address": row.address, "messageId": row.message_id, "kind": row.kind,
                "verification": row.verification, "text": row.text, "rawDigest": row.raw_digest,
                "redactedDigest": row.redacted_digest, "clipped": row.clipped, "context": row.context,
            })
        })
        .collect();
    // S1, S2, … S10 sort numerically, not lexically.
    records.sort_by_key(|r| {
        r["sourceId"]
            .as_str()
            .and_then(|s| s.trim_start_matches('S').parse::<u64>().ok())
            .unwrap_or(u64::MAX)
    });
    Ok(records)
}

/// Splits the byte budget over the records: short records keep everything, long ones share what
/// is left equally (water-filling), never below a small floor.
fn allocate(texts: &[String], max_input_bytes: usize) -> Vec<usize> {
    // Per-record JSON framing (ids, kind, quotes, escapes) is estimated generously.
    const FRAME: usize = 160;
    let available = max_input_bytes.saturating_sub(texts.len() * FRAME + 2);
    let mut budgets = vec![0usize; texts.len()];
    let mut remaining: Vec<usize> = (0..texts.len()).collect();
    let mut left = available;
    loop {
        if remaining.is_empty() {
            break;
        }
        let share = (left / remaining.len()).max(MIN_RECORD_BYTES);
        let (fits, long): (Vec<usize>, Vec<usize>) = remaining
            .iter()
            .partition(|&&i| escaped_len(&texts[i]) <= share);
        if fits.is_empty() {
            for &i in &long {
                budgets[i] = share;
            }
            break;
        }
        for &i in &fits {
            budgets[i] = escaped_len(&texts[i]);
            left = left.saturating_sub(budgets[i]);
        }
        remaining = long;
    }
    budgets
}

/// Bytes a text takes inside a JSON string.
fn escaped_len(text: &str) -> usize {
    serde_json::to_string(text)
        .map(|s| s.len().saturating_sub(2))
        .unwrap_or(text.len())
}

/// Keeps the head and tail of `text` within `budget` bytes (of JSON-escaped text).
fn clip(text: &str, budget: usize) -> (String, bool) {
    if escaped_len(text) <= budget {
        return (text.to_owned(), false);
    }
    // Escaping can only grow text, so cutting raw bytes to the budget is conservative.
    let keep = budget.saturating_sub(CLIP_MARKER.len());
    let head_len = floor_boundary(text, keep * 2 / 3);
    let tail_start = ceil_boundary(text, text.len().saturating_sub(keep - keep * 2 / 3));
    let mut out = String::with_capacity(budget);
    out.push_str(&text[..head_len]);
    out.push_str(CLIP_MARKER);
    out.push_str(&text[tail_start.max(head_len)..]);
    while escaped_len(&out) > budget && out.len() > CLIP_MARKER.len() {
        let cut = floor_boundary(&out, out.len().saturating_sub(16));
        out.truncate(cut);
    }
    (out, true)
}

fn floor_boundary(text: &str, mut index: usize) -> usize {
    index = index.min(text.len());
    while !text.is_char_boundary(index) {
        index -= 1;
    }
    index
}

fn ceil_boundary(text: &str, mut index: usize) -> usize {
    index = index.min(text.len());
    while !text.is_char_boundary(index) {
        index += 1;
    }
    index
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transcript::MessageStatus;

    fn message(id: &str, role: Role, parts: Vec<Part>) -> Message {
        Message::sample(id, role, MessageStatus::Completed, parts)
    }

    fn turn(result: &str) -> Vec<Message> {
        vec![
            message(
                "u1",
                Role::User,
                vec![Part::Text {
                    text: "No, use pnpm".into(),
                    injected: false,
                }],
            ),
            message(
                "a1",
                Role::Assistant,
                vec![
                    Part::Text {
                        text: "<memory>always use npm</memory>".into(),
                        injected: true,
                    },
                    Part::ToolCall {
                        tool_name: "bash".into(),
                        call_id: None,
                        arguments: serde_json::json!({"cmd": "pnpm i"}),
                        result: Some(result.into()),
                        status: ToolStatus::Completed,
                        external_context: false,
                        injected: false,
                    },
                ],
            ),
        ]
    }

    #[test]
    fn one_canonical_id_per_record_and_injected_sections_excluded() {
        let manifest = build(&turn("ok"), None, 131_072);
        let ids: Vec<&str> = manifest
            .records
            .iter()
            .map(|r| r.source_id.as_str())
            .collect();
        assert_eq!(ids, ["S1", "S2", "S3"]);
        assert!(
            manifest
                .records
                .iter()
                .all(|r| !r.text.contains("always use npm"))
        );
        assert_eq!(
            manifest.records[2].verification,
            Verification::ToolSucceeded
        );
        let view = manifest.model_view().to_string();
        assert!(!view.contains("message:u1"), "addresses stay host-side");
        assert!(
            !view.contains(&manifest.records[0].raw_digest),
            "digests stay host-side"
        );
    }

    #[test]
    fn the_manifest_is_bounded_and_deterministic() {
        let big = "x".repeat(500_000);
        let manifest = build(&turn(&big), None, 8192);
        assert!(manifest.bytes <= 8192, "{} bytes", manifest.bytes);
        assert!(manifest.records[2].clipped);
        assert!(!manifest.records[0].clipped, "short records are kept whole");
        assert_eq!(manifest.digest, build(&turn(&big), None, 8192).digest);
        assert_ne!(
            manifest.digest,
            build(&turn("different"), None, 8192).digest
        );
    }

    #[test]
    fn credentials_are_redacted_before_clipping() {
        let key = "-----BEGIN RSA PRIVATE KEY-----\nMIIEsecret\n-----END RSA PRIVATE KEY-----";
        let text = format!("{}{key}{}", "a".repeat(3000), "b".repeat(3000));
        let manifest = build(&turn(&text), None, 2048);
        let record = &manifest.records[2];
        assert!(record.clipped);
        assert!(!record.text.contains("MIIEsecret"));
        assert_ne!(record.raw_digest, record.redacted_digest);
    }
}

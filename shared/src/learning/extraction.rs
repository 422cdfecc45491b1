//! The extractor's output contract, shared by the model extractor, the rules extractor and
//! validation. The same JSON schema is given to the model (in the prompt, or natively).

use serde::{Deserialize, Serialize};

pub use crate::memory::MemoryAction;

zuno_queue::text_enum! {
    /// What an experience records.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum ExperienceKind {
        Outcome = "outcome",
        Problem = "problem",
        Correction = "correction",
        Feedback = "feedback",
        VerifiedProcedure = "verified_procedure",
        /// Durable evidence of something not solved yet; never Memory, pattern or evaluation
        /// evidence.
        UnresolvedIssue = "unresolved_issue",
    }
}

/// One citation: a source the extractor was given and an exact excerpt of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Citation {
    pub source_id: String,
    pub excerpt: String,
}

/// One experience as the extractor proposes it (untrusted until validated).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProposedExperience {
    pub kind: ExperienceKind,
    pub title: String,
    pub summary: String,
    #[serde(default)]
    pub resolution: Option<String>,
    #[serde(default)]
    pub citations: Vec<Citation>,
    /// A probability in [0, 1]; anything else fails the whole job.
    pub confidence: f64,
    /// Retrieval keywords (tools, commands, files, the situation): searched, never rendered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keywords: Vec<String>,
}

zuno_queue::text_enum! {
    /// Where a memory hint would apply.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum MemoryTarget {
        Global = "global",
        Project = "project",
    }
}

/// A raw memory hint: a suggestion for the maintenance stage, citing one of this extraction's
/// experiences by ordinal. It never changes resident Memory by itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProposedMemoryHint {
    pub experience_ordinal: i64,
    pub target: MemoryTarget,
    pub action: MemoryAction,
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default)]
    pub old_text: Option<String>,
    pub reason: String,
    pub confidence: f64,
}

/// The whole extractor answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExtractionOutput {
    #[serde(default)]
    pub experiences: Vec<ProposedExperience>,
    #[serde(default)]
    pub memories: Vec<ProposedMemoryHint>,
}

/// The JSON schema of [`ExtractionOutput`], given to the model.
pub fn output_schema() -> serde_json::Value {
    let kinds: Vec<&str> = ExperienceKind::ALL.iter().map(|k| k.as_str()).collect();
    serde_json::json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["experiences", "memories"],
        "properties": {
            "experiences": {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["kind", "title", "summary", "resolution", "citations", "confidence", "keywords"],
                    "properties": {
                        "kind": { "type": "string", "enum": kinds },
                        "title": { "type": "string" },
                        "summary": { "type": "string" },
                        "resolution": { "type": ["string", "null"] },
                        "citations": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "additionalProperties": false,
                                "required": ["source_id", "excerpt"],
                                "properties": {
                                    "source_id": { "type": "string" },
                                    "excerpt": { "type": "string" }
                                }
                            }
                        },
                        "confidence": { "type": "number", "minimum": 0, "maximum": 1 },
                        "keywords": { "type": "array", "items": { "type": "string" } }
                    }
                }
            },
            "memories": {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["experience_ordinal", "target", "action", "content", "old_text", "reason", "confidence"],
                    "properties": {
                        "experience_ordinal": { "type": "integer", "minimum": 0 },
                        "target": { "type": "string", "enum": ["global", "project"] },
                        "action": { "type": "string", "enum": ["add", "replace", "remove"] },
                        "content": { "type": ["string", "null"] },
                        "old_text": { "type": ["string", "null"] },
                        "reason": { "type": "string" },
                        "confidence": { "type": "number", "minimum": 0, "maximum": 1 }
                    }
                }
            }
        }
    })
}

//! Resident Memory: authoritative entries in the database and their Markdown projections.

pub mod audit;
pub mod consolidate;
pub mod dedupe;
pub mod maintenance;
pub mod markdown;
pub mod service;
pub mod store;
pub mod write_check;

use serde::{Deserialize, Serialize};

/// What a change does to a Memory document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MemoryAction {
    Add,
    Replace,
    Remove,
}

impl MemoryAction {
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryAction::Add => "add",
            MemoryAction::Replace => "replace",
            MemoryAction::Remove => "remove",
        }
    }
}

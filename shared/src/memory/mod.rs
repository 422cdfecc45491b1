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

zuno_queue::text_enum! {
    /// What a change does to a Memory document.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum MemoryAction {
        Add = "add",
        Replace = "replace",
        Remove = "remove",
    }
}

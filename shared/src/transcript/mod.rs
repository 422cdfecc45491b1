//! Projects, sessions and messages with their parts: what hosts send and learning reads.

pub mod import;
mod model;
mod store;

pub use model::{Message, MessageStatus, Part, Project, Role, Session, StoredPart, ToolStatus};
pub use store::{
    NewMessage, NewProject, NewSession, TranscriptError, TranscriptStore, session_model_in,
    session_project_in,
};

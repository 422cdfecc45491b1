//! Projects, sessions and messages with their parts: what hosts send and learning reads.

mod model;
mod store;

pub use model::{Message, MessageStatus, Part, Project, Role, Session, StoredPart, ToolStatus};
pub use store::{NewMessage, NewProject, NewSession, TranscriptError, TranscriptStore};

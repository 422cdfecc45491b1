//! The HTTP API: ingestion of projects, sessions and messages; admission of extraction jobs when
//! turns close; job inspection; health, readiness, metrics and the OpenAPI document.

pub mod auth;
mod dashboard;
pub mod error;
pub mod guard;
pub mod json;
mod live_hub;
mod middleware;
mod openapi;
pub mod router;
mod routes;
pub mod state;
pub mod transport;
pub mod worktree;

pub use openapi::openapi_document;
pub use router::router;
pub use state::AppState;

//! What a caller may see: a project or session of another scope answers 404, exactly as one
//! that does not exist, so a scoped token cannot even learn that it exists.

use zuno_shared::transcript::Session;

use crate::http::auth::Caller;
use crate::http::error::ApiResult;
use crate::http::state::AppState;

/// Checks that the project exists and the caller may see it.
pub async fn visible_project(state: &AppState, caller: &Caller, project_id: &str) -> ApiResult<()> {
    caller.require(project_id, "project", project_id)?;
    state.transcripts.project(project_id).await?;
    Ok(())
}

/// Loads a session the caller may see (404 otherwise).
pub async fn visible_session(
    state: &AppState,
    caller: &Caller,
    session_id: &str,
) -> ApiResult<Session> {
    let session = state.transcripts.session(session_id).await?;
    caller.require(&session.project_id, "session", session_id)?;
    Ok(session)
}

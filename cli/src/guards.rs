//! `zuno guards list|test|approve|reject|disable|enable`: the guards compiled from a project's
//! Memory, what they would stop, and a person's decisions on them.

use serde_json::json;

use crate::client::{ApiClient, encode};
use crate::error::CliError;
use crate::global::GlobalArgs;
use crate::learn::{Common, print, project};

#[derive(Debug, clap::Subcommand)]
pub enum GuardsAction {
    /// The project's guards and the global ones.
    List {
        /// Only guards in this state (pending, active, disabled, rejected, retired).
        #[arg(long)]
        state: Option<String>,
    },
    /// Which guards would stop a shell command (or, with --path, an edit of a file).
    Test {
        /// The command line, as the agent would run it.
        #[arg(required_unless_present = "path")]
        command: Option<String>,
        /// A path relative to the worktree, as an edit would touch it.
        #[arg(long, conflicts_with = "command")]
        path: Option<String>,
    },
    /// Approve a pending guard: the hooks enforce it from now on.
    Approve { guard_id: String },
    /// Reject a pending guard: it is never proposed again.
    Reject { guard_id: String },
    /// Disable a guard.
    Disable { guard_id: String },
    /// Enable a disabled guard.
    Enable { guard_id: String },
}

pub async fn run(
    global: &GlobalArgs,
    common: Common,
    action: GuardsAction,
) -> Result<(), CliError> {
    let client = ApiClient::connect(global, &common.server).await?;
    let p = encode(&project(&common)?);
    let decide = |id: &str, verb: &str| format!("/api/guards/{}/{verb}", encode(id));
    let answer = match action {
        GuardsAction::List { state } => {
            let query = state.map_or_else(String::new, |s| format!("?state={}", encode(&s)));
            client
                .get(&format!("/api/projects/{p}/guards{query}"))
                .await
        }
        GuardsAction::Test { command, path } => {
            client
                .post(
                    &format!("/api/projects/{p}/guards/test"),
                    &json!({ "command": command, "path": path }),
                )
                .await
        }
        GuardsAction::Approve { guard_id } => {
            client.post(&decide(&guard_id, "approve"), &json!({})).await
        }
        GuardsAction::Reject { guard_id } => {
            client.post(&decide(&guard_id, "reject"), &json!({})).await
        }
        GuardsAction::Disable { guard_id } => {
            client.post(&decide(&guard_id, "disable"), &json!({})).await
        }
        GuardsAction::Enable { guard_id } => {
            client.post(&decide(&guard_id, "enable"), &json!({})).await
        }
    }?;
    print(&answer, common.json);
    Ok(())
}

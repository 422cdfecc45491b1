//! `zuno projects list|unbind|rebind|delete`: the projects the server knows and the worktrees
//! they are bound to. Unbinding, moving and deleting are the user's acts: they need the local
//! token (the default for a server on this machine) or a token created with `--user`.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::{Value, json};

use crate::client::{ApiClient, ServerArgs, encode};
use crate::error::CliError;
use crate::global::GlobalArgs;

#[derive(Debug, clap::Args)]
pub struct ProjectsArgs {
    #[command(subcommand)]
    pub command: ProjectsCommand,
    /// Print the API's JSON answer.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

#[derive(Debug, Subcommand)]
pub enum ProjectsCommand {
    /// List the projects with their worktrees.
    List,
    /// Unbind a project's worktree: Zuno stops writing there; nothing on disk changes.
    Unbind { project: String },
    /// Bind a project to a directory, or move it there (relative paths are taken from the
    /// current directory). The directory must lie inside the server's worktree roots, overlap
    /// no other project's worktree and not be a sensitive directory.
    Rebind { project: String, worktree: PathBuf },
    /// Delete a project with its sessions, Experience, Memory, Skill candidates and jobs
    /// (files in its worktree stay).
    Delete {
        project: String,
        /// Really delete (without it, the command only says what would go).
        #[arg(long)]
        yes: bool,
    },
}

pub async fn run(global: &GlobalArgs, args: ProjectsArgs) -> Result<(), CliError> {
    let client = ApiClient::connect(global, &args.server).await?;
    let path = |project: &str| format!("/api/projects/{}", encode(project));
    let answer = match args.command {
        ProjectsCommand::List => {
            let projects = client.get("/api/projects").await?;
            if !args.json {
                print_list(&projects);
                return Ok(());
            }
            projects
        }
        ProjectsCommand::Unbind { project } => {
            client
                .delete(&format!("{}/worktree", path(&project)))
                .await?
        }
        ProjectsCommand::Rebind { project, worktree } => {
            let worktree = std::path::absolute(&worktree).map_err(|error| {
                CliError::new(
                    CliError::BAD_INPUT,
                    format!("{}: {error}", worktree.display()),
                )
            })?;
            client
                .put(
                    &format!("{}/worktree", path(&project)),
                    &json!({ "worktree": worktree }),
                )
                .await?
        }
        ProjectsCommand::Delete { project, yes } => {
            if !yes {
                let found = client.get(&path(&project)).await?;
                return Err(CliError::new(
                    CliError::BAD_INPUT,
                    format!(
                        "this deletes project `{project}` (worktree {}) with its sessions, \
                         Experience, Memory, Skill candidates and jobs; pass --yes to delete it",
                        found
                            .get("worktree")
                            .and_then(Value::as_str)
                            .unwrap_or("none")
                    ),
                ));
            }
            client.delete(&path(&project)).await?
        }
    };
    crate::learn::print(&answer, args.json);
    Ok(())
}

/// One project a line: id, worktree (`-` for none), name.
fn print_list(projects: &Value) {
    for project in projects.as_array().into_iter().flatten() {
        let field = |name: &str| project.get(name).and_then(Value::as_str).unwrap_or("-");
        println!("{}\t{}\t{}", field("id"), field("worktree"), field("name"));
    }
}

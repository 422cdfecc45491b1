//! `zuno tokens`: API tokens with a scope. A token reaches the projects it names (which must
//! exist, unless `--allow-create` lets it create them) and, separately, global Memory at the
//! access `--global` grants; `--user` marks it as the user's own (it may state
//! `origin: "user"` and bind worktrees).

use clap::Subcommand;
use zuno_shared::clock::system_clock;
use zuno_shared::db::Db;
use zuno_shared::tokens::{GlobalAccess, NewToken, TokenStore};
use zuno_shared::transcript::{TranscriptError, TranscriptStore};

use crate::error::CliError;
use crate::global::GlobalArgs;
use crate::global::open_local;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GlobalArg {
    /// No access to global Memory (the default).
    None,
    /// Read global Memory, its candidates, revisions and file.
    Read,
    /// Also change global Memory: propose, approve, reject, undo, import.
    Write,
}

impl From<GlobalArg> for GlobalAccess {
    fn from(value: GlobalArg) -> GlobalAccess {
        match value {
            GlobalArg::None => GlobalAccess::None,
            GlobalArg::Read => GlobalAccess::Read,
            GlobalArg::Write => GlobalAccess::Write,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum TokensCommand {
    /// Create a token; prints the secret once.
    Create {
        #[arg(long)]
        name: String,
        /// A project the token may reach (repeatable; at least one).
        #[arg(long = "project", required = true)]
        projects: Vec<String>,
        /// Access to global Memory (`--global` alone means `write`).
        #[arg(long, value_enum, default_value_t = GlobalArg::None, num_args = 0..=1,
            default_missing_value = "write")]
        global: GlobalArg,
        /// The token acts for the user: it may state `origin: "user"` on Memory changes and bind
        /// project worktrees.
        #[arg(long)]
        user: bool,
        /// Allow naming projects that do not exist yet (the token may then create them).
        #[arg(long)]
        allow_create: bool,
    },
    /// List tokens (never their secrets).
    List,
    /// Revoke a token by id.
    Revoke { id: String },
}

pub async fn run(global: &GlobalArgs, command: TokensCommand) -> Result<(), CliError> {
    let settings = global.settings()?;
    let db = open_local(&settings).await?;
    let store = TokenStore::new(db.clone(), system_clock());
    match command {
        TokensCommand::Create {
            name,
            projects,
            global: global_access,
            user,
            allow_create,
        } => {
            check_token_projects(&db, &projects, allow_create).await?;
            let (info, secret) = store
                .create_with(&NewToken {
                    name,
                    projects,
                    global: GlobalAccess::from(global_access),
                    user,
                })
                .await?;
            println!("{secret}");
            eprintln!(
                "created token {} for projects [{}], global Memory: {}{}",
                info.id,
                info.projects.join(", "),
                info.global.as_str(),
                if info.user { ", acts for the user" } else { "" }
            );
        }
        TokensCommand::List => {
            for token in store.list().await? {
                let state = if token.revoked_at.is_some() {
                    "revoked"
                } else {
                    "active"
                };
                println!(
                    "{}  {:<20} {:<8} global:{:<5} {:<5} {}",
                    token.id,
                    token.name,
                    state,
                    token.global.as_str(),
                    if token.user { "user" } else { "" },
                    token.projects.join(",")
                );
            }
        }
        TokensCommand::Revoke { id } => {
            if !store.revoke(&id).await? {
                return Err(CliError::new(
                    CliError::NOT_FOUND,
                    format!("no active token `{id}`"),
                ));
            }
            println!("revoked {id}");
        }
    }
    Ok(())
}

/// A new token names at least one valid project id, and each project exists unless the token
/// may create it.
async fn check_token_projects(
    db: &Db,
    projects: &[String],
    allow_create: bool,
) -> Result<(), CliError> {
    // Global Memory is reached through a project's routes, so even a token for global Memory
    // names the projects it works from.
    if projects.is_empty() {
        return Err(CliError::new(
            CliError::BAD_INPUT,
            "a token needs at least one --project (global Memory is reached through a project's routes)",
        ));
    }
    if let Some(bad) = projects
        .iter()
        .find(|p| !zuno_shared::ids::is_valid_external_id(p))
    {
        return Err(CliError::new(
            CliError::BAD_INPUT,
            format!("invalid project id `{bad}`"),
        ));
    }
    if allow_create {
        return Ok(());
    }
    let transcripts = TranscriptStore::new(db.clone(), system_clock());
    for project in projects {
        match transcripts.project(project).await {
            Ok(_) => {}
            Err(TranscriptError::NotFound { .. }) => {
                return Err(CliError::new(
                    CliError::NOT_FOUND,
                    format!(
                        "project `{project}` does not exist; create it first, or pass --allow-create to let the token create it"
                    ),
                ));
            }
            Err(error) => return Err(CliError::new(CliError::FAILURE, error.to_string())),
        }
    }
    Ok(())
}

use clap::Subcommand;
use zuno_shared::clock::system_clock;
use zuno_shared::tokens::TokenStore;

use super::{CliError, GlobalArgs, open_local};

#[derive(Debug, Subcommand)]
pub enum TokensCommand {
    /// Create a token that can reach only the named projects; prints the secret once.
    Create {
        #[arg(long)]
        name: String,
        #[arg(long = "project", required = true)]
        projects: Vec<String>,
    },
    /// List tokens (never their secrets).
    List,
    /// Revoke a token by id.
    Revoke { id: String },
}

pub async fn run(global: &GlobalArgs, command: TokensCommand) -> Result<(), CliError> {
    let settings = global.settings()?;
    let store = TokenStore::new(open_local(&settings).await?, system_clock());
    match command {
        TokensCommand::Create { name, projects } => {
            if let Some(bad) = projects
                .iter()
                .find(|p| !zuno_shared::ids::is_valid_external_id(p))
            {
                return Err(CliError::new(
                    CliError::BAD_INPUT,
                    format!("invalid project id `{bad}`"),
                ));
            }
            let (info, secret) = store.create(&name, &projects).await?;
            println!("{secret}");
            eprintln!(
                "created token {} for projects {}",
                info.id,
                info.projects.join(", ")
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
                    "{}  {:<20} {:<8} {}",
                    token.id,
                    token.name,
                    state,
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

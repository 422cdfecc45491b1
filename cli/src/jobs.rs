use clap::Subcommand;
use zuno_shared::clock::system_clock;
use zuno_shared::ledger::{JobFilter, JobKind, JobState, Ledger};

use crate::error::CliError;
use crate::global::GlobalArgs;
use crate::global::open_local;

#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// List jobs, newest first.
    List {
        #[arg(long, value_parser = parse_kind)]
        kind: Option<JobKind>,
        #[arg(long, value_parser = parse_state)]
        state: Option<JobState>,
        #[arg(long, default_value_t = 50)]
        limit: i64,
        #[arg(long)]
        json: bool,
    },
    /// Show one job with its audit events.
    Show {
        id: String,
        #[arg(long)]
        json: bool,
    },
}

fn parse_kind(value: &str) -> Result<JobKind, String> {
    JobKind::parse(value).ok_or_else(|| {
        format!(
            "unknown job kind `{value}` (expected one of: {})",
            JobKind::ALL.map(JobKind::as_str).join(", ")
        )
    })
}

fn parse_state(value: &str) -> Result<JobState, String> {
    JobState::parse(value).ok_or_else(|| {
        format!(
            "unknown job state `{value}` (expected one of: {})",
            JobState::ALL.map(JobState::as_str).join(", ")
        )
    })
}

pub async fn run(global: &GlobalArgs, command: JobsCommand) -> Result<(), CliError> {
    let settings = global.settings()?;
    let db = open_local(&settings).await?;
    let ledger = Ledger::new(db, system_clock());
    match command {
        JobsCommand::List {
            kind,
            state,
            limit,
            json,
        } => list(&ledger, kind, state, limit, json).await,
        JobsCommand::Show { id, json } => show(&ledger, &id, json).await,
    }
}

async fn list(
    ledger: &Ledger,
    kind: Option<JobKind>,
    state: Option<JobState>,
    limit: i64,
    json: bool,
) -> Result<(), CliError> {
    if !(1..=1000).contains(&limit) {
        return Err(CliError::new(
            CliError::BAD_INPUT,
            "--limit must be between 1 and 1000",
        ));
    }
    let jobs = ledger
        .list(&JobFilter {
            kind,
            state,
            limit,
            ..JobFilter::default()
        })
        .await?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&jobs).unwrap_or_default()
        );
        return Ok(());
    }
    if jobs.is_empty() {
        println!("no jobs");
    }
    for job in jobs {
        println!(
            "{}  {:<17} {:<9} attempt {}/{}  {}",
            job.id,
            job.kind.as_str(),
            job.state.as_str(),
            job.attempts,
            job.max_attempts,
            job.last_error.as_deref().unwrap_or("")
        );
    }
    Ok(())
}

async fn show(ledger: &Ledger, id: &str, json: bool) -> Result<(), CliError> {
    let job = ledger.get(id).await?;
    let events = ledger.events(id).await?;
    if json {
        let value = serde_json::json!({ "job": job, "events": events });
        println!(
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        );
        return Ok(());
    }
    println!("job       {}", job.id);
    println!("kind      {}", job.kind);
    println!("state     {}", job.state);
    println!("origin    {}", job.origin.as_str());
    println!("attempts  {}/{}", job.attempts, job.max_attempts);
    if let Some(owner) = &job.lease_owner {
        println!(
            "lease     {} until {}",
            owner,
            job.lease_expires_at.unwrap_or_default()
        );
    }
    if let Some(error) = &job.last_error {
        println!("error     {error}");
    }
    if let Some(result) = &job.result {
        println!("result    {result}");
    }
    for event in events {
        println!(
            "event     {} {} {}",
            event.at,
            event.event,
            event.detail.unwrap_or_default()
        );
    }
    Ok(())
}

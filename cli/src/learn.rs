//! `zuno learn …`, `zuno reflect`, `zuno memory …` and `zuno memories`: the operator commands
//! (docs/operations.md lists them), each mapped to one API route (a running server when
//! configured, else the local database in-process). Human output by default, `--json` prints the
//! API's answer.
//! Exit codes: 2 bad input, 3 not found, 4 conflict, 5 server unavailable.

use clap::{Subcommand, ValueEnum};
use serde_json::{Value, json};

use crate::client::{ApiClient, ServerArgs, encode};
use crate::error::CliError;
use crate::global::GlobalArgs;

#[derive(Debug, Clone, clap::Args)]
pub struct Common {
    /// The project (default: derived from the working directory, as the hooks derive it).
    #[arg(long, global = true)]
    pub project: Option<String>,
    /// Print the API's JSON answer.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Target {
    Global,
    Project,
}

impl Target {
    fn as_str(self) -> &'static str {
        match self {
            Target::Global => "global",
            Target::Project => "project",
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum FeedbackArg {
    Positive,
    Negative,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ReflectArg {
    Turn,
    Session,
}

#[derive(Debug, Subcommand)]
pub enum LearnAction {
    /// Which extractor is active, queue and provider health, token use.
    Status,
    /// The project's experiences, 100 per page.
    List {
        #[arg(default_value_t = 0)]
        offset: i64,
    },
    /// One experience with its citations, validation state and usage.
    Get { experience_id: String },
    /// Admit (or return) the extraction of an assistant message.
    Reprocess { assistant_message_id: String },
    /// Re-admit legacy jobs (at most 32 per call).
    RepairHistory {
        #[arg(long)]
        dry_run: bool,
    },
    /// Queue the embedding of the project's experiences that have no vector yet (the optional
    /// semantic recall layer; needs `embeddings` in the server's configuration).
    EmbedBackfill,
    /// The accepted Memory version beside its projected file.
    InspectMemory { target: Target },
    /// Accept the edited Memory file as a new version.
    ImportMemory { target: Target },
    /// Record a stable fact, preference or project rule.
    Remember {
        #[arg(required = true, num_args = 1..)]
        text: Vec<String>,
        #[arg(long)]
        session: Option<String>,
    },
    /// Record an unresolved issue.
    Issue {
        #[arg(required = true, num_args = 1..)]
        text: Vec<String>,
        #[arg(long)]
        session: Option<String>,
    },
    /// Mark an issue solved with its resolution.
    Solved {
        experience_id: String,
        #[arg(required = true, num_args = 1..)]
        resolution: Vec<String>,
    },
    /// Forget an experience (retracting Memory that loses its last source).
    Forget { experience_id: String },
    /// Promote one experience to a project pattern and Skill candidate.
    Promote { experience_id: String },
    /// Feedback on an assistant message (compare-and-set on the feedback revision).
    Feedback {
        session_id: String,
        message_id: String,
        value: FeedbackArg,
        #[arg(long)]
        note: Option<String>,
        /// The feedback revision this replaces (0 for the first feedback).
        #[arg(long, default_value_t = 0)]
        expected_revision: i64,
    },
    /// Promote a pattern to a Skill candidate.
    PatternPromote { pattern_id: String },
    /// Reject a pattern (suppressed until new evidence).
    PatternReject { pattern_id: String },
    /// Start the offline evaluation of a Skill candidate.
    SkillReview { candidate_id: String },
    /// Apply an approved Skill candidate.
    SkillApply { candidate_id: String },
    /// Reject a Skill candidate.
    SkillReject { candidate_id: String },
    /// Undo an applied Skill.
    SkillUndo { candidate_id: String },
    /// Measure what the configured extractor learns from labelled transcripts
    /// (docs/learning-eval.md): a fresh store per file, never your own data.
    Eval(EvalArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct EvalArgs {
    /// Labels files (one per transcript).
    #[arg(required = true, num_args = 1..)]
    pub labels: Vec<std::path::PathBuf>,
    /// The corpus root that labels name their transcripts in.
    #[arg(long, default_value = "../shared/corpus")]
    pub corpus: std::path::PathBuf,
    /// The root `project:` transcript paths are relative to.
    #[arg(long, default_value = ".")]
    pub repository: std::path::PathBuf,
    /// Store every provider answer of the run in this directory (to replay it later).
    #[arg(long, conflicts_with = "replay_cassettes")]
    pub record_cassettes: Option<std::path::PathBuf>,
    /// Answer model requests from answers recorded with --record-cassettes: nothing leaves the
    /// machine, and a request without a recording fails its job.
    #[arg(long)]
    pub replay_cassettes: Option<std::path::PathBuf>,
    /// With --record-cassettes: call no provider; write each request without a recording to
    /// `DIR/<key>.request.json` and wait for its answer text in `DIR/<key>.answer.json` (the
    /// blind recordings: the answerer sees only the request file).
    #[arg(long, value_name = "DIR", requires = "record_cassettes")]
    pub answers_from: Option<std::path::PathBuf>,
    /// How long to wait for one answer file, in seconds.
    #[arg(long, default_value_t = 7200, requires = "answers_from")]
    pub answer_wait_secs: u64,
}

#[derive(Debug, Subcommand)]
pub enum MemoryAction {
    /// Resident Memory entries with their revisions.
    Read {
        #[arg(long)]
        target: Option<Target>,
    },
    /// The accepted version beside the projected file.
    Inspect { target: Target },
    /// Memory candidates (pending first by default).
    Candidates {
        #[arg(long)]
        state: Option<String>,
    },
    /// Approve a pending candidate.
    Approve { candidate_id: String },
    /// Approve a pending candidate with edited content.
    Edit {
        candidate_id: String,
        #[arg(required = true, num_args = 1..)]
        content: Vec<String>,
    },
    /// Reject a pending candidate.
    Reject { candidate_id: String },
    /// Propose removing the entry that `old_text` locates.
    Remove {
        target: Target,
        old_text: String,
        #[arg(long, default_value = "removed by the user")]
        reason: String,
    },
    /// Undo an applied candidate.
    Undo { candidate_id: String },
    /// Restore an entry withheld as stale (by the candidate `audit` lists for it) as your own.
    Restore { candidate_id: String },
    /// Revision history of a document.
    Revisions { target: Target },
    /// What Memory holds: size against each document's limit, entries sharing a subject,
    /// duplicate rules, entries naming files no longer in the worktree, entries withheld as
    /// stale.
    Audit,
}

#[derive(Debug, clap::Args)]
pub struct MemoriesArgs {
    pub session_id: String,
    /// Use resident Memory and experiences in this session's prompts.
    #[arg(long)]
    pub r#use: Option<bool>,
    /// Learning generation for the session: enabled or disabled.
    #[arg(long)]
    pub generation: Option<String>,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

#[derive(Debug, clap::Args)]
pub struct ReflectArgs {
    pub session_id: String,
    #[arg(value_enum, default_value_t = ReflectArg::Turn)]
    pub scope: ReflectArg,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

pub(super) fn project(common: &Common) -> Result<String, CliError> {
    match &common.project {
        Some(project) => Ok(project.clone()),
        None => {
            let cwd = std::env::current_dir()
                .map_err(|error| CliError::new(CliError::FAILURE, error.to_string()))?;
            Ok(crate::local_project::local_project(&cwd.to_string_lossy()).id)
        }
    }
}

fn joined(words: &[String]) -> String {
    words.join(" ")
}

pub async fn learn(
    global: &GlobalArgs,
    common: Common,
    action: LearnAction,
) -> Result<(), CliError> {
    if let LearnAction::Eval(args) = action {
        return eval(global, &common, args).await;
    }
    let client = ApiClient::connect(global, &common.server).await?;
    let p = encode(&project(&common)?);
    let answer = match route(action, &p) {
        Route::Get(path) => client.get(&path).await,
        Route::Post(path, body) => client.post(&path, &body).await,
    }?;
    print(&answer, common.json);
    Ok(())
}

/// The API call a `learn` action maps to: a GET of a path, or a POST of a JSON body.
enum Route {
    Get(String),
    Post(String, Value),
}

/// Which route each action calls, for the project `p` (already URL-encoded).
fn route(action: LearnAction, p: &str) -> Route {
    match action {
        LearnAction::Eval(_) => unreachable!("learn runs eval before routing"),
        LearnAction::Status => Route::Get(format!("/api/projects/{p}/learn/status")),
        LearnAction::List { offset } => Route::Get(format!(
            "/api/projects/{p}/learn/experiences?offset={offset}"
        )),
        LearnAction::Get { experience_id } => {
            Route::Get(format!("/api/experiences/{}", encode(&experience_id)))
        }
        LearnAction::Reprocess {
            assistant_message_id,
        } => Route::Post(
            format!("/api/projects/{p}/learn/reprocess"),
            json!({ "assistantMessageId": assistant_message_id }),
        ),
        LearnAction::RepairHistory { dry_run } => Route::Post(
            format!("/api/projects/{p}/learn/repair-history"),
            json!({ "dryRun": dry_run }),
        ),
        LearnAction::EmbedBackfill => {
            Route::Post(format!("/api/projects/{p}/learn/embed-backfill"), json!({}))
        }
        LearnAction::InspectMemory { target } => Route::Get(format!(
            "/api/projects/{p}/memory/inspect?target={}",
            target.as_str()
        )),
        LearnAction::ImportMemory { target } => Route::Post(
            format!("/api/projects/{p}/memory/import"),
            json!({ "target": target.as_str() }),
        ),
        LearnAction::Remember { text, session } => Route::Post(
            format!("/api/projects/{p}/learn/remember"),
            json!({ "text": joined(&text), "sessionId": session }),
        ),
        LearnAction::Issue { text, session } => Route::Post(
            format!("/api/projects/{p}/learn/issue"),
            json!({ "text": joined(&text), "sessionId": session }),
        ),
        LearnAction::Solved {
            experience_id,
            resolution,
        } => Route::Post(
            format!("/api/experiences/{}/solved", encode(&experience_id)),
            json!({ "resolution": joined(&resolution) }),
        ),
        LearnAction::Forget { experience_id } => Route::Post(
            format!("/api/experiences/{}/forget", encode(&experience_id)),
            json!({}),
        ),
        LearnAction::Promote { experience_id } => Route::Post(
            format!("/api/projects/{p}/learn/promote"),
            json!({ "experienceId": experience_id }),
        ),
        LearnAction::Feedback {
            session_id,
            message_id,
            value,
            note,
            expected_revision,
        } => feedback(&session_id, &message_id, value, note, expected_revision),
        LearnAction::PatternPromote { pattern_id } => Route::Post(
            format!("/api/patterns/{}/promote", encode(&pattern_id)),
            json!({}),
        ),
        LearnAction::PatternReject { pattern_id } => Route::Post(
            format!("/api/patterns/{}/reject", encode(&pattern_id)),
            json!({}),
        ),
        LearnAction::SkillReview { candidate_id } => skill(&candidate_id, "review"),
        LearnAction::SkillApply { candidate_id } => skill(&candidate_id, "apply"),
        LearnAction::SkillReject { candidate_id } => skill(&candidate_id, "reject"),
        LearnAction::SkillUndo { candidate_id } => skill(&candidate_id, "undo"),
    }
}

fn feedback(
    session_id: &str,
    message_id: &str,
    value: FeedbackArg,
    note: Option<String>,
    expected_revision: i64,
) -> Route {
    let value = match value {
        FeedbackArg::Positive => "positive",
        FeedbackArg::Negative => "negative",
    };
    Route::Post(
        format!(
            "/api/session/{}/messages/{}/feedback",
            encode(session_id),
            encode(message_id)
        ),
        json!({ "value": value, "note": note, "expectedRevision": expected_revision }),
    )
}

fn skill(candidate: &str, action: &str) -> Route {
    Route::Post(
        format!("/api/skills/{}/{action}", encode(candidate)),
        json!({}),
    )
}

pub async fn memory(
    global: &GlobalArgs,
    common: Common,
    action: MemoryAction,
) -> Result<(), CliError> {
    let client = ApiClient::connect(global, &common.server).await?;
    let p = encode(&project(&common)?);
    let candidate = |id: &str, verb: &str| format!("/api/memory/candidates/{}/{verb}", encode(id));
    let of_document = |verb: &str, target: Target| {
        format!("/api/projects/{p}/memory/{verb}?target={}", target.as_str())
    };
    let answer = match action {
        MemoryAction::Audit => client.get(&format!("/api/projects/{p}/memory/audit")).await,
        MemoryAction::Read { target } => {
            let query = target.map_or_else(String::new, |t| format!("?target={}", t.as_str()));
            client
                .get(&format!("/api/projects/{p}/memory{query}"))
                .await
        }
        MemoryAction::Inspect { target } => client.get(&of_document("inspect", target)).await,
        MemoryAction::Candidates { state } => {
            let query = state.map_or_else(String::new, |s| format!("?state={}", encode(&s)));
            client
                .get(&format!("/api/projects/{p}/memory/candidates{query}"))
                .await
        }
        MemoryAction::Approve { candidate_id } => {
            client
                .post(&candidate(&candidate_id, "approve"), &json!({}))
                .await
        }
        MemoryAction::Edit {
            candidate_id,
            content,
        } => {
            client
                .post(
                    &candidate(&candidate_id, "approve"),
                    &json!({ "content": joined(&content) }),
                )
                .await
        }
        MemoryAction::Reject { candidate_id } => {
            client
                .post(&candidate(&candidate_id, "reject"), &json!({}))
                .await
        }
        MemoryAction::Undo { candidate_id } => {
            client
                .post(&candidate(&candidate_id, "undo"), &json!({}))
                .await
        }
        MemoryAction::Restore { candidate_id } => {
            client
                .post(&candidate(&candidate_id, "restore"), &json!({}))
                .await
        }
        MemoryAction::Remove {
            target,
            old_text,
            reason,
        } => {
            client
                .post(
                    &format!("/api/projects/{p}/memory"),
                    &json!({ "target": target.as_str(), "action": "remove", "oldText": old_text,
                             "reason": reason, "confidence": 1.0, "origin": "user" }),
                )
                .await
        }
        MemoryAction::Revisions { target } => client.get(&of_document("revisions", target)).await,
    }?;
    print(&answer, common.json);
    Ok(())
}

/// `zuno memories <session> [--use true|false] [--generation enabled|disabled]`: shows the
/// session's policy, or updates it compare-and-set on the revision just read.
pub async fn memories(global: &GlobalArgs, args: MemoriesArgs) -> Result<(), CliError> {
    let client = ApiClient::connect(global, &args.server).await?;
    let path = format!("/api/session/{}/memory-policy", encode(&args.session_id));
    let current = client.get(&path).await?;
    let answer = if args.r#use.is_none() && args.generation.is_none() {
        current
    } else {
        let revision = current
            .get("revision")
            .and_then(Value::as_i64)
            .ok_or_else(|| CliError::new(CliError::FAILURE, "the policy has no revision"))?;
        let mut body = json!({ "expectedRevision": revision });
        if let Some(use_memories) = args.r#use {
            body["useMemories"] = Value::Bool(use_memories);
        }
        if let Some(generation) = &args.generation {
            body["generation"] = Value::String(generation.clone());
        }
        client.put(&path, &body).await?
    };
    print(&answer, args.json);
    Ok(())
}

/// `zuno reflect <session> [turn|session]`.
pub async fn reflect(global: &GlobalArgs, args: ReflectArgs) -> Result<(), CliError> {
    let client = ApiClient::connect(global, &args.server).await?;
    let scope = match args.scope {
        ReflectArg::Turn => "turn",
        ReflectArg::Session => "session",
    };
    let answer = client
        .post(
            &format!("/api/session/{}/reflect", encode(&args.session_id)),
            &json!({ "scope": scope }),
        )
        .await?;
    print(&answer, args.json);
    Ok(())
}

/// JSON for scripts, else a readable outline: scalars as `key: value`, lists one item a line
/// (id, state and text when they have them), nested objects indented.
pub fn print(value: &Value, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(value).unwrap_or_default()
        );
        return;
    }
    let mut out = String::new();
    outline(value, 0, &mut out);
    print!("{out}");
}

fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::Null => Some(String::from("-")),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) => Some(s.replace('\n', " ⏎ ")),
        _ => None,
    }
}

fn summary(item: &Value) -> String {
    if let Some(text) = scalar(item) {
        return text;
    }
    let field = |names: &[&str]| {
        names
            .iter()
            .find_map(|name| item.get(*name).and_then(scalar))
            .unwrap_or_default()
    };
    let id = field(&["id", "name"]);
    let state = field(&["state", "status", "kind"]);
    let mut text = field(&["text", "content", "summary", "title", "detail", "reason"]);
    if text.chars().count() > 100 {
        text = text.chars().take(100).collect::<String>() + "…";
    }
    [id, state, text]
        .into_iter()
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join("  ")
}

fn outline(value: &Value, depth: usize, out: &mut String) {
    let pad = "  ".repeat(depth);
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match value {
                    Value::Array(items) => {
                        out.push_str(&format!("{pad}{key}: {} item(s)\n", items.len()));
                        for item in items.iter().take(100) {
                            out.push_str(&format!("{pad}  - {}\n", summary(item)));
                        }
                    }
                    Value::Object(_) if depth < 2 => {
                        out.push_str(&format!("{pad}{key}:\n"));
                        outline(value, depth + 1, out);
                    }
                    Value::Object(_) => out.push_str(&format!("{pad}{key}: {}\n", summary(value))),
                    other => out.push_str(&format!(
                        "{pad}{key}: {}\n",
                        scalar(other).unwrap_or_default()
                    )),
                }
            }
        }
        Value::Array(items) => {
            if items.is_empty() {
                out.push_str(&format!("{pad}(none)\n"));
            }
            for item in items {
                out.push_str(&format!("{pad}- {}\n", summary(item)));
            }
        }
        other => out.push_str(&format!("{pad}{}\n", scalar(other).unwrap_or_default())),
    }
}

/// `zuno learn eval`: the learning-quality harness. With a `postgres://` `--database-url` each
/// file gets a fresh database on that server; otherwise a fresh SQLite file.
async fn eval(global: &GlobalArgs, common: &Common, args: EvalArgs) -> Result<(), CliError> {
    let settings = global.settings()?;
    let store = match &global.database_url {
        Some(url) if url.starts_with("postgres") => crate::eval::StoreChoice::Postgres {
            admin_url: url.clone(),
        },
        _ => crate::eval::StoreChoice::Sqlite,
    };
    let options = crate::eval::EvalOptions {
        labels: args.labels,
        corpus: args.corpus,
        repository: args.repository,
        store,
        config: settings.config,
        cassettes: match (args.record_cassettes, args.replay_cassettes) {
            (Some(cassettes), _) if args.answers_from.is_some() => {
                Some(crate::eval::CassetteMode::AwaitAnswers {
                    cassettes,
                    exchange: args.answers_from.unwrap_or_default(),
                    wait: std::time::Duration::from_secs(args.answer_wait_secs),
                })
            }
            (Some(dir), _) => Some(crate::eval::CassetteMode::Record(dir)),
            (None, Some(dir)) => Some(crate::eval::CassetteMode::Replay(dir)),
            (None, None) => None,
        },
        server: global.server()?,
    };
    let report = crate::eval::run(&options)
        .await
        .map_err(|error| CliError::new(error.exit_code(), error.to_string()))?;
    if common.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report)
                .map_err(|e| CliError::new(CliError::FAILURE, e.to_string()))?
        );
    } else {
        print!("{}", crate::eval::print_text(&report));
    }
    let problems: usize = report
        .files
        .iter()
        .map(|f| f.report.label_problems.len())
        .sum();
    if problems > 0 {
        return Err(CliError::new(
            CliError::BAD_INPUT,
            format!(
                "{problems} label(s) do not match their transcripts (LABEL PROBLEM lines above)"
            ),
        ));
    }
    Ok(())
}

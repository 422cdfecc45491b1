//! `zuno hook claude-code|codex <event>`: a thin hook client in front of the resident server.
//! It reads the hook's JSON from stdin, makes one or two calls to the server and writes the
//! hook's JSON answer to stdout, all inside a small time budget. Whatever goes wrong (server
//! down, bad input, budget spent) it prints nothing on stdout and exits 0, so the agent always
//! continues. Both agents send the same common fields (Codex adds `turn_id` and `model`, and its
//! `transcript_path` may be null; unknown fields are ignored) and read the same answer,
//! `hookSpecificOutput.additionalContext`.
//!
//! - `SessionStart`: resident Memory (`memory.*` sections of `/context`) as `additionalContext`.
//! - `UserPromptSubmit`: every `/context` section for the prompt as `additionalContext`.
//! - `PreToolUse`: asks the server whether an active guard stops the call (`/guards/check`) and
//!   answers Claude Code with `permissionDecision` `ask` or `deny` and the lesson as the reason.
//!   Codex's hooks refuse a call on `deny` but cannot ask the user: there an `ask` guard only
//!   warns (`systemMessage`) and the call proceeds. Allowed calls get no output.
//! - `Stop` (after every reply, not at the end of a session): imports what the transcript gained
//!   since a durable per-file watermark, so each newly closed turn is ingested once and admitted:
//!   the Claude Code session log with its subagent sidechains, or the Codex rollout.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use zuno_shared::transcript::import::{Host, ImportedSession, Parsed, Position, session_id_for};
use zuno_shared::transcript::{MessageStatus, Role};

use crate::client::{ApiClient, ClientError, encode};
use crate::error::CliError;
use crate::global::GlobalArgs;
use crate::import::{Importer, parse_file, parse_file_with_session};
use crate::local_project::local_project;

/// The server the hook talks to when none is configured.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:7878";
/// The most stdin the hook reads (a hook payload is small; a prompt is bounded by the API).
const MAX_INPUT_BYTES: u64 = 4 * 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HookHost {
    ClaudeCode,
    Codex,
}

impl HookHost {
    pub fn host(self) -> Host {
        match self {
            HookHost::ClaudeCode => Host::ClaudeCode,
            HookHost::Codex => Host::Codex,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct HookArgs {
    pub host: HookHost,
    /// The hook event (`SessionStart`, `UserPromptSubmit`, `Stop`; others are accepted and
    /// ignored).
    pub event: String,
    /// The Zuno server (default: http://127.0.0.1:7878).
    #[arg(long, env = "ZUNO_SERVER_URL")]
    pub server: Option<String>,
    /// Bearer token (default: for a server on this machine, the local token in the data
    /// directory).
    #[arg(long, env = "ZUNO_API_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Time budget for the whole hook, in milliseconds (default 4000; 20000 for Stop).
    #[arg(long)]
    pub budget_ms: Option<u64>,
}

/// The fields of the common hook input this client reads (Claude Code and Codex; unknown
/// fields are ignored).
#[derive(Debug, Deserialize)]
struct HookInput {
    session_id: String,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    transcript_path: Option<String>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    tool_name: Option<String>,
    #[serde(default)]
    tool_input: Option<Value>,
}

/// Runs the hook; never fails (errors are reported on stderr only). Inside a learning model
/// call (an agent's command line that Zuno itself started, provider/cli.rs) it does nothing:
/// that session is Zuno's own question, not the user's work.
pub async fn run(global: &GlobalArgs, args: HookArgs) -> Result<(), CliError> {
    if std::env::var_os(zuno_shared::provider::CHILD_ENV).is_some() {
        return Ok(());
    }
    let default_budget = match args.event.as_str() {
        "Stop" | "SubagentStop" => 20_000,
        // Every guarded tool call waits for this hook.
        "PreToolUse" => 1_000,
        _ => 4_000,
    };
    let budget = Duration::from_millis(args.budget_ms.unwrap_or(default_budget));
    let mut input = Vec::new();
    if let Err(error) = std::io::stdin()
        .take(MAX_INPUT_BYTES)
        .read_to_end(&mut input)
    {
        eprintln!("zuno hook: cannot read stdin: {error}");
        return Ok(());
    }
    match tokio::time::timeout(budget, handle(global, &args, &input, budget)).await {
        Ok(Ok(Some(output))) => println!("{output}"),
        Ok(Ok(None)) => {}
        Ok(Err(error)) => eprintln!("zuno hook: {error}"),
        Err(_) => eprintln!("zuno hook: gave up after {} ms", budget.as_millis()),
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("invalid hook input: {0}")]
    Input(String),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("{0}")]
    Cli(String),
}

impl From<CliError> for HookError {
    fn from(error: CliError) -> HookError {
        HookError::Cli(error.message)
    }
}

async fn handle(
    global: &GlobalArgs,
    args: &HookArgs,
    input: &[u8],
    budget: Duration,
) -> Result<Option<String>, HookError> {
    let input: HookInput =
        serde_json::from_slice(input).map_err(|error| HookError::Input(error.to_string()))?;
    let server = args.server.as_deref().unwrap_or(DEFAULT_SERVER);
    let token = crate::client::token_for(global, server, args.token.as_deref())?;
    let client = ApiClient::remote(server, token, budget)?;
    match args.event.as_str() {
        "SessionStart" => {
            let session = ensure_session(&client, args.host.host(), &input).await?;
            let context = context(&client, &session, "").await?;
            Ok(render(&context, "SessionStart", |name| {
                name.starts_with("memory.")
            }))
        }
        "UserPromptSubmit" => {
            let session = ensure_session(&client, args.host.host(), &input).await?;
            let prompt = input.prompt.as_deref().unwrap_or("");
            let context = context(&client, &session, prompt).await?;
            Ok(render(&context, "UserPromptSubmit", |_| true))
        }
        "PreToolUse" => pre_tool_use(&client, args.host, &input).await,
        "Stop" | "SubagentStop" => {
            let Some(transcript) = input.transcript_path.as_deref() else {
                return Ok(None);
            };
            let settings = global.settings()?;
            let host = args.host.host();
            let store =
                WatermarkStore::new(settings.paths.data_dir.join("hooks").join(host.as_str()));
            match host {
                Host::Codex => {
                    import_rollout_incrementally(client, &store, Path::new(transcript)).await?;
                }
                _ => {
                    import_incrementally(client, &store, Path::new(transcript)).await?;
                }
            }
            Ok(None)
        }
        _ => Ok(None),
    }
}

async fn ensure_session(
    client: &ApiClient,
    host: Host,
    input: &HookInput,
) -> Result<String, HookError> {
    let cwd = input.cwd.as_deref().unwrap_or("unknown");
    let local = local_project(cwd);
    let project = local.id;
    let session = session_id_for(host, &input.session_id);
    crate::client::ensure_project(client, &project, &local.name, local.worktree.as_deref()).await?;
    let body = json!({ "id": session, "externalRef": input.session_id });
    tolerate_conflict(
        client
            .post(
                &format!("/api/projects/{}/sessions", encode(&project)),
                &body,
            )
            .await,
    )?;
    Ok(session)
}

/// The guard check before a tool call: `None` (no output: the call proceeds) unless an active
/// guard stops it.
async fn pre_tool_use(
    client: &ApiClient,
    host: HookHost,
    input: &HookInput,
) -> Result<Option<String>, HookError> {
    let (Some(tool_name), Some(tool_input), Some(cwd)) =
        (&input.tool_name, &input.tool_input, &input.cwd)
    else {
        return Ok(None);
    };
    // The project the session hooks bound: the repository root's, not the subdirectory's.
    let project = local_project(cwd).id;
    let body = json!({
        "toolName": tool_name,
        "toolInput": tool_input,
        "sessionId": session_id_for(host.host(), &input.session_id),
    });
    let answer = match client
        .post(
            &format!("/api/projects/{}/guards/check", encode(&project)),
            &body,
        )
        .await
    {
        Ok(answer) => answer,
        // A project the server does not know has no guards.
        Err(error) if error.status() == Some(404) => return Ok(None),
        Err(error) => return Err(error.into()),
    };
    Ok(pre_tool_use_output(host, &answer))
}

/// The hook's answer for the server's verdict, in the host's vocabulary.
fn pre_tool_use_output(host: HookHost, answer: &Value) -> Option<String> {
    let decision = answer.get("decision").and_then(Value::as_str)?;
    let reason = answer
        .get("reason")
        .and_then(Value::as_str)
        .unwrap_or("Zuno guard");
    let output = match (host, decision) {
        (_, "allow") => return None,
        (HookHost::Codex, "ask") => json!({ "systemMessage": reason }),
        (_, "ask" | "deny") => json!({
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": decision,
                "permissionDecisionReason": reason,
            }
        }),
        _ => return None,
    };
    Some(output.to_string())
}

fn tolerate_conflict(result: Result<Value, ClientError>) -> Result<(), ClientError> {
    match result {
        Ok(_) => Ok(()),
        Err(error) if error.status() == Some(409) => Ok(()),
        Err(error) => Err(error),
    }
}

async fn context(client: &ApiClient, session: &str, prompt: &str) -> Result<Value, HookError> {
    Ok(client
        .post(
            &format!("/api/session/{}/context", encode(session)),
            &json!({ "prompt": prompt }),
        )
        .await?)
}

/// The hook answer: the chosen sections (already rendered as quoted data by the server) as
/// `additionalContext`, or nothing when there is nothing to add.
fn render(context: &Value, event: &str, keep: impl Fn(&str) -> bool) -> Option<String> {
    let sections: Vec<&str> = context
        .get("sections")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|section| {
            section
                .get("name")
                .and_then(Value::as_str)
                .is_some_and(&keep)
        })
        .filter_map(|section| section.get("content").and_then(Value::as_str))
        .filter(|content| !content.trim().is_empty())
        .collect();
    if sections.is_empty() {
        return None;
    }
    let output = json!({
        "hookSpecificOutput": {
            "hookEventName": event,
            "additionalContext": sections.join("\n\n"),
        }
    });
    Some(output.to_string())
}

/// Per-file import positions, stored under Zuno's data directory in files named by a digest
/// of the transcript path (the path itself never names a file).
pub struct WatermarkStore {
    dir: PathBuf,
}

/// Where reading a transcript resumes, with what the reader must remember from before it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    pub position: Position,
    /// The session the file holds, when its identifying record lies before `position` (a Codex
    /// rollout names its session and working directory once, in its first record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionHint>,
    /// The `uuid` of the last Claude Code record before `position`: a new branch that starts
    /// under another record is the session going back to an earlier point.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_record: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Watermark {
    path: String,
    #[serde(flatten)]
    mark: Mark,
}

/// A rollout's session id and recorded working directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionHint {
    pub id: String,
    pub cwd: Option<String>,
}

impl WatermarkStore {
    pub fn new(dir: PathBuf) -> WatermarkStore {
        WatermarkStore { dir }
    }

    fn file(&self, transcript: &Path) -> PathBuf {
        let digest = hex::encode(Sha256::digest(transcript.to_string_lossy().as_bytes()));
        self.dir.join(format!("{}.json", &digest[..32]))
    }

    /// Where to resume `transcript` (the start when unknown, or when the file shrank below the
    /// mark: it was replaced, and re-importing is idempotent).
    pub fn load(&self, transcript: &Path, length: u64) -> Mark {
        std::fs::read(self.file(transcript))
            .ok()
            .and_then(|bytes| serde_json::from_slice::<Watermark>(&bytes).ok())
            .map(|watermark| watermark.mark)
            .filter(|mark| mark.position.offset <= length)
            .unwrap_or_default()
    }

    /// [`WatermarkStore::store`], warning on stderr when it fails: the next run re-imports from
    /// the older mark, which is idempotent, so a hook does not fail for it.
    pub fn store_or_warn(&self, transcript: &Path, mark: Mark) {
        if let Err(error) = self.store(transcript, mark) {
            eprintln!("zuno hook: cannot store the import watermark: {error}");
        }
    }

    /// Stores the mark atomically (write a temporary file, then rename).
    pub fn store(&self, transcript: &Path, mark: Mark) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let file = self.file(transcript);
        let temporary = file.with_extension("json.tmp");
        let watermark = Watermark {
            path: transcript.to_string_lossy().into_owned(),
            mark,
        };
        std::fs::write(
            &temporary,
            serde_json::to_vec(&watermark).unwrap_or_default(),
        )?;
        std::fs::rename(&temporary, &file)
    }
}

/// Imports what was appended to `transcript` (and to its `<session>/subagents/*.jsonl`)
/// since each file's watermark; a watermark advances only after its file's new turns were
/// all accepted by the server, so an interrupted run repeats (idempotently) next time.
///
/// When the new part of the session log starts a branch under an earlier record than the last
/// one read (the user rewound), the whole log is read again to see which turns the session
/// abandoned: the new messages are taken from that reading, and abandoned turns imported by an
/// earlier run are marked `failed`, so queued work from them is skipped and the next turn reads
/// them only as context. Returns the number of messages added.
pub async fn import_incrementally(
    client: ApiClient,
    store: &WatermarkStore,
    transcript: &Path,
) -> Result<usize, HookError> {
    let mut files = vec![transcript.to_path_buf()];
    if let (Some(dir), Some(stem)) = (transcript.parent(), transcript.file_stem()) {
        let subagents = dir.join(stem).join("subagents");
        if let Ok(entries) = std::fs::read_dir(&subagents) {
            let mut found: Vec<PathBuf> = entries
                .flatten()
                .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_file()))
                .map(|entry| entry.path())
                .filter(|path| path.extension().is_some_and(|ext| ext == "jsonl"))
                .collect();
            found.sort();
            files.extend(found);
        }
    }
    let mut importer = Importer::new(client.clone(), None);
    for file in files {
        let Ok(meta) = std::fs::metadata(&file) else {
            continue;
        };
        if !meta.is_file() {
            continue;
        }
        let mark = store.load(&file, meta.len());
        let start = mark.position;
        if start.offset == meta.len() {
            continue;
        }
        let parsed = parse_file(Host::ClaudeCode, &file, start)?;
        let rewound = mark.last_record.as_ref().is_some_and(|last| {
            parsed
                .chain
                .outside_parents
                .iter()
                .any(|parent| parent != last)
        });
        let next = Mark {
            position: Position {
                offset: start.offset + parsed.consumed_bytes,
                line: start.line + parsed.lines,
            },
            session: None,
            last_record: parsed.chain.last.clone().or(mark.last_record),
        };
        if rewound {
            let whole = parse_file(Host::ClaudeCode, &file, Position::default())?;
            let (earlier, new) = split_at_line(whole, start.line, next.position.line);
            importer
                .import(&file.display().to_string(), &new, None)
                .await?;
            fail_abandoned_turns(&client, &earlier).await?;
        } else {
            importer
                .import(&file.display().to_string(), &parsed, None)
                .await?;
        }
        store.store_or_warn(&file, next);
    }
    Ok(reported(&importer))
}

/// Prints the lines the import skipped, on stderr, and returns how many messages it added.
fn reported(importer: &Importer) -> usize {
    for issue in &importer.report.issues {
        eprintln!(
            "zuno hook: {}:{}: skipped: {}",
            issue.file, issue.line, issue.reason
        );
    }
    importer.report.messages_added
}

/// A whole-file reading split at a watermark: the messages that start at or before line
/// `watermark` (imported by earlier runs) and those after it, up to line `end` (what this run
/// read), with the issues of the latter.
fn split_at_line(whole: Parsed, watermark: u64, end: u64) -> (Parsed, Parsed) {
    let mut earlier = Parsed::default();
    let mut new = Parsed {
        issues: whole
            .issues
            .into_iter()
            .filter(|issue| issue.line > watermark && issue.line <= end)
            .collect(),
        ..Parsed::default()
    };
    for session in whole.sessions {
        let (before, after): (Vec<_>, Vec<_>) = session
            .messages
            .iter()
            .cloned()
            .partition(|message| message.line <= watermark);
        let after: Vec<_> = after.into_iter().filter(|m| m.line <= end).collect();
        earlier.sessions.push(ImportedSession {
            messages: before,
            ..session.clone()
        });
        new.sessions.push(ImportedSession {
            messages: after,
            ..session
        });
    }
    (earlier, new)
}

/// Marks the failed assistant turns of `earlier` (abandoned by a rewind, or interrupted) failed
/// on the server too; one the server never stored is passed over.
async fn fail_abandoned_turns(client: &ApiClient, earlier: &Parsed) -> Result<(), HookError> {
    for session in &earlier.sessions {
        let session_id = session.session_id();
        for message in &session.messages {
            if message.role != Role::Assistant || message.status != MessageStatus::Failed {
                continue;
            }
            let path = format!(
                "/api/session/{}/messages/{}/complete",
                encode(&session_id),
                encode(&message.message_id(&session_id))
            );
            match client.post(&path, &json!({ "status": "failed" })).await {
                Ok(_) => {}
                Err(error) if error.status() == Some(404) => {}
                Err(error) => return Err(error.into()),
            }
        }
    }
    Ok(())
}

/// Imports what was appended to a Codex rollout since its watermark. The rollout names its
/// session only in its first record, so the watermark keeps that session beside the position;
/// the watermark advances only after the server accepted the new turns. Returns the number of
/// messages added.
pub async fn import_rollout_incrementally(
    client: ApiClient,
    store: &WatermarkStore,
    rollout: &Path,
) -> Result<usize, HookError> {
    let meta = std::fs::metadata(rollout)
        .map_err(|error| HookError::Input(format!("{}: {error}", rollout.display())))?;
    if !meta.is_file() {
        return Ok(0);
    }
    let mark = store.load(rollout, meta.len());
    let (start, hint) = (mark.position, mark.session);
    if start.offset == meta.len() {
        return Ok(0);
    }
    let parsed = parse_file_with_session(
        Host::Codex,
        rollout,
        start,
        hint.clone().map(|hint| (hint.id, hint.cwd)),
    )?;
    let mut importer = Importer::new(client, None);
    importer
        .import(&rollout.display().to_string(), &parsed, None)
        .await?;
    let session = parsed
        .sessions
        .first()
        .map(|session| SessionHint {
            id: session.external_ref.clone(),
            cwd: session.cwd.clone(),
        })
        .or(hint);
    let next = Position {
        offset: start.offset + parsed.consumed_bytes,
        line: start.line + parsed.lines,
    };
    let next = Mark {
        position: next,
        session,
        last_record: None,
    };
    store.store_or_warn(rollout, next);
    Ok(reported(&importer))
}

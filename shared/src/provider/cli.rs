//! The command-line kinds: an agent's own command line run headless, under the user's existing
//! login, instead of an HTTP request. One call of [`run`] is one invocation; the caller
//! (`Call` in provider/mod.rs) decodes the answer, sends the one repair and owns the deadline,
//! exactly as for the HTTP kinds.
//!
//! # How a command runs
//!
//! - The prompt is data: it goes to the child's stdin, and the system prompt (Claude Code) is
//!   one argument-vector element. Nothing passes through a shell.
//! - The working directory is a fresh, empty temporary directory (removed afterwards), never
//!   the user's repository, so no project instructions or files are read.
//! - The child is its own process group. When the deadline drops the call, the child is
//!   killed (`kill_on_drop`) together with anything it started (the group); after a normal
//!   exit, stragglers of the group are killed too, so none holds the output pipes open.
//! - The child's environment is Zuno's, plus [`CHILD_ENV`] (Zuno's own hooks, should the agent
//!   still run them, do nothing when they see it), minus `CLAUDECODE` (Claude Code refuses to
//!   start nested in a session it believes it is in). `PATH` comes from the client's
//!   environment lookup when it has one, so tests can put stand-ins first.
//!
//! # What this relies on
//!
//! Claude Code (CLI reference and headless-mode documentation, docs.claude.com /
//! code.claude.com):
//! - `claude -p` (`--print`) answers one non-interactive turn; without a prompt argument the
//!   prompt is read from stdin.
//! - `--output-format json` prints one result object, `{"type":"result","subtype":"success",
//!   "is_error":false,"result":"<text>","session_id":…,"usage":{"input_tokens":…,
//!   "cache_creation_input_tokens":…,"cache_read_input_tokens":…,"output_tokens":…},…}`; a
//!   failure is `"is_error":true` (or a `subtype` other than `success`) with a non-zero exit.
//!   Input tokens are counted with the cache writes and reads: the model processed them all.
//! - `--system-prompt` replaces Claude Code's own system prompt; `--model` takes an alias
//!   (`haiku`, `sonnet`) or a full model name; `--tools ""` disables every built-in tool;
//!   `--strict-mcp-config` without `--mcp-config` starts no MCP server; `--settings` accepts a
//!   JSON string, and `{"disableAllHooks":true}` keeps the user's hooks (Zuno's own Stop hook
//!   among them) from running; `--no-session-persistence` keeps the call out of the user's
//!   session history.
//! - `CLAUDE_CODE_MAX_OUTPUT_TOKENS` in the environment caps the output: the learning ceiling.
//!
//! Codex (its non-interactive-mode documentation, developers.openai.com/codex, and
//! `codex-rs/exec/src/{cli,exec_events}.rs` in openai/codex):
//! - `codex exec [OPTIONS] -` reads the prompt from stdin; `--json` prints JSONL events:
//!   `thread.started {thread_id}`, `turn.started`, `item.completed {item: {type:
//!   "agent_message", text}}`, `turn.completed {usage: {input_tokens, cached_input_tokens,
//!   output_tokens}}` (cached tokens are part of the input), `turn.failed {error: {message}}`
//!   and `error {message}` (also sent for a reconnect that later succeeds, so it fails the call
//!   only when no turn completed).
//! - `--sandbox read-only`, `--skip-git-repo-check` (the temporary directory is not a
//!   repository), `--ephemeral` (no session files written), `--model`.
//! - `codex exec` has no system-prompt option: the system prompt leads the stdin text.
//!
//! A model named [`CLI_DEFAULT_MODEL`] passes no `--model`: the command uses its own default.

use std::process::{ExitStatus, Stdio};
use std::time::{Duration, SystemTime};

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::error::{self, Diagnostic, ProviderError};
use super::wire::{Answer, Turn};
use super::{EnvLookup, LearningRequest, ResolvedModel, Usage};
use crate::config::ProviderApi;

/// Set (to `1`) in the environment of every command-line provider call. `zuno hook` exits at
/// once when it sees it, so an agent that still runs Zuno's hooks cannot feed a learning call
/// back into learning.
pub const CHILD_ENV: &str = "ZUNO_LEARNING_MODEL_CALL";

/// The model name that lets the command line pick its own model (no `--model` is passed).
pub const CLI_DEFAULT_MODEL: &str = "default";

/// Claude Code's settings for a learning call: no hooks run.
const CLAUDE_SETTINGS: &str = r#"{"disableAllHooks":true}"#;
/// The most stdout kept (the answer); the rest is read and dropped so the child never blocks.
const MAX_STDOUT: usize = 8 * 1024 * 1024;
/// The most stderr kept, for diagnostics.
const MAX_STDERR: usize = 16 * 1024;
/// The longest system prompt passed as an argument (Linux refuses one argument above 128 KiB);
/// a longer one leads the stdin text instead.
const MAX_SYSTEM_ARG: usize = 96 * 1024;

/// Whether the system prompt goes to Claude Code as `--system-prompt` (else it leads stdin).
fn system_as_argument(api: ProviderApi, system: &str) -> bool {
    api == ProviderApi::ClaudeCli && !system.is_empty() && system.len() <= MAX_SYSTEM_ARG
}

/// What one invocation produced: what it cost and the answer or why there is none.
pub(crate) struct Outcome {
    pub usage: Usage,
    /// Claude Code's `session_id`, Codex's `thread_id`.
    pub request_id: Option<String>,
    pub answer: Result<Answer, ProviderError>,
}

/// The argument vector for `model`, without the program. `system` is the system prompt
/// (Claude Code takes it as one argument; receipts pass `None` and record it as the prompt).
pub(crate) fn args(model: &ResolvedModel, system: Option<&str>) -> Vec<String> {
    let named = (model.model != CLI_DEFAULT_MODEL).then_some(model.model.as_str());
    let mut args: Vec<&str> = Vec::new();
    match model.api {
        ProviderApi::ClaudeCli => {
            args.extend(["-p", "--output-format", "json", "--no-session-persistence"]);
            args.extend([
                "--strict-mcp-config",
                "--tools",
                "",
                "--settings",
                CLAUDE_SETTINGS,
            ]);
            if let Some(name) = named {
                args.extend(["--model", name]);
            }
            if let Some(system) = system.filter(|system| system_as_argument(model.api, system)) {
                args.extend(["--system-prompt", system]);
            }
        }
        ProviderApi::CodexCli => {
            args.extend(["exec", "--json", "--ephemeral", "--skip-git-repo-check"]);
            args.extend(["--sandbox", "read-only"]);
            if let Some(name) = named {
                args.extend(["--model", name]);
            }
            args.push("-");
        }
        ProviderApi::OpenaiChat | ProviderApi::OpenaiResponses | ProviderApi::AnthropicMessages => {
        }
    }
    args.into_iter().map(str::to_owned).collect()
}

/// The stdin text: the system prompt when it is not an argument (always for Codex), the user
/// prompt, and for the repair the previous answer and the follow-up, marked as such.
pub(crate) fn prompt_text(api: ProviderApi, request: &LearningRequest, turns: &[Turn]) -> String {
    let mut text = String::new();
    if !request.system.is_empty() && !system_as_argument(api, &request.system) {
        text.push_str(&request.system);
        text.push_str("\n\n");
    }
    text.push_str(&request.user);
    for turn in turns {
        let (heading, body) = match turn {
            Turn::Assistant(answer) => ("Your previous answer", answer),
            Turn::User(follow_up) => ("Follow-up", follow_up),
        };
        text.push_str(&format!("\n\n--- {heading} ---\n{body}"));
    }
    text
}

/// Runs the command once. `Err` only when it could not be started; everything after that
/// (including its reported failures) is in the [`Outcome`].
pub(crate) async fn run(
    model: &ResolvedModel,
    request: &LearningRequest,
    turns: &[Turn],
    env: &EnvLookup,
) -> Result<Outcome, ProviderError> {
    let program = model
        .command
        .clone()
        .or_else(|| model.api.default_command().map(str::to_owned))
        .unwrap_or_default();
    let mut extra = vec![(CHILD_ENV, String::from("1"))];
    if let Some(path) = env("PATH") {
        extra.push(("PATH", path));
    }
    if model.api == ProviderApi::ClaudeCli {
        extra.push((
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS",
            model.max_output_tokens.to_string(),
        ));
    }
    let invocation = Invocation {
        program: &program,
        args: args(model, Some(&request.system)),
        env: extra,
        stdin: prompt_text(model.api, request, turns),
    };
    let finished = invocation.execute().await?;
    Ok(match model.api {
        ProviderApi::CodexCli => read_codex(&program, &finished),
        _ => read_claude(&program, &finished),
    })
}

/// One child process to run.
struct Invocation<'a> {
    program: &'a str,
    args: Vec<String>,
    env: Vec<(&'static str, String)>,
    stdin: String,
}

/// A child that exited, with what it printed (bounded).
struct Finished {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl Invocation<'_> {
    async fn execute(self) -> Result<Finished, ProviderError> {
        let unavailable = |message: String| ProviderError::CommandUnavailable {
            command: self.program.to_owned(),
            message,
        };
        let workdir = tempfile::Builder::new()
            .prefix("zuno-model-call-")
            .tempdir()
            .map_err(|error| unavailable(format!("no temporary working directory: {error}")))?;
        let mut command = tokio::process::Command::new(self.program);
        command
            .args(&self.args)
            .current_dir(workdir.path())
            .env_remove("CLAUDECODE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        for (name, value) in &self.env {
            command.env(name, value);
        }
        let mut child = command
            .spawn()
            .map_err(|error| unavailable(error.to_string()))?;
        let mut group = Group(child.id().and_then(|id| i32::try_from(id).ok()));
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let input = self.stdin;
        let write = async move {
            if let Some(mut pipe) = stdin {
                // A command that exits without reading all of its input is judged by its
                // output, not by the broken pipe.
                let _ = pipe.write_all(input.as_bytes()).await;
            }
        };
        let wait = async {
            let status = child.wait().await;
            // Whatever the command left running would hold the pipes open.
            group.kill();
            status
        };
        let ((), status, stdout, stderr) = tokio::join!(
            write,
            wait,
            drain(stdout, MAX_STDOUT),
            drain(stderr, MAX_STDERR)
        );
        let status = status.map_err(|error| unavailable(error.to_string()))?;
        drop(workdir);
        Ok(Finished {
            status,
            stdout,
            stderr,
        })
    }
}

/// A child's process group, killed when the call ends early (the deadline drops the future) or
/// once the child has exited.
struct Group(Option<i32>);

impl Group {
    fn kill(&mut self) {
        if let Some(group) = self.0.take() {
            // ESRCH (nothing left in the group) is the usual answer after a clean exit.
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(group),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Reads a pipe to its end, keeping the first `keep` bytes.
async fn drain(pipe: Option<impl AsyncRead + Unpin>, keep: usize) -> Vec<u8> {
    let mut kept = Vec::new();
    let Some(mut pipe) = pipe else {
        return kept;
    };
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        match pipe.read(&mut buffer).await {
            Ok(0) | Err(_) => return kept,
            Ok(read) => {
                let room = keep.saturating_sub(kept.len()).min(read);
                kept.extend_from_slice(&buffer[..room]);
            }
        }
    }
}

/// Claude Code's result object (the last `result` of an array, should a version print the
/// whole conversation).
fn read_claude(program: &str, finished: &Finished) -> Outcome {
    let text = String::from_utf8_lossy(&finished.stdout);
    let parsed: Option<Value> = serde_json::from_str(text.trim()).ok();
    let result = match parsed {
        Some(Value::Array(items)) => items
            .into_iter()
            .rev()
            .find(|item| item["type"] == "result"),
        Some(object @ Value::Object(_)) if object["type"] == "result" => Some(object),
        _ => None,
    };
    let Some(result) = result else {
        return Outcome {
            usage: Usage::default(),
            request_id: None,
            answer: Err(no_envelope(program, finished, "a Claude Code JSON result")),
        };
    };
    let count = |key: &str| result["usage"][key].as_u64().unwrap_or(0);
    let usage = Usage {
        input_tokens: count("input_tokens")
            .saturating_add(count("cache_creation_input_tokens"))
            .saturating_add(count("cache_read_input_tokens")),
        output_tokens: count("output_tokens"),
    };
    let request_id = result["session_id"].as_str().map(str::to_owned);
    let subtype = result["subtype"].as_str().unwrap_or("success");
    let failed = result["is_error"].as_bool().unwrap_or(false) || subtype != "success";
    let message = result["result"].as_str().unwrap_or_default();
    let answer = if failed {
        let message = if message.is_empty() { subtype } else { message };
        Err(reported_failure(
            message,
            Some(subtype.to_owned()),
            request_id.clone(),
        ))
    } else {
        Ok(Answer {
            text: message.to_owned(),
            structured: None,
            usage,
        })
    };
    Outcome {
        usage,
        request_id,
        answer,
    }
}

/// Codex's JSONL events: the last agent message, the turns' usage, and any failure.
fn read_codex(program: &str, finished: &Finished) -> Outcome {
    let text = String::from_utf8_lossy(&finished.stdout);
    let mut usage = Usage::default();
    let mut request_id = None;
    let mut message: Option<String> = None;
    let mut failure: Option<String> = None;
    let mut completed = false;
    let mut recognised = false;
    for event in text
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
    {
        recognised |= event["type"].as_str().is_some();
        match event["type"].as_str().unwrap_or_default() {
            "thread.started" => request_id = event["thread_id"].as_str().map(str::to_owned),
            "item.completed" if event["item"]["type"] == "agent_message" => {
                message = event["item"]["text"].as_str().map(str::to_owned);
            }
            "turn.completed" => {
                completed = true;
                let count = |key: &str| event["usage"][key].as_u64().unwrap_or(0);
                usage += Usage {
                    input_tokens: count("input_tokens"),
                    output_tokens: count("output_tokens"),
                };
            }
            "turn.failed" => {
                completed = false;
                failure = Some(
                    event["error"]["message"]
                        .as_str()
                        .unwrap_or("turn failed")
                        .to_owned(),
                );
            }
            "error" => {
                failure = Some(event["message"].as_str().unwrap_or("error").to_owned());
            }
            _ => {}
        }
    }
    let answer = match (completed, failure) {
        (true, _) => Ok(Answer {
            text: message.unwrap_or_default(),
            structured: None,
            usage,
        }),
        (false, Some(failure)) => Err(reported_failure(&failure, None, request_id.clone())),
        (false, None) if recognised && finished.status.success() => Ok(Answer {
            text: message.unwrap_or_default(),
            structured: None,
            usage,
        }),
        (false, None) => Err(no_envelope(program, finished, "Codex JSONL events")),
    };
    Outcome {
        usage,
        request_id,
        answer,
    }
}

/// Output that is not the command's format: a failed run (its exit status and stderr), or a
/// successful one that printed something else (a wrong `command`, a wrapper script).
fn no_envelope(program: &str, finished: &Finished, expected: &str) -> ProviderError {
    let stderr = String::from_utf8_lossy(&finished.stderr);
    let stdout = String::from_utf8_lossy(&finished.stdout);
    let said = if stderr.trim().is_empty() {
        stdout.trim()
    } else {
        stderr.trim()
    };
    if !finished.status.success() {
        let code = finished.status.code().map_or_else(
            || String::from("killed by a signal"),
            |code| format!("exit {code}"),
        );
        let said = if said.is_empty() { "(no output)" } else { said };
        return reported_failure(said, Some(code), None);
    }
    ProviderError::InvalidResponse(Diagnostic {
        status: None,
        code: None,
        request_id: None,
        message: error::clean_message(
            &format!("`{program}` did not print {expected}: {}", said),
            &[],
        ),
    })
}

/// A failure the command reported in words: sorted into the HTTP kinds' classes where the
/// words say which (login, usage limit, unknown model), else [`ProviderError::CommandFailed`].
fn reported_failure(
    message: &str,
    code: Option<String>,
    request_id: Option<String>,
) -> ProviderError {
    let diagnostic = Diagnostic {
        status: None,
        code,
        request_id,
        message: error::clean_message(message, &[]),
    };
    let lower = message.to_lowercase();
    let says = |needles: &[&str]| needles.iter().any(|needle| lower.contains(needle));
    if says(&[
        "usage limit",
        "rate limit",
        "rate_limit",
        "429",
        "too many requests",
    ]) {
        let now = SystemTime::now();
        let retry_after =
            limit_reset(message, now).or_else(|| error::retry_after_from_text(message));
        return ProviderError::RateLimited {
            diagnostic,
            retry_at: retry_after.and_then(|wait| now.checked_add(wait)),
            retry_after,
        };
    }
    if says(&[
        "401",
        "403",
        "unauthorized",
        "invalid api key",
        "not logged in",
        "please run /login",
        "log in again",
        "authentication",
        "oauth token",
    ]) {
        return ProviderError::Auth(diagnostic);
    }
    if lower.contains("model")
        && says(&[
            "not found",
            "not_found",
            "does not exist",
            "not supported",
            "unknown model",
            "invalid model",
        ])
    {
        return ProviderError::ModelUnavailable(diagnostic);
    }
    ProviderError::CommandFailed(diagnostic)
}

/// Claude Code's "usage limit reached|<unix seconds>": the wait until that reset.
fn limit_reset(message: &str, now: SystemTime) -> Option<Duration> {
    let (_, after) = message.split_once('|')?;
    let digits: String = after
        .trim()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let reset = SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(digits.parse().ok()?))?;
    reset.duration_since(now).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reported_failures_are_sorted_by_what_they_say() {
        let auth = reported_failure("Invalid API key · Please run /login", None, None);
        assert!(matches!(auth, ProviderError::Auth(_)), "{auth:?}");
        let model = reported_failure("The model `gpt-9` does not exist", None, None);
        assert!(
            matches!(model, ProviderError::ModelUnavailable(_)),
            "{model:?}"
        );
        let other = reported_failure("stream disconnected before completion", None, None);
        assert!(
            matches!(other, ProviderError::CommandFailed(_)),
            "{other:?}"
        );
        assert!(!other.is_permanent());
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        assert_eq!(
            limit_reset("Claude AI usage limit reached|1600", now),
            Some(Duration::from_secs(600))
        );
        let limited = reported_failure("Claude AI usage limit reached|99999999999", None, None);
        assert!(
            matches!(
                limited,
                ProviderError::RateLimited {
                    retry_at: Some(_),
                    ..
                }
            ),
            "{limited:?}"
        );
    }
}

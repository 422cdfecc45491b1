//! The command-line kinds (`claude_cli`, `codex_cli`) against stand-in executables put first on
//! `PATH`: small shell scripts that record their arguments, working directory, environment and
//! stdin, and print what the test prepared in each command line's documented output shape.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use zuno_shared::config::{Config, parse};
use zuno_shared::provider::{
    CHILD_ENV, LearningModelClient, LearningResponse, ProviderError, ProviderFailure, Usage,
    resolve_model,
};

use crate::harness::{TIMEOUT, VALID, request};

/// A directory holding one stand-in executable (`claude` or `codex`) and what it records.
struct StandIn {
    dir: tempfile::TempDir,
}

impl StandIn {
    /// Writes the stand-in `name`: call `n` records `args.n` (NUL-separated), `cwd.n`, `env.n`
    /// and `stdin.n`, then prints `out.n` (else `out`) and `err.n` on stderr, and exits with
    /// `exit.n` (else 0). With a `hang` file it records its pid and never answers; with a
    /// `straggler` file it leaves a process behind that holds its output pipes.
    fn new(name: &str) -> StandIn {
        let dir = tempfile::tempdir().expect("stand-in dir");
        let d = dir.path().display().to_string();
        let script = format!(
            r#"#!/bin/sh
d='{d}'
n=$(( $(cat "$d/calls" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$d/calls"
printf '%s\0' "$@" > "$d/args.$n"
pwd > "$d/cwd.$n"
env > "$d/env.$n"
cat > "$d/stdin.$n"
if [ -f "$d/hang" ]; then echo $$ > "$d/pid"; exec sleep 600; fi
if [ -f "$d/out.$n" ]; then cat "$d/out.$n"; else cat "$d/out" 2>/dev/null; fi
if [ -f "$d/err.$n" ]; then cat "$d/err.$n" >&2; fi
if [ -f "$d/straggler" ]; then sleep 600 & echo $! > "$d/straggler.pid"; fi
if [ -f "$d/exit.$n" ]; then exit "$(cat "$d/exit.$n")"; fi
exit 0
"#
        );
        let path = dir.path().join(name);
        std::fs::write(&path, script).expect("write stand-in");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        StandIn { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Call `n`'s output (`None`: every call's) and exit status.
    fn answer(&self, n: Option<u32>, stdout: &str, exit: i32) {
        let suffix = n.map_or_else(String::new, |n| format!(".{n}"));
        std::fs::write(self.path().join(format!("out{suffix}")), stdout).unwrap();
        if let Some(n) = n {
            std::fs::write(self.path().join(format!("exit.{n}")), exit.to_string()).unwrap();
        }
    }

    fn stderr(&self, n: u32, text: &str) {
        std::fs::write(self.path().join(format!("err.{n}")), text).unwrap();
    }

    fn calls(&self) -> u32 {
        std::fs::read_to_string(self.path().join("calls"))
            .map_or(0, |text| text.trim().parse().unwrap())
    }

    fn args(&self, n: u32) -> Vec<String> {
        let raw = std::fs::read(self.path().join(format!("args.{n}"))).unwrap();
        raw.split(|byte| *byte == 0)
            .map(|arg| String::from_utf8(arg.to_vec()).unwrap())
            .collect::<Vec<_>>()
            .split_last()
            .map(|(_, args)| args.to_vec())
            .unwrap_or_default()
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.path().join(file)).unwrap()
    }

    /// A model client whose `PATH` puts this directory first (no process environment changes).
    fn client(&self) -> LearningModelClient {
        let path = format!(
            "{}:{}",
            self.path().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        LearningModelClient::new().with_env(move |name| (name == "PATH").then(|| path.clone()))
    }
}

fn config(text: Value) -> Config {
    parse(&text.to_string(), "test").expect("config parses")
}

fn claude_config() -> Config {
    config(json!({
        "providers": { "claude-code": { "api": "claude_cli", "small_model": "haiku" } },
        "learning": { "extractor_model": "claude-code/haiku" }
    }))
}

fn codex_config(model: &str) -> Config {
    config(json!({
        "providers": { "codex": { "api": "codex_cli" } },
        "learning": { "extractor_model": format!("codex/{model}") }
    }))
}

async fn complete(
    stand_in: &StandIn,
    config: &Config,
    timeout: Duration,
) -> Result<LearningResponse, ProviderFailure> {
    let model = resolve_model(config, None).expect("model resolves");
    stand_in
        .client()
        .complete_json(&model, &request(), timeout)
        .await
}

fn claude_result(text: &str, is_error: bool) -> String {
    json!({
        "type": "result", "subtype": "success", "is_error": is_error, "duration_ms": 1200,
        "num_turns": 1, "result": text, "session_id": "sess-cc-1", "total_cost_usd": 0.001,
        "usage": { "input_tokens": 10, "cache_creation_input_tokens": 5,
                   "cache_read_input_tokens": 100, "output_tokens": 7 }
    })
    .to_string()
}

fn codex_events(text: &str) -> String {
    [
        json!({"type": "thread.started", "thread_id": "thread-cx-1"}),
        json!({"type": "turn.started"}),
        json!({"type": "item.completed", "item": {"id": "item_0", "type": "reasoning", "text": "thinking"}}),
        json!({"type": "item.completed", "item": {"id": "item_1", "type": "agent_message", "text": text}}),
        json!({"type": "turn.completed", "usage": {"input_tokens": 1234, "cached_input_tokens": 1024, "output_tokens": 12}}),
    ]
    .iter()
    .map(|event| format!("{event}\n"))
    .collect()
}

/// The value after `flag` in `args`.
fn after<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let at = args.iter().position(|arg| arg == flag)?;
    args.get(at + 1).map(String::as_str)
}

#[tokio::test]
async fn claude_cli_answers_from_its_json_result_in_a_clean_directory() {
    let claude = StandIn::new("claude");
    claude.answer(
        None,
        &claude_result(&format!("```json\n{VALID}\n```"), false),
        0,
    );
    let mut request = request();
    // The prompt is data: shell syntax in it stays text.
    let marker = claude.path().join("pwned");
    request.system = format!(
        "Extract lessons. $(touch {}) `id` \"quoted\"",
        marker.display()
    );
    request.user.push_str("\n; rm -rf ~ && echo '$HOME'");
    let model = resolve_model(&claude_config(), None).unwrap();
    let response = claude
        .client()
        .complete_json(&model, &request, TIMEOUT)
        .await
        .expect("answer");

    assert_eq!(
        response.value,
        serde_json::from_str::<Value>(VALID).unwrap()
    );
    assert!(!response.repaired);
    assert_eq!(response.requests, 1);
    assert_eq!(response.provider_request_id.as_deref(), Some("sess-cc-1"));
    assert_eq!(
        response.usage,
        Usage {
            input_tokens: 115,
            output_tokens: 7
        },
        "cache writes and reads are input the model processed"
    );
    let args = claude.args(1);
    for flag in ["-p", "--no-session-persistence", "--strict-mcp-config"] {
        assert!(args.contains(&flag.to_owned()), "{flag} in {args:?}");
    }
    assert_eq!(after(&args, "--output-format"), Some("json"));
    assert_eq!(after(&args, "--tools"), Some(""), "every tool off");
    assert_eq!(after(&args, "--model"), Some("haiku"));
    assert_eq!(
        after(&args, "--system-prompt"),
        Some(request.system.as_str())
    );
    let settings: Value = serde_json::from_str(after(&args, "--settings").unwrap()).unwrap();
    assert_eq!(settings, json!({"disableAllHooks": true}));
    assert_eq!(claude.read("stdin.1"), request.user);
    assert!(!marker.exists(), "nothing went through a shell");

    let cwd = PathBuf::from(claude.read("cwd.1").trim());
    assert_ne!(cwd, std::env::current_dir().unwrap());
    assert!(cwd.starts_with(std::env::temp_dir()), "{}", cwd.display());
    assert!(!cwd.exists(), "the working directory is removed afterwards");
    let env = claude.read("env.1");
    assert!(
        env.lines().any(|line| line == format!("{CHILD_ENV}=1")),
        "{env}"
    );
    assert!(
        env.lines()
            .any(|line| line == "CLAUDE_CODE_MAX_OUTPUT_TOKENS=4096"),
        "the learning ceiling: {env}"
    );
}

#[tokio::test]
async fn claude_cli_error_results_and_failed_runs_are_typed() {
    let claude = StandIn::new("claude");
    claude.answer(
        Some(1),
        &claude_result("Invalid API key · Please run /login", true),
        1,
    );
    let failure = complete(&claude, &claude_config(), TIMEOUT)
        .await
        .expect_err("error result");
    assert!(
        matches!(failure.error, ProviderError::Auth(_)),
        "{failure:?}"
    );
    assert!(failure.is_permanent());
    assert_eq!(failure.requests, 1, "no repair of a failed call");
    assert_eq!(failure.usage.output_tokens, 7, "what it cost is recorded");
    assert_eq!(failure.provider_request_id.as_deref(), Some("sess-cc-1"));

    // An error result that names no known cause: retryable later, with its diagnostic.
    claude.answer(
        Some(2),
        &json!({"type": "result", "subtype": "error_during_execution", "is_error": true,
                "session_id": "sess-cc-2", "usage": {"input_tokens": 3, "output_tokens": 0}})
        .to_string(),
        1,
    );
    let failure = complete(&claude, &claude_config(), TIMEOUT)
        .await
        .expect_err("error subtype");
    let ProviderError::CommandFailed(diagnostic) = &failure.error else {
        panic!("{failure:?}");
    };
    assert_eq!(diagnostic.code.as_deref(), Some("error_during_execution"));
    assert!(!failure.is_permanent());

    // A run that printed no result at all: its exit status and stderr.
    claude.answer(Some(3), "", 2);
    claude.stderr(3, "error: unknown option '--no-session-persistence'\n");
    let failure = complete(&claude, &claude_config(), TIMEOUT)
        .await
        .expect_err("failed run");
    let ProviderError::CommandFailed(diagnostic) = &failure.error else {
        panic!("{failure:?}");
    };
    assert_eq!(diagnostic.code.as_deref(), Some("exit 2"));
    assert!(
        diagnostic.message.contains("unknown option"),
        "{diagnostic}"
    );

    // Exit 0 with something that is not Claude Code's result: a wrong `command`.
    claude.answer(Some(4), "hello from another program\n", 0);
    let failure = complete(&claude, &claude_config(), TIMEOUT)
        .await
        .expect_err("not a result");
    assert!(
        matches!(failure.error, ProviderError::InvalidResponse(_)),
        "{failure:?}"
    );
}

#[tokio::test]
async fn a_malformed_command_line_answer_is_repaired_once() {
    let claude = StandIn::new("claude");
    claude.answer(
        Some(1),
        &claude_result("Sure! The lessons are: pnpm.", false),
        0,
    );
    claude.answer(Some(2), &claude_result(VALID, false), 0);
    let response = complete(&claude, &claude_config(), TIMEOUT)
        .await
        .expect("repaired");
    assert!(response.repaired);
    assert_eq!(response.requests, 2);
    assert_eq!(response.usage.input_tokens, 230, "both calls count");
    let repair = claude.read("stdin.2");
    assert!(repair.starts_with(&request().user), "{repair}");
    assert!(
        repair.contains("--- Your previous answer ---\nSure! The lessons are: pnpm."),
        "{repair}"
    );
    assert!(
        repair.contains("--- Follow-up ---") && repair.contains("extraction_output"),
        "{repair}"
    );

    // A second bad answer is a typed failure, as over HTTP.
    let codex = StandIn::new("codex");
    codex.answer(None, &codex_events("no JSON here"), 0);
    let failure = complete(&codex, &codex_config("default"), TIMEOUT)
        .await
        .expect_err("malformed twice");
    assert!(
        matches!(failure.error, ProviderError::MalformedAnswer { .. }),
        "{failure:?}"
    );
    assert_eq!(codex.calls(), 2);
}

#[tokio::test]
async fn codex_cli_reads_its_jsonl_events() {
    let codex = StandIn::new("codex");
    codex.answer(None, &codex_events(VALID), 0);
    let response = complete(&codex, &codex_config("default"), TIMEOUT)
        .await
        .expect("answer");
    assert_eq!(
        response.value,
        serde_json::from_str::<Value>(VALID).unwrap()
    );
    assert_eq!(response.provider_request_id.as_deref(), Some("thread-cx-1"));
    assert_eq!(
        response.usage,
        Usage {
            input_tokens: 1234,
            output_tokens: 12
        }
    );
    let args = codex.args(1);
    assert_eq!(&args[..2], ["exec", "--json"]);
    for flag in ["--ephemeral", "--skip-git-repo-check"] {
        assert!(args.contains(&flag.to_owned()), "{flag} in {args:?}");
    }
    assert_eq!(after(&args, "--sandbox"), Some("read-only"));
    assert_eq!(
        args.last().map(String::as_str),
        Some("-"),
        "prompt on stdin"
    );
    assert!(
        !args.contains(&String::from("--model")),
        "`default`: Codex's own model"
    );
    let request = request();
    assert_eq!(
        codex.read("stdin.1"),
        format!("{}\n\n{}", request.system, request.user),
        "no system-prompt option: the system prompt leads"
    );

    let named = StandIn::new("codex");
    named.answer(None, &codex_events(VALID), 0);
    complete(&named, &codex_config("gpt-5-codex-mini"), TIMEOUT)
        .await
        .expect("answer");
    assert_eq!(after(&named.args(1), "--model"), Some("gpt-5-codex-mini"));
}

#[tokio::test]
async fn codex_cli_failures_are_typed() {
    let codex = StandIn::new("codex");
    let failed = [
        json!({"type": "thread.started", "thread_id": "thread-cx-2"}),
        json!({"type": "turn.started"}),
        json!({"type": "error", "message": "Reconnecting... 1/5"}),
        json!({"type": "turn.failed", "error": {"message": "unexpected status 401 Unauthorized: token expired"}}),
    ]
    .iter()
    .map(|event| format!("{event}\n"))
    .collect::<String>();
    codex.answer(Some(1), &failed, 1);
    let failure = complete(&codex, &codex_config("default"), TIMEOUT)
        .await
        .expect_err("turn failed");
    assert!(
        matches!(failure.error, ProviderError::Auth(_)),
        "{failure:?}"
    );
    assert_eq!(failure.provider_request_id.as_deref(), Some("thread-cx-2"));

    let stream = format!(
        "{}\n{}\n",
        json!({"type": "turn.started"}),
        json!({"type": "error", "message": "stream disconnected before completion"})
    );
    codex.answer(Some(2), &stream, 1);
    let failure = complete(&codex, &codex_config("default"), TIMEOUT)
        .await
        .expect_err("error event");
    assert!(
        matches!(&failure.error, ProviderError::CommandFailed(d) if d.message.contains("stream disconnected")),
        "{failure:?}"
    );

    // A reconnect notice before a completed turn is not a failure.
    let recovered = format!(
        "{}\n{}",
        json!({"type": "error", "message": "Reconnecting... 1/5"}),
        codex_events(VALID)
    );
    codex.answer(Some(3), &recovered, 0);
    complete(&codex, &codex_config("default"), TIMEOUT)
        .await
        .expect("recovered");
}

#[tokio::test]
async fn a_command_that_is_not_there_is_a_permanent_failure() {
    let config = config(json!({
        "providers": { "cc": { "api": "claude_cli", "command": "/nonexistent/bin/claude" } },
        "learning": { "extractor_model": "cc/haiku" }
    }));
    let model = resolve_model(&config, None).unwrap();
    let failure = LearningModelClient::new()
        .complete_json(&model, &request(), TIMEOUT)
        .await
        .expect_err("not found");
    assert!(
        matches!(&failure.error, ProviderError::CommandUnavailable { command, .. }
            if command == "/nonexistent/bin/claude"),
        "{failure:?}"
    );
    assert!(failure.is_permanent());
}

#[tokio::test]
async fn the_deadline_kills_the_command() {
    let claude = StandIn::new("claude");
    std::fs::write(claude.path().join("hang"), "").unwrap();
    let deadline = Duration::from_millis(1500);
    let failure = complete(&claude, &claude_config(), deadline)
        .await
        .expect_err("no answer in time");
    assert_eq!(failure.error, ProviderError::Timeout { deadline });
    assert_eq!(failure.requests, 1);
    // The stand-in (this process's child) recorded its pid before hanging. It was killed when
    // the call gave up: waiting for it ends at once with SIGKILL, or with ECHILD when the
    // runtime reaped it first. A child left running would keep the wait, which is bounded.
    let pid: i32 = claude.read("pid").trim().parse().unwrap();
    let waited = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::task::spawn_blocking(move || {
            nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None)
        }),
    )
    .await
    .expect("the child was killed, not left running")
    .unwrap();
    assert!(
        matches!(
            waited,
            Ok(nix::sys::wait::WaitStatus::Signaled(
                _,
                nix::sys::signal::Signal::SIGKILL,
                _
            )) | Err(nix::errno::Errno::ECHILD)
        ),
        "{waited:?}"
    );
}

#[tokio::test]
async fn what_the_command_leaves_running_is_killed_with_it() {
    let codex = StandIn::new("codex");
    codex.answer(None, &codex_events(VALID), 0);
    std::fs::write(codex.path().join("straggler"), "").unwrap();
    // The straggler holds stdout and stderr open: without the group kill the answer would
    // wait for it until the deadline.
    let response = complete(&codex, &codex_config("default"), TIMEOUT)
        .await
        .expect("answer as soon as the command exits");
    // It answered (within the deadline), so the pipes closed: the straggler, their last
    // holder, is gone.
    assert_eq!(response.requests, 1);
    assert!(codex.path().join("straggler.pid").exists());
}

#[tokio::test]
async fn receipts_name_the_command_line_without_headers() {
    let model = resolve_model(&claude_config(), None).unwrap();
    let receipt = LearningModelClient::receipt(&model, &request());
    assert_eq!(receipt["api"], "claude_cli");
    assert_eq!(receipt["endpoint"], "claude -p --output-format json");
    assert_eq!(receipt["headerNames"], json!([]));
    assert_eq!(receipt["parameters"]["command"], "claude");
    let args = receipt["parameters"]["args"].as_array().unwrap();
    assert!(
        !args.iter().any(|arg| arg == "--system-prompt"),
        "the system prompt is the receipt's prompt: {args:?}"
    );
    assert_eq!(receipt["prompt"]["system"], request().system);
}

//! Small hand-written transcripts in the shapes observed in the corpus, and helpers to run the
//! `zuno` binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use zuno_tests::processes::binary;

pub const CC_SESSION: &str = "6f1c2d3e-0000-4000-8000-00000000c0de";
pub const CWD: &str = "/home/someone/src/demo-app";

fn envelope(uuid: &str, parent: Option<&str>, kind: &str, at: &str) -> Value {
    json!({
        "parentUuid": parent, "isSidechain": false, "userType": "external", "cwd": CWD,
        "sessionId": CC_SESSION, "version": "2.1.38", "gitBranch": "main", "type": kind,
        "uuid": uuid, "timestamp": at
    })
}

fn with(mut base: Value, extra: Value) -> Value {
    if let (Some(base), Value::Object(extra)) = (base.as_object_mut(), extra) {
        base.extend(extra);
    }
    base
}

/// Turn 1: a prompt, a tool call that fails, a retry that succeeds, an answer.
/// Turn 2: a user correction and a second tool call. Line 6 is malformed.
pub fn claude_code_lines() -> Vec<String> {
    let lines = vec![
        json!({
            "type": "file-history-snapshot",
            "messageId": "x",
            "snapshot": {
                "trackedFileBackups": {}
            },
            "isSnapshotUpdate": false
        })
        .to_string(),
        with(
            envelope("u1", None, "user", "2026-02-10T21:11:56.000Z"),
            json!({
                "message": {
                    "role": "user",
                    "content": "Install the dependencies"
                }
            }),
        )
        .to_string(),
        with(
            envelope("a1", Some("u1"), "assistant", "2026-02-10T21:11:57.000Z"),
            json!({
                "requestId": "req_1",
                "message": {
                    "model": "claude-opus-4-6",
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "stop_reason": null,
                    "content": [
                        {
                            "type": "thinking",
                            "thinking": "hmm",
                            "signature": "s"
                        }
                    ]
                }
            }),
        )
        .to_string(),
        with(
            envelope("a2", Some("a1"), "assistant", "2026-02-10T21:11:58.000Z"),
            json!({
                "requestId": "req_1",
                "message": {
                    "model": "claude-opus-4-6",
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "stop_reason": null,
                    "content": [
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "Bash",
                            "input": {
                                "command": "npm install"
                            }
                        }
                    ]
                }
            }),
        )
        .to_string(),
        with(
            envelope("r1", Some("a2"), "user", "2026-02-10T21:11:59.000Z"),
            json!({
                "message": {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": "Exit code 1\nnpm ERR! missing lockfile",
                            "is_error": true
                        }
                    ]
                },
                "toolUseResult": "Error: Exit code 1"
            }),
        )
        .to_string(),
        String::from("{\"type\": \"assistant\", \"uuid\": \"broken\", \"message\": {"),
        with(
            envelope("a3", Some("r1"), "assistant", "2026-02-10T21:12:00.000Z"),
            json!({
                "requestId": "req_2",
                "message": {
                    "model": "claude-opus-4-6",
                    "id": "msg_2",
                    "type": "message",
                    "role": "assistant",
                    "stop_reason": null,
                    "content": [
                        {
                            "type": "tool_use",
                            "id": "toolu_2",
                            "name": "Bash",
                            "input": {
                                "command": "pnpm install"
                            }
                        }
                    ]
                }
            }),
        )
        .to_string(),
        with(
            envelope("r2", Some("a3"), "user", "2026-02-10T21:12:01.000Z"),
            json!({
                "message": {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_2",
                            "content": [
                                {
                                    "type": "text",
                                    "text": "Done in 2.1s"
                                }
                            ]
                        }
                    ]
                },
                "toolUseResult": {
                    "stdout": "Done in 2.1s",
                    "stderr": "",
                    "interrupted": false,
                    "isImage": false
                }
            }),
        )
        .to_string(),
        with(
            envelope("a4", Some("r2"), "assistant", "2026-02-10T21:12:02.000Z"),
            json!({
                "requestId": "req_3",
                "message": {
                    "model": "claude-opus-4-6",
                    "id": "msg_3",
                    "type": "message",
                    "role": "assistant",
                    "stop_reason": null,
                    "content": [
                        {
                            "type": "text",
                            "text": "Installed with pnpm after npm failed."
                        }
                    ]
                }
            }),
        )
        .to_string(),
        with(
            envelope("s1", Some("a4"), "system", "2026-02-10T21:12:03.000Z"),
            json!({
                "subtype": "turn_duration",
                "durationMs": 7000
            }),
        )
        .to_string(),
        with(
            envelope("m1", Some("s1"), "user", "2026-02-10T21:12:04.000Z"),
            json!({
                "isMeta": true,
                "message": {
                    "role": "user",
                    "content": "<local-command-stdout>ok</local-command-stdout>"
                }
            }),
        )
        .to_string(),
    ];
    lines
}

/// A second turn (appended later): a correction and a tool call.
pub fn claude_code_second_turn() -> Vec<String> {
    vec![
        with(
            envelope("u2", Some("m1"), "user", "2026-02-10T21:13:00.000Z"),
            json!({
                "message": {
                    "role": "user",
                    "content": "No, don't use npm here, always use pnpm"
                }
            }),
        )
        .to_string(),
        with(
            envelope("a5", Some("u2"), "assistant", "2026-02-10T21:13:01.000Z"),
            json!({
                "requestId": "req_4",
                "message": {
                    "model": "claude-opus-4-6",
                    "id": "msg_4",
                    "type": "message",
                    "role": "assistant",
                    "stop_reason": null,
                    "content": [
                        {
                            "type": "tool_use",
                            "id": "toolu_3",
                            "name": "Edit",
                            "input": {
                                "file_path": "README.md"
                            }
                        }
                    ]
                }
            }),
        )
        .to_string(),
        with(
            envelope("r3", Some("a5"), "user", "2026-02-10T21:13:02.000Z"),
            json!({
                "message": {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_3",
                            "content": "The file README.md has been updated."
                        }
                    ]
                }
            }),
        )
        .to_string(),
        with(
            envelope("a6", Some("r3"), "assistant", "2026-02-10T21:13:03.000Z"),
            json!({
                "requestId": "req_5",
                "message": {
                    "model": "claude-opus-4-6",
                    "id": "msg_5",
                    "type": "message",
                    "role": "assistant",
                    "stop_reason": null,
                    "content": [
                        {
                            "type": "text",
                            "text": "Noted: pnpm only."
                        }
                    ]
                }
            }),
        )
        .to_string(),
    ]
}

/// A subagent sidechain of the same session.
pub fn claude_code_sidechain() -> Vec<String> {
    let side = |uuid: &str, kind: &str, message: Value| {
        with(
            envelope(uuid, None, kind, "2026-02-10T21:12:30.000Z"),
            json!({"isSidechain": true, "agentId": "a881341", "message": message}),
        )
        .to_string()
    };
    vec![
        side(
            "sc1",
            "user",
            json!({"role": "user", "content": "Find the lockfile"}),
        ),
        side(
            "sc2",
            "assistant",
            json!({
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_s1",
                        "name": "Glob",
                        "input": {
                            "pattern": "*.lock"
                        }
                    }
                ]
            }),
        ),
        side(
            "sc3",
            "user",
            json!({
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_s1",
                        "content": "pnpm-lock.yaml"
                    }
                ]
            }),
        ),
        side(
            "sc4",
            "assistant",
            json!({
                "role": "assistant",
                "content": [
                    {
                        "type": "text",
                        "text": "Found pnpm-lock.yaml"
                    }
                ]
            }),
        ),
    ]
}

pub const CODEX_SESSION: &str = "019aad50-a7e6-7422-b7a8-0b384290624f";

/// A Codex rollout: meta, injected context, a prompt, a failing and a passing call, an answer,
/// a second prompt with a custom tool call, a malformed line (5) and an aborted third turn.
pub fn codex_lines() -> Vec<String> {
    let item = |kind: &str, payload: Value| {
        json!({"timestamp": "2025-11-23T10:00:00.000Z", "type": kind, "payload": payload})
            .to_string()
    };
    vec![
        item(
            "session_meta",
            json!({"id": CODEX_SESSION, "timestamp": "2025-11-23T10:00:00.000Z", "cwd": "/home/someone/src/chess", "originator": "codex_cli_rs", "cli_version": "0.60.1", "source": "cli"}),
        ),
        item(
            "response_item",
            json!({
                "type": "message",
                "role": "user",
                "content": [
                    {
                        "type": "input_text",
                        "text": "<environment_context>cwd</environment_context>"
                    }
                ]
            }),
        ),
        item(
            "event_msg",
            json!({"type": "user_message", "message": "Run the tests", "images": []}),
        ),
        item(
            "turn_context",
            json!({"cwd": "/home/someone/src/chess", "model": "gpt-5-codex"}),
        ),
        String::from(
            "{\"timestamp\": \"2025-11-23T10:00:01Z\", \"type\": \"response_item\", \"payload\": ",
        ),
        item(
            "response_item",
            json!({
                "type": "function_call",
                "name": "shell",
                "arguments": "{\"command\":[\"cargo\",\"test\"]}",
                "call_id": "call_1"
            }),
        ),
        item(
            "response_item",
            json!({
                "type": "function_call_output",
                "call_id": "call_1",
                "output": "Exit code: 101\nWall time: 3 seconds\nOutput:\nerror: could not compile"
            }),
        ),
        item(
            "response_item",
            json!({
                "type": "function_call",
                "name": "shell",
                "arguments": "{\"command\":[\"cargo\",\"test\",\"--offline\"]}",
                "call_id": "call_2"
            }),
        ),
        item(
            "response_item",
            json!({
                "type": "function_call_output",
                "call_id": "call_2",
                "output": "Exit code: 0\nWall time: 9 seconds\nOutput:\ntest result: ok"
            }),
        ),
        item(
            "response_item",
            json!({
                "type": "message",
                "role": "assistant",
                "content": [
                    {
                        "type": "output_text",
                        "text": "Tests pass offline."
                    }
                ]
            }),
        ),
        item(
            "event_msg",
            json!({"type": "agent_message", "message": "Tests pass offline."}),
        ),
        item(
            "event_msg",
            json!({"type": "user_message", "message": "Instead, patch the README"}),
        ),
        item(
            "response_item",
            json!({
                "type": "custom_tool_call",
                "name": "apply_patch",
                "input": "*** Begin Patch\n*** End Patch",
                "call_id": "call_3",
                "status": "completed"
            }),
        ),
        item(
            "response_item",
            json!({
                "type": "custom_tool_call_output",
                "call_id": "call_3",
                "output": "{\"output\":\"Success. Updated the following files:\\nM README.md\",\"metadata\":{\"exit_code\":0,\"duration_seconds\":0.1}}"
            }),
        ),
        item(
            "event_msg",
            json!({"type": "user_message", "message": "And run it again"}),
        ),
        item(
            "response_item",
            json!({
                "type": "function_call",
                "name": "shell",
                "arguments": "{\"command\":[\"cargo\",\"test\"]}",
                "call_id": "call_4"
            }),
        ),
        item(
            "event_msg",
            json!({"type": "turn_aborted", "reason": "interrupted"}),
        ),
    ]
}

/// An Aider chat history as aider writes it: every `####` (input) and `>` (output) line ends
/// with two spaces.
pub fn aider_history(lines: &[&str]) -> String {
    let mut text = String::new();
    for line in lines {
        text.push_str(line);
        if line.starts_with("####") || line.starts_with('>') {
            text.push_str("  ");
        }
        text.push('\n');
    }
    text
}

/// Two runs of aider in one history: a prompt with an edit and an `/undo`, a question, then a
/// second run whose reply the user interrupts (7 messages, one eligible turn).
pub fn aider_two_sessions() -> String {
    aider_history(&[
        "",
        "# aider chat started at 2025-01-29 19:33:32",
        "",
        "> /usr/bin/aider --model sonnet",
        "> Aider v0.72.3",
        "",
        "#### Use pnpm, not npm, in this repo.",
        "",
        "Switching the scripts to pnpm.",
        "",
        "> Tokens: 2.5k sent, 312 received.",
        "> Applied edit to package.json",
        "> Commit 1c0a157 build: use pnpm",
        "",
        "#### /undo",
        "> Removed: 1c0a157 build: use pnpm",
        "",
        "#### what does the build script do?",
        "",
        "It runs tsc.",
        "",
        "# aider chat started at 2025-01-29 20:00:00",
        "#### run the tests",
        "",
        "Running them now.",
        "",
        "> ",
        "> ",
        "> ^C again to exit",
    ])
}

/// A third run appended later: an `/add` before the prompt and an edit (3 messages, one
/// eligible turn).
pub fn aider_appended_session() -> String {
    aider_history(&[
        "",
        "# aider chat started at 2025-01-30 09:00:00",
        "#### /add src/app.py",
        "> Added src/app.py to the chat",
        "",
        "#### add a --verbose flag",
        "",
        "Added the flag.",
        "",
        "> Tokens: 1k sent, 10 received.",
        "> Applied edit to src/app.py",
        "> Commit 2b3c4d5 feat: add --verbose",
    ])
}

pub fn write_lines(path: &Path, lines: &[String]) {
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(path, text).expect("write fixture");
}

pub fn append_lines(path: &Path, lines: &[String]) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .expect("open");
    for line in lines {
        writeln!(file, "{line}").expect("append");
    }
}

/// The shared corpus of real transcripts (read in place, never copied).
pub fn corpus() -> PathBuf {
    zuno_tests::fake_provider::corpus_dir()
}

/// `zuno` with a private home and no ambient server, token or database settings.
pub fn zuno(home: &Path) -> Command {
    let mut command = Command::new(binary("zuno"));
    command
        .env("ZUNO_HOME", home)
        .env_remove("ZUNO_API_TOKEN")
        .env_remove("ZUNO_SERVER_URL")
        .env_remove("DATABASE_URL")
        .env_remove("ZUNO_DATABASE_URL")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        // The installers look for a local Ollama: none here (port 9 is closed), so a server on
        // the test machine never changes what they propose.
        .env("OLLAMA_HOST", "127.0.0.1:9")
        .stdin(Stdio::null());
    command
}

pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs a `zuno` command to completion on a blocking thread (the test server keeps running).
pub async fn run(mut command: Command, stdin: Option<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        if stdin.is_some() {
            command.stdin(Stdio::piped());
        }
        let mut child = command.spawn().expect("spawn zuno");
        if let Some(input) = stdin {
            let mut pipe = child.stdin.take().expect("stdin");
            pipe.write_all(input.as_bytes()).expect("write stdin");
        }
        let output = child.wait_with_output().expect("wait zuno");
        Output {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    })
    .await
    .expect("join")
}

pub const REWIND_SESSION: &str = "7a2b3c4d-0000-4000-8000-0000000be11d";

/// A Claude Code session with a rewind, in the documented record shapes: turn 1 installs the
/// dependencies; on the branch the user then abandoned, a prompt (line 6) gets a reply that
/// deletes files and a second prompt (line 10) gets none; the user rewinds to the end of turn 1
/// and asks something else (line 11, same parent as line 6), answered with two parallel tool
/// calls (the second call and the first call's result hang off the chain as a side branch).
pub fn claude_code_rewind_lines() -> Vec<String> {
    let record = |uuid: &str, parent: Option<&str>, kind: &str, second: u32, extra: Value| {
        let base = json!({
            "parentUuid": parent, "isSidechain": false, "userType": "external", "cwd": CWD,
            "sessionId": REWIND_SESSION, "version": "2.1.39", "gitBranch": "main", "type": kind,
            "uuid": uuid, "timestamp": format!("2026-02-11T09:00:{second:02}.000Z")
        });
        with(base, extra).to_string()
    };
    let prompt = |text: &str| json!({"message": {"role": "user", "content": text}});
    let assistant = |id: &str, content: Value| {
        json!({"requestId": format!("req_{id}"), "message": {"model": "claude-opus-4-6", "id": format!("msg_{id}"),
               "type": "message", "role": "assistant", "stop_reason": null, "content": content}})
    };
    let result = |call: &str, text: &str| json!({"message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call, "content": text}]}});
    let bash = |call: &str, command: &str| json!([{"type": "tool_use", "id": call, "name": "Bash", "input": {"command": command}}]);
    vec![
        record("u1", None, "user", 1, prompt("Install the dependencies")),
        record(
            "a1",
            Some("u1"),
            "assistant",
            2,
            assistant("1", bash("toolu_1", "pnpm install")),
        ),
        record(
            "r1",
            Some("a1"),
            "user",
            3,
            result("toolu_1", "Done in 2.1s"),
        ),
        record(
            "a2",
            Some("r1"),
            "assistant",
            4,
            assistant(
                "2",
                json!([{"type": "text", "text": "Installed with pnpm."}]),
            ),
        ),
        record(
            "s1",
            Some("a2"),
            "system",
            5,
            json!({"subtype": "turn_duration", "durationMs": 4000}),
        ),
        // The branch the user abandoned.
        record(
            "u2",
            Some("a2"),
            "user",
            6,
            prompt("Now delete the lockfile and node_modules"),
        ),
        record(
            "a3",
            Some("u2"),
            "assistant",
            7,
            assistant("3", bash("toolu_2", "rm -rf pnpm-lock.yaml node_modules")),
        ),
        record("r2", Some("a3"), "user", 8, result("toolu_2", "")),
        record(
            "a4",
            Some("r2"),
            "assistant",
            9,
            assistant("4", json!([{"type": "text", "text": "Deleted both."}])),
        ),
        record(
            "u3",
            Some("a4"),
            "user",
            10,
            prompt("Always wipe the cache too from now on"),
        ),
        // The rewind: a new prompt under the end of turn 1.
        record(
            "u4",
            Some("a2"),
            "user",
            11,
            prompt("Run the tests and the linter instead"),
        ),
        record(
            "a5",
            Some("u4"),
            "assistant",
            12,
            assistant("5", bash("toolu_3", "pnpm test")),
        ),
        record(
            "a6",
            Some("a5"),
            "assistant",
            13,
            assistant("5", bash("toolu_4", "pnpm lint")),
        ),
        record(
            "r4",
            Some("a6"),
            "user",
            14,
            result("toolu_4", "0 problems"),
        ),
        record("r3", Some("a5"), "user", 15, result("toolu_3", "12 passed")),
        record(
            "a7",
            Some("r3"),
            "assistant",
            16,
            assistant(
                "6",
                json!([{"type": "text", "text": "Tests and lint pass."}]),
            ),
        ),
        record(
            "s2",
            Some("a7"),
            "system",
            17,
            json!({"subtype": "turn_duration", "durationMs": 5000}),
        ),
    ]
}

/// The project rule the hook tests expect the agent to be told.
pub const PNPM_RULE: &str = "Always use pnpm, never npm, to install dependencies.";

/// Adds `content` as a user's project rule through the Memory API, and returns the outcome.
pub async fn add_project_rule(
    server: &zuno_tests::server::TestServer,
    project: &str,
    content: &str,
) -> Value {
    let (status, outcome) = server
        .post(
            &format!("/api/projects/{project}/memory"),
            json!({"target": "project", "action": "add", "content": content,
                   "reason": "the user said so", "confidence": 0.95, "origin": "user"}),
        )
        .await;
    assert_eq!(status, 201, "{outcome}");
    outcome
}

//! `zuno hook codex <event>` with payloads built from Codex's hook input schemas (in the corpus,
//! read in place), answers checked against its output schema, and the Stop import of the real
//! Codex rollout from a durable watermark; and `zuno install codex` in a temporary HOME.

use serde_json::{Value, json};
use zuno_shared::config::Config;
use zuno_shared::transcript::import::{self, Host, Position};
use zuno_tests::server::TestServer;
use zuno_tests::{TestDb, on_both_backends};

use crate::fixtures::*;
use crate::schema::{codex_schema, payload, violations};

async fn codex_hook(home: &std::path::Path, server: &str, event: &str, input: &Value) -> Output {
    let mut command = zuno(home);
    command.args(["hook", "codex", event, "--server", server]);
    run(command, Some(input.to_string())).await
}

const THREAD: &str = "019b0c11-5e2a-7c30-9d41-2f6a8b7c9d10";

fn real_rollout() -> std::path::PathBuf {
    corpus()
        .join("codex-rollout")
        .join("rtchess-rollout-019aad50-a7e6-7422-b7a8-0b384290624f.jsonl")
}

async fn codex_hooks_inject_memory_and_context_per_the_output_schema(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    let home = server.home();
    let worktree = tempfile::tempdir().unwrap();
    let cwd = worktree.path().to_string_lossy().into_owned();
    let prompt_input = payload(
        &codex_schema("user-prompt-submit.command.input"),
        &json!({"session_id": THREAD, "cwd": cwd, "model": "gpt-5.1-codex", "turn_id": "turn-1",
                "prompt": "how do I install the dependencies?"}),
    );
    assert_eq!(
        prompt_input["transcript_path"],
        Value::Null,
        "nullable in Codex"
    );
    // Codex's SessionStart input schema is not in the corpus; these are its fields as the
    // Codex hook documentation gives them.
    let start_input = json!({"session_id": THREAD, "transcript_path": null, "cwd": cwd,
        "hook_event_name": "SessionStart", "model": "gpt-5.1-codex", "permission_mode": "default",
        "source": "startup", "active_profile": null});

    let empty = codex_hook(home, &server.base, "SessionStart", &start_input).await;
    assert_eq!(empty.code, 0, "{}", empty.stderr);
    assert_eq!(empty.stdout.trim(), "", "no Memory yet, no answer");
    let (project, _) = zuno_shared::transcript::import::project_for_cwd(&cwd);
    let (status, session) = server.get(&format!("/api/session/cx-{THREAD}")).await;
    assert_eq!(status, 200, "the hook created the session: {session}");
    assert_eq!(session["projectId"], project.as_str());

    add_project_rule(&server, &project, PNPM_RULE).await;

    let answer = codex_hook(home, &server.base, "UserPromptSubmit", &prompt_input).await;
    assert_eq!(answer.code, 0, "{}", answer.stderr);
    let answer: Value = serde_json::from_str(answer.stdout.trim()).expect(&answer.stdout);
    let problems = violations(&codex_schema("user-prompt-submit.command.output"), &answer);
    assert!(problems.is_empty(), "{problems:?}: {answer}");
    assert_eq!(
        answer["hookSpecificOutput"]["hookEventName"],
        "UserPromptSubmit"
    );
    let context = answer["hookSpecificOutput"]["additionalContext"]
        .as_str()
        .unwrap();
    assert!(context.contains("Always use pnpm"), "{context}");

    let start = codex_hook(home, &server.base, "SessionStart", &start_input).await;
    let start: Value = serde_json::from_str(start.stdout.trim()).expect(&start.stdout);
    assert_eq!(
        start,
        json!({"hookSpecificOutput": {"hookEventName": "SessionStart",
               "additionalContext": start["hookSpecificOutput"]["additionalContext"]}}),
        "exactly the fields Codex's SessionStart output allows"
    );
    assert!(
        start["hookSpecificOutput"]["additionalContext"]
            .as_str()
            .unwrap()
            .contains("Always use pnpm")
    );
}

async fn codex_stop_imports_the_real_rollout_from_a_durable_watermark(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    let home = server.home();
    let text = std::fs::read_to_string(real_rollout()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // Codex has written the rollout up to its 20th prompt (line 1014) when the first Stop runs.
    let split = 1013;
    let dir = tempfile::tempdir().unwrap();
    let rollout = dir
        .path()
        .join("rollout-2025-11-23T10-00-00-019aad50.jsonl");
    std::fs::write(&rollout, lines[..split].join("\n") + "\n").unwrap();
    let stop = |transcript: &std::path::Path| {
        payload(
            &codex_schema("stop.command.input"),
            &json!({"session_id": CODEX_SESSION, "cwd": "/tmp", "model": "gpt-5.1-codex",
                    "turn_id": "turn-20", "transcript_path": transcript,
                    "last_assistant_message": "Done."}),
        )
    };
    let input = stop(&rollout);
    let session = format!("cx-{CODEX_SESSION}");
    let first = codex_hook(home, &server.base, "Stop", &input).await;
    assert_eq!(first.code, 0, "{}", first.stderr);
    assert_eq!(first.stdout, "", "Stop answers nothing");
    let after_first = stored_messages(&server, &session).await;
    assert!(after_first > 20, "{after_first}");
    let marks: Vec<_> = std::fs::read_dir(home.join("hooks").join("codex"))
        .unwrap()
        .collect();
    assert_eq!(marks.len(), 1, "one watermark for the rollout");

    // The rest of the session is appended; the next Stop reads only that, without the
    // `session_meta` record (the watermark remembers the session).
    append_lines(
        &rollout,
        &lines[split..]
            .iter()
            .map(|l| (*l).to_owned())
            .collect::<Vec<_>>(),
    );
    let second = codex_hook(home, &server.base, "Stop", &input).await;
    assert_eq!(second.code, 0, "{}", second.stderr);
    assert!(!second.stderr.contains("session_meta"), "{}", second.stderr);
    let full = import::parse(
        Host::Codex,
        std::io::Cursor::new(text.clone().into_bytes()),
        Position::default(),
    )
    .unwrap();
    let expected = full.sessions[0].messages.len();
    assert_eq!(
        stored_messages(&server, &session).await,
        expected,
        "the two Stops stored the whole session"
    );

    let third = codex_hook(home, &server.base, "Stop", &input).await;
    assert_eq!(third.code, 0);
    assert_eq!(
        stored_messages(&server, &session).await,
        expected,
        "nothing new, nothing added"
    );

    // The same messages a whole-file import makes: importing it again adds nothing.
    let mut command = zuno(home);
    command
        .args(["import", "codex", "--json", "--server", &server.base])
        .arg(&rollout);
    let again = run(command, None).await;
    assert_eq!(again.code, 0, "{}", again.stderr);
    let report: Value = serde_json::from_str(&again.stdout).unwrap();
    assert_eq!(report["messagesAdded"], 0, "{report}");
    assert_eq!(report["messagesExisting"], expected);
}

/// Every stored message of a session, paging by sequence number.
async fn stored_messages(server: &TestServer, session: &str) -> usize {
    let mut after = 0;
    let mut total = 0;
    loop {
        let (status, page) = server
            .get(&format!(
                "/api/session/{session}/messages?after={after}&limit=1000"
            ))
            .await;
        assert_eq!(status, 200, "{page}");
        let page = page.as_array().unwrap();
        let Some(last) = page.last() else {
            return total;
        };
        total += page.len();
        after = last["seq"].as_i64().unwrap();
    }
}

on_both_backends!(
    codex_hooks_inject_memory_and_context_per_the_output_schema,
    codex_stop_imports_the_real_rollout_from_a_durable_watermark,
);

#[tokio::test]
async fn a_codex_hook_that_fails_prints_nothing_and_exits_zero() {
    let home = tempfile::tempdir().unwrap();
    let input = payload(
        &codex_schema("user-prompt-submit.command.input"),
        &json!({"session_id": THREAD, "cwd": "/tmp", "prompt": "hello"}),
    );
    for event in ["SessionStart", "UserPromptSubmit", "Stop", "PostToolUse"] {
        let out = codex_hook(home.path(), "http://127.0.0.1:9", event, &input).await;
        assert_eq!(out.code, 0, "{event}: {}", out.stderr);
        assert_eq!(out.stdout, "", "{event}: nothing on stdout");
    }
    let missing = payload(
        &codex_schema("stop.command.input"),
        &json!({"session_id": THREAD, "transcript_path": "/nonexistent/rollout.jsonl"}),
    );
    let out = codex_hook(home.path(), "http://127.0.0.1:9", "Stop", &missing).await;
    assert_eq!((out.code, out.stdout.as_str()), (0, ""));
    let mut command = zuno(home.path());
    command.args(["hook", "codex", "Stop", "--server", "http://127.0.0.1:9"]);
    let garbage = run(command, Some(String::from("{\"session_id\": 7}"))).await;
    assert_eq!((garbage.code, garbage.stdout.as_str()), (0, ""));
    assert!(
        garbage.stderr.contains("invalid hook input"),
        "{}",
        garbage.stderr
    );
}

/// The installer in a temporary HOME: diff first, `--yes` writes, a second run changes
/// nothing, and `--uninstall --yes` gives back the user's files as they were.
#[tokio::test]
async fn install_codex_is_idempotent_and_reversible_in_a_temporary_home() {
    let home = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let codex = home.path().join(".codex");
    std::fs::create_dir_all(&codex).unwrap();
    let config = codex.join("config.toml");
    let original = "# my Codex settings\nmodel = \"gpt-5.1-codex\"\n\n[mcp_servers.docs]\ncommand = \"docs-mcp\" # the docs server\nargs = [\"--stdio\"]\n";
    std::fs::write(&config, original).unwrap();
    let hooks = codex.join("hooks.json");
    let user_hooks = json!({"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "notify-send done", "timeout": 5}]}]}});
    std::fs::write(&hooks, serde_json::to_string_pretty(&user_hooks).unwrap()).unwrap();
    let install = |flags: &[&str]| {
        let mut command = zuno(data.path());
        command
            .env("HOME", home.path())
            .env_remove("CODEX_HOME")
            .args(["install", "codex", "--server", "http://127.0.0.1:7878"])
            .args(flags);
        command
    };

    let preview = run(install(&[]), None).await;
    assert_eq!(preview.code, 0, "{}", preview.stderr);
    assert!(
        preview.stdout.contains("+ [mcp_servers.zuno]"),
        "{}",
        preview.stdout
    );
    assert!(
        preview.stdout.contains("hook codex UserPromptSubmit"),
        "{}",
        preview.stdout
    );
    assert!(
        preview.stdout.contains("nothing written"),
        "{}",
        preview.stdout
    );
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        original,
        "no --yes, no write"
    );

    let applied = run(install(&["--yes"]), None).await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    let written = std::fs::read_to_string(&config).unwrap();
    assert!(
        written.starts_with(original),
        "the user's text is kept as written:\n{written}"
    );
    let document: toml_edit::DocumentMut = written.parse().unwrap();
    let zuno_server = &document["mcp_servers"]["zuno"];
    assert!(zuno_server["command"].as_str().unwrap().ends_with("zuno"));
    let args: Vec<&str> = zuno_server["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let data_dir = data.path().to_string_lossy().into_owned();
    assert_eq!(
        args,
        [
            "--home",
            &data_dir,
            "mcp",
            "--server",
            "http://127.0.0.1:7878"
        ]
    );
    assert_eq!(document["features"]["codex_hooks"].as_bool(), Some(true));
    let hooks_now: Value = serde_json::from_str(&std::fs::read_to_string(&hooks).unwrap()).unwrap();
    for event in ["SessionStart", "UserPromptSubmit", "Stop"] {
        let ours: Vec<&Value> = hooks_now["hooks"][event]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|group| group["hooks"].as_array().unwrap())
            .filter(|h| h["command"].as_str().unwrap().contains(" hook codex "))
            .collect();
        assert_eq!(ours.len(), 1, "{event}");
        assert!(ours[0]["command"].as_str().unwrap().ends_with(&format!(
            "hook codex {event} --server http://127.0.0.1:7878"
        )));
        assert!(ours[0]["timeout"].as_u64().unwrap() <= 30);
    }
    assert_eq!(
        hooks_now["hooks"]["Stop"][0],
        user_hooks["hooks"]["Stop"][0]
    );
    for file in [&config, &hooks] {
        let text = std::fs::read_to_string(file).unwrap();
        assert!(
            !text.to_lowercase().contains("token"),
            "no token in {}: {text}",
            file.display()
        );
    }

    let config_before = std::fs::read_to_string(&config).unwrap();
    let hooks_before = std::fs::read_to_string(&hooks).unwrap();
    let again = run(install(&["--yes"]), None).await;
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(
        again.stdout.matches("already up to date").count(),
        2,
        "{}",
        again.stdout
    );
    assert_eq!(std::fs::read_to_string(&config).unwrap(), config_before);
    assert_eq!(std::fs::read_to_string(&hooks).unwrap(), hooks_before);

    let removal_preview = run(install(&["--uninstall"]), None).await;
    assert_eq!(removal_preview.code, 0, "{}", removal_preview.stderr);
    assert!(
        removal_preview.stdout.contains("- [mcp_servers.zuno]"),
        "{}",
        removal_preview.stdout
    );
    assert_eq!(std::fs::read_to_string(&config).unwrap(), config_before);

    let removed = run(install(&["--uninstall", "--yes"]), None).await;
    assert_eq!(removed.code, 0, "{}", removed.stderr);
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        original,
        "byte for byte"
    );
    assert_eq!(
        std::fs::read_to_string(&hooks).unwrap(),
        serde_json::to_string_pretty(&user_hooks).unwrap(),
        "hooks.json byte for byte too"
    );
    let nothing = run(install(&["--uninstall", "--yes"]), None).await;
    assert_eq!(nothing.code, 0, "{}", nothing.stderr);
    assert_eq!(std::fs::read_to_string(&config).unwrap(), original);

    // A user who turned hooks off keeps that choice; the installer says so.
    std::fs::write(&config, "[features]\nhooks = false\n").unwrap();
    let off = run(install(&["--yes"]), None).await;
    assert_eq!(off.code, 0, "{}", off.stderr);
    assert!(off.stdout.contains("turns hooks off"), "{}", off.stdout);
    let document: toml_edit::DocumentMut =
        std::fs::read_to_string(&config).unwrap().parse().unwrap();
    assert_eq!(document["features"]["hooks"].as_bool(), Some(false));
    assert!(document["features"].get("codex_hooks").is_none());

    // Starting from nothing, install then uninstall leaves nothing behind.
    let fresh = tempfile::tempdir().unwrap();
    let mut command = zuno(data.path());
    command
        .env("HOME", fresh.path())
        .env_remove("CODEX_HOME")
        .args(["install", "codex", "--yes"]);
    assert_eq!(run(command, None).await.code, 0);
    assert!(fresh.path().join(".codex/config.toml").exists());
    let mut command = zuno(data.path());
    command
        .env("HOME", fresh.path())
        .env_remove("CODEX_HOME")
        .args(["install", "codex", "--uninstall", "--yes"]);
    let out = run(command, None).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        !fresh.path().join(".codex/config.toml").exists(),
        "{}",
        out.stdout
    );
    assert!(
        !fresh.path().join(".codex/hooks.json").exists(),
        "{}",
        out.stdout
    );
}

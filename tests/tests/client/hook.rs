//! `zuno hook claude-code <event>`: the hook's stdout format, memory and context injection,
//! incremental Stop import, and silence when the server is down.

use serde_json::{Value, json};
use zuno_shared::config::Config;
use zuno_shared::transcript::import::project_for_cwd;
use zuno_tests::TestDb;
use zuno_tests::server::TestServer;

use crate::fixtures::*;

async fn hook(home: &std::path::Path, server: &str, event: &str, input: Value) -> Output {
    let mut command = zuno(home);
    command.args(["hook", "claude-code", event, "--server", server]);
    run(command, Some(input.to_string())).await
}

fn additional_context(output: &Output, event: &str) -> String {
    assert_eq!(output.code, 0, "{}", output.stderr);
    let answer: Value = serde_json::from_str(output.stdout.trim()).expect(&output.stdout);
    assert_eq!(answer["hookSpecificOutput"]["hookEventName"], event);
    answer["hookSpecificOutput"]["additionalContext"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn session_start_injects_memory_and_prompt_submit_returns_the_context_sections() {
    let db = TestDb::sqlite().await;
    let server = TestServer::start(&db, Config::default(), None).await;
    // The hook runs with the server's data directory and no token: it finds the local token.
    let home = server.home();
    let worktree = tempfile::tempdir().unwrap();
    // A repository: hooks bind only a repository root.
    std::fs::create_dir(worktree.path().join(".git")).unwrap();
    let cwd = worktree.path().to_string_lossy().into_owned();
    let input = |event: &str, prompt: Option<&str>| {
        let mut input = json!({
            "session_id": "11111111-2222-4333-8444-555555555555",
            "transcript_path": worktree.path().join("t.jsonl"),
            "cwd": cwd, "hook_event_name": event, "permission_mode": "default",
            "source": "startup", "model": "claude-opus-4-6", "turn_id": "t1"
        });
        if let Some(prompt) = prompt {
            input["prompt"] = Value::from(prompt);
        }
        input
    };

    // Nothing learned yet: the hook creates the project and session and adds nothing.
    let empty = hook(
        home,
        &server.base,
        "SessionStart",
        input("SessionStart", None),
    )
    .await;
    assert_eq!(empty.code, 0, "{}", empty.stderr);
    assert_eq!(empty.stdout.trim(), "", "no memory, no output");
    let (project, _) = project_for_cwd(&cwd);
    let (status, created) = server.get(&format!("/api/projects/{project}")).await;
    assert_eq!(status, 200, "{created}");
    assert_eq!(created["worktree"], cwd.as_str());

    let outcome = add_project_rule(&server, &project, PNPM_RULE).await;
    assert_eq!(outcome["applied"], true, "{outcome}");

    let start = hook(
        home,
        &server.base,
        "SessionStart",
        input("SessionStart", None),
    )
    .await;
    let context = additional_context(&start, "SessionStart");
    assert!(context.contains("Always use pnpm"), "{context}");

    let prompt = hook(
        home,
        &server.base,
        "UserPromptSubmit",
        input(
            "UserPromptSubmit",
            Some("how do I install the dependencies?"),
        ),
    )
    .await;
    let context = additional_context(&prompt, "UserPromptSubmit");
    assert!(context.contains("Always use pnpm"), "{context}");
}

#[tokio::test]
async fn an_unavailable_server_or_bad_input_prints_nothing_and_exits_zero() {
    let home = tempfile::tempdir().unwrap();
    let transcript = home.path().join("t.jsonl");
    write_lines(&transcript, &claude_code_lines());
    let input = json!({"session_id": "s-1", "cwd": "/tmp", "transcript_path": transcript,
                       "hook_event_name": "UserPromptSubmit", "prompt": "hello"});
    for event in ["SessionStart", "UserPromptSubmit", "Stop", "PreToolUse"] {
        let out = hook(home.path(), "http://127.0.0.1:9", event, input.clone()).await;
        assert_eq!(out.code, 0, "{event}: {}", out.stderr);
        assert_eq!(out.stdout, "", "{event}: nothing on stdout");
    }
    let mut command = zuno(home.path());
    command.args([
        "hook",
        "claude-code",
        "UserPromptSubmit",
        "--server",
        "http://127.0.0.1:9",
    ]);
    let garbage = run(command, Some(String::from("not json"))).await;
    assert_eq!(garbage.code, 0);
    assert_eq!(garbage.stdout, "");
    assert!(
        garbage.stderr.contains("invalid hook input"),
        "{}",
        garbage.stderr
    );
}

async fn message_count(server: &TestServer, session: &str) -> usize {
    let (status, messages) = server
        .get(&format!("/api/session/{session}/messages"))
        .await;
    assert_eq!(status, 200, "{messages}");
    messages.as_array().unwrap().len()
}

#[tokio::test]
async fn stop_imports_newly_closed_turns_from_a_durable_watermark() {
    let db = TestDb::sqlite().await;
    let server = TestServer::start(&db, Config::default(), None).await;
    let home = server.home();
    let dir = tempfile::tempdir().unwrap();
    let transcript = dir.path().join(format!("{CC_SESSION}.jsonl"));
    write_lines(&transcript, &claude_code_lines());
    let input = json!({"session_id": CC_SESSION, "cwd": CWD, "transcript_path": transcript,
                       "hook_event_name": "Stop", "stop_hook_active": false});
    let session = format!("cc-{CC_SESSION}");
    let first = hook(home, &server.base, "Stop", input.clone()).await;
    assert_eq!(first.code, 0, "{}", first.stderr);
    assert_eq!(first.stdout, "");
    assert!(first.stderr.contains(":6: skipped"), "{}", first.stderr);
    assert_eq!(
        message_count(&server, &session).await,
        3,
        "prompt, closed turn, injected output"
    );
    let marks: Vec<_> = std::fs::read_dir(home.join("hooks").join("claude-code"))
        .unwrap()
        .collect();
    assert_eq!(marks.len(), 1, "one durable watermark for the transcript");

    // The next reply appends a turn: only it is read and imported.
    append_lines(&transcript, &claude_code_second_turn());
    let second = hook(home, &server.base, "Stop", input.clone()).await;
    assert_eq!(second.code, 0, "{}", second.stderr);
    assert!(
        !second.stderr.contains("skipped"),
        "the malformed line before the watermark is not read again: {}",
        second.stderr
    );
    assert_eq!(message_count(&server, &session).await, 5);
    let (_, page) = server
        .get(&format!("/api/jobs?kind=extract&sessionId={session}"))
        .await;
    assert_eq!(page["jobs"].as_array().unwrap().len(), 2, "{page}");

    let third = hook(home, &server.base, "Stop", input).await;
    assert_eq!(third.code, 0);
    assert_eq!(
        message_count(&server, &session).await,
        5,
        "nothing new, nothing added"
    );
}

/// `zuno serve` started as the README starts it (no token, no configuration), then the hook and
/// the CLI as a user's agent runs them, with the same data directory and no token given: they
/// find the generated local token. A client of the same machine that names no token and has
/// another data directory is refused.
#[tokio::test]
async fn a_fresh_server_and_its_local_clients_need_no_configuration() {
    let home = tempfile::tempdir().unwrap();
    let (server, banner, base, mut lines) = zuno_tests::processes::serve(
        tokio::process::Command::from(zuno(home.path())).args(["serve", "--bind", "127.0.0.1:0"]),
        std::process::Stdio::null(),
    )
    .await;
    assert!(banner.contains("local token"), "{banner}");
    let link = lines.next_line().await.unwrap().unwrap();
    assert!(link.contains("/ui#code="), "{link}");
    let token_file = home.path().join("local-token");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&token_file).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);

    // The hook: creates the project and the session through the API. The working directory
    // is outside the server's worktree roots (the home directory), so the project is created
    // without a worktree, and the hook says so on stderr only.
    let cwd = tempfile::tempdir().unwrap();
    let input = json!({"session_id": "33333333-2222-4333-8444-555555555555",
        "cwd": cwd.path(), "hook_event_name": "SessionStart", "source": "startup"});
    let start = hook(home.path(), &base, "SessionStart", input).await;
    assert_eq!(start.code, 0, "{}", start.stderr);
    assert!(!start.stderr.contains("401"), "{}", start.stderr);
    let (project, _) = project_for_cwd(&cwd.path().to_string_lossy());

    // The CLI against the server.
    let mut status = zuno(home.path());
    status.args([
        "learn",
        "--project",
        &project,
        "--json",
        "status",
        "--server",
        &base,
    ]);
    let status = run(status, None).await;
    assert_eq!(status.code, 0, "{}", status.stderr);
    let status: Value = serde_json::from_str(&status.stdout).unwrap();
    assert!(status.is_object(), "{status}");

    // Another data directory holds no token: refused, with exit code 1 (HTTP 401).
    let stranger = tempfile::tempdir().unwrap();
    let mut refused = zuno(stranger.path());
    refused.args(["learn", "--project", &project, "status", "--server", &base]);
    let refused = run(refused, None).await;
    assert_ne!(refused.code, 0);
    assert!(refused.stderr.contains("401"), "{}", refused.stderr);
    drop(server);
}

/// A rewind seen by the Stop hook: the abandoned turn was imported (and its extraction admitted)
/// by an earlier Stop, while it was the live branch. When the session goes back and continues
/// elsewhere, the next Stop marks that turn `failed` (its queued extraction no longer matches its
/// source and is skipped), stores the unanswered abandoned prompt as injected, and imports the
/// continued turn, which reads the abandoned one only as context.
async fn stop_after_a_rewind_fails_the_abandoned_turn_already_imported(db: TestDb) {
    use zuno_shared::learning::{SourceCheck, SourceSnapshot};
    let server = TestServer::start(&db, Config::default(), None).await;
    let home = server.home();
    let dir = tempfile::tempdir().unwrap();
    let transcript = dir.path().join(format!("{REWIND_SESSION}.jsonl"));
    let lines = claude_code_rewind_lines();
    write_lines(&transcript, &lines[..9]);
    let input = json!({"session_id": REWIND_SESSION, "cwd": CWD, "transcript_path": transcript,
                       "hook_event_name": "Stop", "stop_hook_active": false});
    let session = format!("cc-{REWIND_SESSION}");
    let first = hook(home, &server.base, "Stop", input.clone()).await;
    assert_eq!(first.code, 0, "{}", first.stderr);
    assert_eq!(message_count(&server, &session).await, 4);
    let (_, page) = server
        .get(&format!("/api/jobs?kind=extract&sessionId={session}"))
        .await;
    assert_eq!(page["jobs"].as_array().unwrap().len(), 2, "{page}");

    append_lines(&transcript, &lines[9..]);
    let second = hook(home, &server.base, "Stop", input.clone()).await;
    assert_eq!(second.code, 0, "{}", second.stderr);
    assert_eq!(second.stdout, "");
    let (_, messages) = server
        .get(&format!("/api/session/{session}/messages"))
        .await;
    let messages = messages.as_array().unwrap().clone();
    let statuses: Vec<&str> = messages
        .iter()
        .map(|m| m["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        [
            "completed",
            "completed",
            "completed",
            "failed",
            "completed",
            "completed",
            "completed"
        ]
    );
    assert_eq!(messages[4]["parts"][0]["injected"], true, "{}", messages[4]);
    assert_eq!(messages[5]["parts"][0]["injected"], false);

    let (_, page) = server
        .get(&format!("/api/jobs?kind=extract&sessionId={session}"))
        .await;
    let jobs = page["jobs"].as_array().unwrap().clone();
    assert_eq!(jobs.len(), 3, "{page}");
    let mut tx = db.db.begin_read().await.unwrap();
    let mut checked = 0;
    for job in &jobs {
        let snapshot = SourceSnapshot::load_in(&mut tx, job["id"].as_str().unwrap())
            .await
            .unwrap()
            .unwrap();
        let check = snapshot.check_in(&mut tx).await.unwrap();
        if snapshot.end_message_id == messages[3]["id"].as_str().unwrap() {
            assert!(
                matches!(&check, SourceCheck::Changed(reason) if reason.contains("failed")),
                "the abandoned turn's job no longer matches its source: {check:?}"
            );
            checked += 1;
        } else {
            assert!(matches!(check, SourceCheck::Current(_)), "{check:?}");
        }
    }
    tx.rollback().await.unwrap();
    assert_eq!(checked, 1);

    let third = hook(home, &server.base, "Stop", input).await;
    assert_eq!(third.code, 0, "{}", third.stderr);
    assert_eq!(
        message_count(&server, &session).await,
        7,
        "nothing new, nothing added"
    );
}

/// `PreToolUse`: an approved guard makes the hook answer Claude Code with `permissionDecision:
/// ask` and the lesson; Codex (whose hooks cannot ask) gets a warning; an allowed call gets no
/// output at all.
#[tokio::test]
async fn pre_tool_use_asks_for_a_guarded_call_and_stays_silent_otherwise() {
    let db = TestDb::sqlite().await;
    let server = TestServer::start(&db, Config::default(), None).await;
    let home = server.home();
    let worktree = tempfile::tempdir().unwrap();
    std::fs::create_dir(worktree.path().join(".git")).unwrap();
    std::fs::create_dir(worktree.path().join("src")).unwrap();
    let root = worktree.path().to_string_lossy().into_owned();
    // The calls come from a subdirectory: the guard is the repository's.
    let cwd = worktree.path().join("src").to_string_lossy().into_owned();
    let start = json!({"session_id": "s-guard", "cwd": cwd, "hook_event_name": "SessionStart",
                       "source": "startup", "transcript_path": null});
    let started = hook(home, &server.base, "SessionStart", start).await;
    assert_eq!(started.code, 0, "{}", started.stderr);
    let (project, _) = project_for_cwd(&root);
    add_project_rule(&server, &project, "Use pnpm, not npm.").await;
    let (_, guards) = server.get(&format!("/api/projects/{project}/guards")).await;
    let id = guards[0]["id"].as_str().unwrap().to_owned();
    let (status, _) = server
        .post(&format!("/api/guards/{id}/approve"), json!({}))
        .await;
    assert_eq!(status, 200);

    let call = |command: &str| {
        json!({"session_id": "s-guard", "cwd": cwd, "hook_event_name": "PreToolUse",
               "tool_name": "Bash", "tool_input": {"command": command}, "tool_use_id": "t1",
               "transcript_path": null, "permission_mode": "default"})
    };
    let asked = hook(
        home,
        &server.base,
        "PreToolUse",
        call("npm install left-pad"),
    )
    .await;
    assert_eq!(asked.code, 0, "{}", asked.stderr);
    let answer: Value = serde_json::from_str(asked.stdout.trim()).expect(&asked.stdout);
    let output = &answer["hookSpecificOutput"];
    assert_eq!(output["hookEventName"], "PreToolUse");
    assert_eq!(output["permissionDecision"], "ask");
    let reason = output["permissionDecisionReason"].as_str().unwrap();
    assert!(
        reason.contains("Use pnpm, not npm.") && reason.contains(&id),
        "{reason}"
    );

    let allowed = hook(
        home,
        &server.base,
        "PreToolUse",
        call("pnpm install left-pad"),
    )
    .await;
    assert_eq!(
        (allowed.code, allowed.stdout.as_str()),
        (0, ""),
        "{}",
        allowed.stderr
    );

    let mut codex = zuno(home);
    codex.args(["hook", "codex", "PreToolUse", "--server", &server.base]);
    let warned = run(codex, Some(call("npx jest").to_string())).await;
    assert_eq!(warned.code, 0, "{}", warned.stderr);
    let answer: Value = serde_json::from_str(warned.stdout.trim()).expect(&warned.stdout);
    assert!(
        answer["systemMessage"]
            .as_str()
            .unwrap()
            .contains("Use pnpm"),
        "{answer}"
    );
    assert!(
        answer.get("hookSpecificOutput").is_none(),
        "Codex cannot ask: {answer}"
    );
}

/// `zuno projects …` against the server, as the local user.
async fn projects(home: &std::path::Path, server: &str, args: &[&str]) -> Output {
    let mut command = zuno(home);
    command
        .arg("projects")
        .args(args)
        .args(["--server", server]);
    run(command, None).await
}

/// Issue 31, item 2: a session in a parent directory (`~/src`) binds nothing, so the
/// repositories below it keep their own worktrees; a session in a repository's subdirectory
/// belongs to the repository; a parent claimed before this rule is released with
/// `zuno projects unbind`, after which the repository's next session binds it; deleting needs
/// `--yes`.
async fn a_hook_binds_only_a_repository_root(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    let home = server.home();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let (src, app) = (dir.join("src"), dir.join("src/app"));
    std::fs::create_dir_all(app.join(".git")).unwrap();
    std::fs::create_dir_all(app.join("crates/core")).unwrap();
    let text = |path: &std::path::Path| path.to_string_lossy().into_owned();
    let start = |cwd: &std::path::Path, session: &str| {
        json!({"session_id": session, "cwd": cwd, "hook_event_name": "SessionStart",
               "source": "startup"})
    };
    let worktree_of = |project: String| {
        let server = &server;
        async move {
            let (status, body) = server.get(&format!("/api/projects/{project}")).await;
            assert_eq!(status, 200, "{body}");
            body["worktree"].clone()
        }
    };

    let out = hook(home, &server.base, "SessionStart", start(&src, "s-parent")).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        worktree_of(project_for_cwd(&text(&src)).0).await,
        Value::Null
    );
    let out = hook(
        home,
        &server.base,
        "SessionStart",
        start(&app.join("crates/core"), "s-app"),
    )
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let app_project = project_for_cwd(&text(&app)).0;
    assert_eq!(worktree_of(app_project.clone()).await, text(&app).as_str());

    // A parent claimed the old way (a worktree named explicitly) blocks its repository.
    let (legacy, lib) = (dir.join("legacy"), dir.join("legacy/lib"));
    std::fs::create_dir_all(lib.join(".git")).unwrap();
    let (status, body) = server
        .post(
            "/api/projects",
            json!({"id": "legacy", "name": "legacy", "worktree": legacy}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let lib_project = project_for_cwd(&text(&lib)).0;
    let out = hook(home, &server.base, "SessionStart", start(&lib, "s-lib-1")).await;
    assert!(out.stderr.contains("was not bound"), "{}", out.stderr);
    assert_eq!(worktree_of(lib_project.clone()).await, Value::Null);
    let listed = projects(home, &server.base, &["list"]).await;
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    assert!(
        listed
            .stdout
            .contains(&format!("legacy\t{}", text(&legacy))),
        "{}",
        listed.stdout
    );
    let unbound = projects(home, &server.base, &["unbind", "legacy"]).await;
    assert_eq!(unbound.code, 0, "{}", unbound.stderr);
    let out = hook(home, &server.base, "SessionStart", start(&lib, "s-lib-2")).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(worktree_of(lib_project.clone()).await, text(&lib).as_str());

    // Moving onto another project's tree is refused (exit 2); onto a free directory it moves.
    let refused = projects(home, &server.base, &["rebind", "legacy", &text(&legacy)]).await;
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(refused.stderr.contains("overlaps"), "{}", refused.stderr);
    let notes = dir.join("notes");
    std::fs::create_dir(&notes).unwrap();
    let moved = projects(
        home,
        &server.base,
        &["rebind", "legacy", &text(&notes), "--json"],
    )
    .await;
    assert_eq!(moved.code, 0, "{}", moved.stderr);
    let moved: Value = serde_json::from_str(&moved.stdout).unwrap();
    assert_eq!(moved["worktree"], text(&notes).as_str());

    // Deleting asks for --yes first.
    let asked = projects(home, &server.base, &["delete", "legacy"]).await;
    assert_eq!(asked.code, 2, "{}", asked.stderr);
    assert!(asked.stderr.contains("--yes"), "{}", asked.stderr);
    assert_eq!(
        worktree_of("legacy".to_owned()).await,
        text(&notes).as_str()
    );
    let deleted = projects(home, &server.base, &["delete", "legacy", "--yes", "--json"]).await;
    assert_eq!(deleted.code, 0, "{}", deleted.stderr);
    let (status, _) = server.get("/api/projects/legacy").await;
    assert_eq!(status, 404);
    let missing = projects(home, &server.base, &["unbind", "legacy"]).await;
    assert_eq!(missing.code, 3, "{}", missing.stderr);
}

zuno_tests::on_both_backends!(
    stop_after_a_rewind_fails_the_abandoned_turn_already_imported,
    a_hook_binds_only_a_repository_root,
);

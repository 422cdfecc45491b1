//! `zuno learn`, `zuno memory`, `zuno memories` and `zuno reflect` round trips against a
//! running server: human output and `--json`, and the exit codes of each failure class.

use serde_json::{Value, json};
use zuno_shared::config::Config;
use zuno_tests::server::TestServer;
use zuno_tests::{TestDb, on_both_backends};

use crate::fixtures::*;

async fn zuno_at(server: &TestServer, args: &[&str]) -> Output {
    // The server's data directory, where the CLI finds the local token.
    let mut command = zuno(server.home());
    command.args(args).args(["--server", &server.base]);
    run(command, None).await
}

fn json_of(output: &Output) -> Value {
    assert_eq!(output.code, 0, "{}", output.stderr);
    serde_json::from_str(&output.stdout).expect(&output.stdout)
}

async fn learn_and_memory_commands_round_trip(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    server
        .post("/api/projects", json!({"id": "p", "name": "P"}))
        .await;
    let (_, session) = server.post("/api/projects/p/sessions", json!({})).await;
    let session = session["id"].as_str().unwrap().to_owned();
    server
        .post(
            &format!("/api/session/{session}/messages"),
            json!({"role": "user", "parts": [{"type": "text", "text": "No, use pnpm instead of npm"}]}),
        )
        .await;
    let (_, turn) = server
        .post(
            &format!("/api/session/{session}/messages"),
            json!({"role": "assistant", "status": "completed", "parts": [
                {"type": "tool_call", "toolName": "bash", "callId": "c1", "arguments": {"cmd": "pnpm i"},
                 "result": "ok", "status": "completed"}]}),
        )
        .await;
    let message = turn["message"]["id"].as_str().unwrap().to_owned();

    // remember: JSON and human output.
    let remembered = json_of(
        &zuno_at(
            &server,
            &[
                "learn",
                "--project",
                "p",
                "--json",
                "remember",
                "Always",
                "run",
                "pnpm",
                "lint",
            ],
        )
        .await,
    );
    let experience = remembered["id"].as_str().unwrap().to_owned();
    assert!(
        remembered["text"]
            .as_str()
            .unwrap_or_default()
            .contains("Always run pnpm lint")
            || remembered.to_string().contains("Always run pnpm lint"),
        "{remembered}"
    );
    let human = zuno_at(&server, &["learn", "--project", "p", "get", &experience]).await;
    assert_eq!(human.code, 0, "{}", human.stderr);
    assert!(
        human.stdout.contains(&format!("id: {experience}")),
        "{}",
        human.stdout
    );

    let list = json_of(&zuno_at(&server, &["learn", "--project", "p", "list", "--json"]).await);
    assert!(
        list["experiences"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["id"] == experience.as_str())
    );
    let status = zuno_at(&server, &["learn", "--project", "p", "status"]).await;
    assert_eq!(status.code, 0, "{}", status.stderr);
    assert!(status.stdout.contains("rules-2"), "{}", status.stdout);
    // No model configured: the model path says so, and how to get one.
    assert!(
        status
            .stdout
            .contains("active: rules-2, no model configured")
            && status.stdout.contains("zuno install claude-code"),
        "{}",
        status.stdout
    );

    let issue = json_of(
        &zuno_at(
            &server,
            &[
                "learn",
                "--project",
                "p",
                "--json",
                "issue",
                "flaky",
                "CI",
                "on",
                "arm",
            ],
        )
        .await,
    );
    let issue_id = issue["id"].as_str().unwrap().to_owned();
    let solved = json_of(
        &zuno_at(
            &server,
            &[
                "learn", "--json", "solved", &issue_id, "pin", "the", "runner",
            ],
        )
        .await,
    );
    assert_eq!(solved["id"], issue_id.as_str());

    let reprocess = json_of(
        &zuno_at(
            &server,
            &["learn", "--project", "p", "--json", "reprocess", &message],
        )
        .await,
    );
    assert_eq!(reprocess["outcome"], "existing", "{reprocess}");
    let repair = zuno_at(
        &server,
        &["learn", "--project", "p", "repair-history", "--dry-run"],
    )
    .await;
    assert_eq!(repair.code, 0, "{}", repair.stderr);

    let feedback = json_of(
        &zuno_at(
            &server,
            &[
                "learn", "--json", "feedback", &session, &message, "positive",
            ],
        )
        .await,
    );
    assert_eq!(feedback["feedback"]["value"], "positive", "{feedback}");
    // A stale revision is a conflict.
    let stale = zuno_at(
        &server,
        &[
            "learn",
            "feedback",
            &session,
            &message,
            "negative",
            "--expected-revision",
            "7",
        ],
    )
    .await;
    assert_eq!(stale.code, 4, "{}", stale.stderr);

    let reflect = json_of(&zuno_at(&server, &["reflect", &session, "session", "--json"]).await);
    assert_eq!(reflect["scope"], "session", "{reflect}");

    let forget = zuno_at(&server, &["learn", "forget", &experience]).await;
    assert_eq!(forget.code, 0, "{}", forget.stderr);

    // Memory: a person's add applies under automatic promotion; remove it again; undo.
    let (_, added) = server
        .post(
            "/api/projects/p/memory",
            json!({"target": "project", "action": "add",
            "content": "Use pnpm.", "reason": "r", "confidence": 1.0, "origin": "user"}),
        )
        .await;
    assert_eq!(added["applied"], true, "{added}");
    let read = json_of(&zuno_at(&server, &["memory", "--project", "p", "read", "--json"]).await);
    assert!(read.to_string().contains("Use pnpm."), "{read}");
    let removed = json_of(
        &zuno_at(
            &server,
            &[
                "memory",
                "--project",
                "p",
                "--json",
                "remove",
                "project",
                "Use pnpm.",
            ],
        )
        .await,
    );
    assert_eq!(removed["applied"], true, "{removed}");
    let candidate = removed["candidate"]["id"].as_str().unwrap().to_owned();
    let undone = json_of(&zuno_at(&server, &["memory", "--json", "undo", &candidate]).await);
    assert_eq!(undone["candidate"]["state"], "undone", "{undone}");
    let candidates = json_of(
        &zuno_at(
            &server,
            &["memory", "--project", "p", "candidates", "--json"],
        )
        .await,
    );
    assert!(candidates.as_array().unwrap().len() >= 2, "{candidates}");
    let revisions = zuno_at(
        &server,
        &["memory", "--project", "p", "revisions", "project"],
    )
    .await;
    assert_eq!(revisions.code, 0, "{}", revisions.stderr);
    let inspect = zuno_at(
        &server,
        &["learn", "--project", "p", "inspect-memory", "project"],
    )
    .await;
    assert_eq!(inspect.code, 0, "{}", inspect.stderr);

    // memories: read, then compare-and-set with the revision just read.
    let policy = json_of(&zuno_at(&server, &["memories", &session, "--json"]).await);
    assert_eq!(policy["useMemories"], true, "{policy}");
    let updated =
        json_of(&zuno_at(&server, &["memories", &session, "--use", "false", "--json"]).await);
    assert_eq!(updated["useMemories"], false, "{updated}");
}

on_both_backends!(learn_and_memory_commands_round_trip);

#[tokio::test]
async fn exit_codes_distinguish_bad_input_not_found_and_unavailable() {
    let db = TestDb::sqlite().await;
    let server = TestServer::start(&db, Config::default(), None).await;
    server
        .post("/api/projects", json!({"id": "p", "name": "P"}))
        .await;
    let missing = zuno_at(&server, &["learn", "get", "exp_does_not_exist"]).await;
    assert_eq!(missing.code, 3, "{}", missing.stderr);
    let no_project = zuno_at(&server, &["learn", "--project", "nope", "status"]).await;
    assert_eq!(no_project.code, 3, "{}", no_project.stderr);
    let bad = zuno_at(&server, &["learn", "--project", "p", "list", "--", "-5"]).await;
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    let usage = zuno_at(&server, &["learn", "remember"]).await;
    assert_eq!(usage.code, 2, "{}", usage.stderr);

    let home = tempfile::tempdir().unwrap();
    let mut command = zuno(home.path());
    command.args([
        "learn",
        "--project",
        "p",
        "status",
        "--server",
        "http://127.0.0.1:9",
    ]);
    let down = run(command, None).await;
    assert_eq!(down.code, 5, "{}", down.stderr);
}

#[tokio::test]
async fn learn_help_lists_every_action() {
    let home = tempfile::tempdir().unwrap();
    let mut command = zuno(home.path());
    command.args(["learn", "help"]);
    let help = run(command, None).await;
    assert_eq!(help.code, 0, "{}", help.stderr);
    for action in [
        "status",
        "list",
        "get",
        "reprocess",
        "repair-history",
        "inspect-memory",
        "import-memory",
        "remember",
        "issue",
        "solved",
        "forget",
        "promote",
        "feedback",
        "pattern-promote",
        "pattern-reject",
        "skill-review",
        "skill-apply",
        "skill-reject",
        "skill-undo",
    ] {
        assert!(
            help.stdout
                .lines()
                .any(|line| line.trim_start().starts_with(&format!("{action} "))),
            "`{action}` missing from:\n{}",
            help.stdout
        );
    }
}

//! `zuno import claude-code|codex` through the ingestion routes: over HTTP to a running server
//! (both backends) and in-process on the local database.

use serde_json::Value;
use zuno_shared::config::Config;
use zuno_tests::server::TestServer;
use zuno_tests::{TestDb, on_both_backends};

use crate::fixtures::*;

/// A Claude Code project directory: the session file and one subagent sidechain file.
pub fn claude_code_dir(root: &std::path::Path) -> std::path::PathBuf {
    let dir = root.join("-home-someone-src-demo-app");
    let subagents = dir.join(CC_SESSION).join("subagents");
    std::fs::create_dir_all(&subagents).unwrap();
    let mut lines = claude_code_lines();
    lines.extend(claude_code_second_turn());
    write_lines(&dir.join(format!("{CC_SESSION}.jsonl")), &lines);
    write_lines(
        &subagents.join("agent-a881341.jsonl"),
        &claude_code_sidechain(),
    );
    dir
}

async fn extract_jobs(server: &TestServer, session: &str) -> Vec<Value> {
    let (status, page) = server
        .get(&format!("/api/jobs?kind=extract&sessionId={session}"))
        .await;
    assert_eq!(status, 200, "{page}");
    page["jobs"].as_array().unwrap().clone()
}

async fn claude_code_import_over_http_is_idempotent_and_admits_closed_turns(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    let temp = tempfile::tempdir().unwrap();
    let dir = claude_code_dir(temp.path());
    let home = tempfile::tempdir().unwrap();
    let mut command = zuno(home.path());
    command
        .args(["import", "claude-code", "--json", "--server", &server.base])
        .env("ZUNO_API_TOKEN", server.token())
        .arg(&dir);
    let first = run(command, None).await;
    assert_eq!(first.code, 0, "{}", first.stderr);
    let report: Value = serde_json::from_str(&first.stdout).expect(&first.stdout);
    assert_eq!(report["files"], 2);
    assert_eq!(report["sessionsCreated"], 2);
    assert_eq!(report["messagesAdded"], 7, "{report}");
    assert_eq!(report["messagesExisting"], 0);
    assert_eq!(
        report["jobsAdmitted"], 3,
        "both main turns and the sidechain turn: {report}"
    );
    assert_eq!(report["issues"][0]["line"], 6, "{report}");
    assert!(
        first
            .stderr
            .contains(&format!("{CC_SESSION}.jsonl:6: skipped: malformed JSON")),
        "{}",
        first.stderr
    );
    assert!(
        std::fs::read_dir(home.path()).unwrap().next().is_none(),
        "with a server, nothing is written locally"
    );

    let session = format!("cc-{CC_SESSION}");
    let (status, messages) = server
        .get(&format!("/api/session/{session}/messages"))
        .await;
    assert_eq!(status, 200, "{messages}");
    let roles: Vec<&str> = messages
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "user", "user", "assistant"]);
    assert_eq!(messages[1]["parts"][0]["status"], "error");
    assert_eq!(messages[1]["parts"][0]["callId"], "toolu_1");
    assert_eq!(messages[2]["parts"][0]["injected"], true);
    let (_, child) = server
        .get(&format!("/api/session/{session}-agent-a881341"))
        .await;
    assert_eq!(child["parentId"], session.as_str(), "{child}");
    let jobs = extract_jobs(&server, &session).await;
    assert_eq!(jobs.len(), 2, "one job per closed eligible turn");
    assert!(jobs.iter().all(|job| job["state"] == "queued"));
    let (project, _) = zuno_shared::transcript::import::project_for_cwd(CWD);
    assert!(
        jobs.iter().all(|job| job["projectId"] == project.as_str()),
        "{jobs:?}"
    );

    let mut command = zuno(home.path());
    command
        .args(["import", "claude-code", "--json", "--server", &server.base])
        .env("ZUNO_API_TOKEN", server.token())
        .arg(&dir);
    let again = run(command, None).await;
    assert_eq!(again.code, 0, "{}", again.stderr);
    let report: Value = serde_json::from_str(&again.stdout).unwrap();
    assert_eq!(report["messagesAdded"], 0, "{report}");
    assert_eq!(report["messagesExisting"], 7);
    assert_eq!(report["sessionsCreated"], 0);
    assert_eq!(report["jobsAdmitted"], 0);
    assert_eq!(extract_jobs(&server, &session).await.len(), 2);
}

async fn codex_import_over_http_records_failures_and_aborts(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    let temp = tempfile::tempdir().unwrap();
    let file = temp.path().join("rollout-2025-11-23T10-00-00-x.jsonl");
    write_lines(&file, &codex_lines());
    let home = tempfile::tempdir().unwrap();
    let mut command = zuno(home.path());
    command
        .args(["import", "codex", "--server", &server.base])
        .env("ZUNO_API_TOKEN", server.token())
        .arg(&file);
    let out = run(command, None).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("6 message(s) added"), "{}", out.stdout);
    assert!(out.stdout.contains("1 line(s) skipped"), "{}", out.stdout);
    assert!(out.stderr.contains(".jsonl:5: skipped"), "{}", out.stderr);
    let session = format!("cx-{CODEX_SESSION}");
    let (_, messages) = server
        .get(&format!("/api/session/{session}/messages"))
        .await;
    let statuses: Vec<&str> = messages
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        [
            "completed",
            "completed",
            "completed",
            "completed",
            "completed",
            "failed"
        ]
    );
    let jobs = extract_jobs(&server, &session).await;
    assert_eq!(jobs.len(), 2, "the aborted turn is not a learning source");
}

/// A rewind imported over HTTP: the abandoned turn is stored `failed` and admits nothing; the
/// turn the session continued with is learned from, with the abandoned turn bound only as
/// read-only context.
async fn a_rewound_claude_code_session_learns_only_from_the_branch_it_continued_on(db: TestDb) {
    use zuno_shared::learning::{SourceCheck, SourceSnapshot};
    let server = TestServer::start(&db, Config::default(), None).await;
    let temp = tempfile::tempdir().unwrap();
    let file = temp.path().join(format!("{REWIND_SESSION}.jsonl"));
    write_lines(&file, &claude_code_rewind_lines());
    let home = tempfile::tempdir().unwrap();
    let mut command = zuno(home.path());
    command
        .args(["import", "claude-code", "--json", "--server", &server.base])
        .env("ZUNO_API_TOKEN", server.token())
        .arg(&file);
    let out = run(command, None).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(report["messagesAdded"], 7, "{report}");
    assert_eq!(report["jobsAdmitted"], 2, "{report}");

    let session = format!("cc-{REWIND_SESSION}");
    let (_, messages) = server
        .get(&format!("/api/session/{session}/messages"))
        .await;
    let statuses: Vec<&str> = messages
        .as_array()
        .unwrap()
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
    let jobs = extract_jobs(&server, &session).await;
    assert_eq!(jobs.len(), 2, "turn 1 and the continued turn: {jobs:?}");
    let continued = &messages[6];
    let mut tx = db.db.begin_read().await.unwrap();
    let mut found = false;
    for job in &jobs {
        let id = job["id"].as_str().unwrap();
        let snapshot = SourceSnapshot::load_in(&mut tx, id).await.unwrap().unwrap();
        if snapshot.end_message_id != continued["id"].as_str().unwrap() {
            continue;
        }
        found = true;
        let SourceCheck::Current(manifest) = snapshot.check_in(&mut tx).await.unwrap() else {
            panic!("the continued turn's sources are current");
        };
        let abandoned = [
            "delete the lockfile",
            "rm -rf",
            "Deleted both",
            "wipe the cache",
        ];
        for record in &manifest.records {
            let from_abandoned = abandoned.iter().any(|text| record.text.contains(text));
            assert!(
                !from_abandoned || record.context,
                "an abandoned record is a source: {record:?}"
            );
        }
        assert!(
            manifest
                .records
                .iter()
                .any(|r| r.context && r.text.contains("delete the lockfile")),
            "the abandoned prompt is read-only context: {:?}",
            manifest.records
        );
        assert!(
            !manifest
                .records
                .iter()
                .any(|r| r.text.contains("wipe the cache")),
            "the unanswered abandoned prompt is no source and no context"
        );
        assert!(
            manifest
                .records
                .iter()
                .any(|r| !r.context && r.text.contains("Run the tests and the linter")),
            "{:?}",
            manifest.records
        );
    }
    tx.rollback().await.unwrap();
    assert!(found, "a job for the continued turn");
}

on_both_backends!(
    claude_code_import_over_http_is_idempotent_and_admits_closed_turns,
    codex_import_over_http_records_failures_and_aborts,
    a_rewound_claude_code_session_learns_only_from_the_branch_it_continued_on,
);

#[tokio::test]
async fn without_a_server_the_import_writes_the_local_database() {
    let home = tempfile::tempdir().unwrap();
    let temp = tempfile::tempdir().unwrap();
    let dir = claude_code_dir(temp.path());
    let mut command = zuno(home.path());
    command
        .args(["import", "claude-code", "--json", "--project", "demo"])
        .arg(&dir);
    let out = run(command, None).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(report["messagesAdded"], 7);
    assert_eq!(report["jobsAdmitted"], 3);
    assert!(home.path().join("zuno.db").exists());

    let mut command = zuno(home.path());
    command.args(["jobs", "list", "--kind", "extract", "--json"]);
    let jobs = run(command, None).await;
    assert_eq!(jobs.code, 0, "{}", jobs.stderr);
    let jobs: Value = serde_json::from_str(&jobs.stdout).unwrap();
    assert_eq!(jobs.as_array().unwrap().len(), 3);
    assert!(
        jobs.as_array()
            .unwrap()
            .iter()
            .all(|job| job["projectId"] == "demo")
    );

    let mut command = zuno(home.path());
    command
        .args(["import", "claude-code", "--json", "--project", "demo"])
        .arg(&dir);
    let again = run(command, None).await;
    let report: Value = serde_json::from_str(&again.stdout).unwrap();
    assert_eq!(report["messagesAdded"], 0);
    assert_eq!(report["messagesExisting"], 7);
}

#[tokio::test]
async fn the_real_corpus_imports_locally_and_reimports_as_a_no_op() {
    let home = tempfile::tempdir().unwrap();
    let dir = corpus().join("claude-code-jsonl").join("spotter");
    let mut command = zuno(home.path());
    command.args(["import", "claude-code", "--json"]).arg(&dir);
    let out = run(command, None).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(report["files"], 6, "{report}");
    assert!(report["issues"].as_array().unwrap().is_empty(), "{report}");
    assert_eq!(report["messagesRejected"], 0);
    let added = report["messagesAdded"].as_u64().unwrap();
    // 27 typed prompts in these files: one user message each, one assistant message per turn.
    assert!(added > 30, "{report}");
    assert!(report["jobsAdmitted"].as_u64().unwrap() >= 5, "{report}");
    assert!(
        report["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s.as_str().unwrap().contains("agent-acompact")),
        "the compaction sidechain is a session: {report}"
    );

    let file = corpus()
        .join("codex-rollout")
        .join("rtchess-rollout-019aad50-a7e6-7422-b7a8-0b384290624f.jsonl");
    let mut command = zuno(home.path());
    command.args(["import", "codex", "--json"]).arg(&file);
    let codex = run(command, None).await;
    assert_eq!(codex.code, 0, "{}", codex.stderr);
    let codex: Value = serde_json::from_str(&codex.stdout).unwrap();
    assert!(codex["messagesAdded"].as_u64().unwrap() > 10, "{codex}");

    let mut command = zuno(home.path());
    command.args(["import", "claude-code", "--json"]).arg(&dir);
    let again = run(command, None).await;
    let again: Value = serde_json::from_str(&again.stdout).unwrap();
    assert_eq!(again["messagesAdded"], 0);
    assert_eq!(again["messagesExisting"].as_u64().unwrap(), added);
}

#[tokio::test]
async fn bad_paths_and_unreachable_servers_have_their_exit_codes() {
    let home = tempfile::tempdir().unwrap();
    let mut command = zuno(home.path());
    command.args(["import", "codex", "/nonexistent/zuno/rollout.jsonl"]);
    let missing = run(command, None).await;
    assert_eq!(missing.code, 2, "{}", missing.stderr);
    assert!(missing.stderr.contains("cannot read"), "{}", missing.stderr);

    let temp = tempfile::tempdir().unwrap();
    let file = temp.path().join("r.jsonl");
    write_lines(&file, &codex_lines());
    let mut command = zuno(home.path());
    command
        .args(["import", "codex", "--server", "http://127.0.0.1:9"])
        .arg(&file);
    let down = run(command, None).await;
    assert_eq!(down.code, 5, "{}", down.stderr);
    assert!(
        down.stderr.contains("server unavailable"),
        "{}",
        down.stderr
    );
}

//! The `zuno` binary as a user runs it: exit codes, start-up side effects, refusals.

use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use zuno_tests::eventually;
use zuno_tests::processes::binary;

fn zuno(home: &std::path::Path) -> Command {
    let mut command = Command::new(binary("zuno"));
    command
        .env("ZUNO_HOME", home)
        .env_remove("ZUNO_API_TOKEN")
        .env_remove("DATABASE_URL")
        .env_remove("ZUNO_DATABASE_URL")
        .env_remove("ZUNO_BIND")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
    command
}

fn run(command: &mut Command) -> (i32, String, String) {
    let output = command.output().expect("run zuno");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn debug_paths_marks_every_missing_store_absent() {
    let home = tempfile::tempdir().unwrap();
    let worktree = tempfile::tempdir().unwrap();
    let (code, stdout, _) = run(zuno(home.path())
        .args(["debug", "paths", "--worktree"])
        .arg(worktree.path()));
    assert_eq!(code, 0);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    for (line, name) in
        lines
            .iter()
            .zip(["database:", "config:", "global memory:", "project rules:"])
    {
        assert!(line.starts_with(name), "{line}");
        assert!(line.ends_with("(absent)"), "{line}");
    }
    assert!(lines[2].contains("memory/MEMORY.md"));
    assert!(lines[3].contains(".zuno/RULES.md"));
    assert_eq!(
        std::fs::read_dir(home.path()).unwrap().count(),
        0,
        "debug paths creates nothing"
    );
}

#[tokio::test]
async fn all_in_one_serves_learns_and_creates_nothing_but_the_database() {
    let home = tempfile::tempdir().unwrap();
    let (mut child, _, base, _stdout) = zuno_tests::processes::serve(
        tokio::process::Command::from(zuno(home.path())).args([
            "serve",
            "--all-in-one",
            "--bind",
            "127.0.0.1:0",
        ]),
        Stdio::null(),
    )
    .await;
    let mut created: Vec<String> = std::fs::read_dir(home.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    created.sort();
    assert_eq!(
        created,
        ["local-token", "zuno.db", "zuno.db-shm", "zuno.db-wal"],
        "start-up creates only the database and the local token"
    );
    let token = std::fs::read_to_string(home.path().join("local-token"))
        .unwrap()
        .trim()
        .to_owned();
    let unauthenticated = reqwest::Client::new()
        .get(format!("{base}/api/jobs"))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthenticated.status(), 401, "the local token is required");

    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {token}").parse().unwrap(),
    );
    let client = reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap();
    client
        .post(format!("{base}/api/projects"))
        .json(&serde_json::json!({"id": "p", "name": "P"}))
        .send()
        .await
        .unwrap();
    let session: serde_json::Value = client
        .post(format!("{base}/api/projects/p/sessions"))
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let session = session["id"].as_str().unwrap();
    let turn: serde_json::Value = client
        .post(format!("{base}/api/session/{session}/messages"))
        .json(&crate::ingestion::tool_turn())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let job = turn["admission"]["job"]["id"].as_str().unwrap().to_owned();
    eventually(
        "the in-process extract worker settles the job",
        Duration::from_secs(30),
        || {
            let client = client.clone();
            let url = format!("{base}/api/jobs/{job}");
            async move {
                let detail: serde_json::Value =
                    client.get(url).send().await.ok()?.json().await.ok()?;
                (detail["job"]["state"] == "completed").then_some(())
            }
        },
    )
    .await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "graceful shutdown exits 0: {status}");
}

#[test]
fn serving_beyond_loopback_without_a_token_is_refused() {
    let home = tempfile::tempdir().unwrap();
    let (code, _, stderr) = run(zuno(home.path()).args(["serve", "--bind", "0.0.0.0:0"]));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("ZUNO_API_TOKEN"), "{stderr}");
    assert_eq!(
        std::fs::read_dir(home.path()).unwrap().count(),
        0,
        "nothing was created"
    );
}

#[test]
fn configuration_errors_name_the_key_and_exit_2() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("config.json"),
        r#"{"learning":{"post_turn":{"poll_every":5}}}"#,
    )
    .unwrap();
    let (code, _, stderr) = run(zuno(home.path()).args(["migrate"]));
    assert_eq!(code, 2);
    assert!(stderr.contains("learning.post_turn.poll_every"), "{stderr}");
    std::fs::write(
        home.path().join("config.json"),
        r#"{"memory":{"nudge_interval":10}}"#,
    )
    .unwrap();
    let (code, _, stderr) = run(zuno(home.path()).args(["migrate"]));
    assert_eq!(code, 2);
    assert!(
        stderr.contains("memory.nudge_interval") && stderr.contains("learning.post_turn"),
        "{stderr}"
    );
}

#[test]
fn job_commands_distinguish_bad_input_and_not_found() {
    let home = tempfile::tempdir().unwrap();
    let (code, _, stderr) = run(zuno(home.path()).args(["jobs", "list", "--kind", "cron"]));
    assert_eq!(code, 2, "{stderr}");
    let (code, _, stderr) = run(zuno(home.path()).args(["jobs", "show", "job_missing"]));
    assert_eq!(code, 3, "{stderr}");
    let (code, stdout, _) = run(zuno(home.path()).args(["jobs", "list"]));
    assert_eq!((code, stdout.trim()), (0, "no jobs"));
}

#[test]
fn an_altered_database_refuses_to_start() {
    let home = tempfile::tempdir().unwrap();
    let (code, _, _) = run(zuno(home.path()).args(["migrate"]));
    assert_eq!(code, 0);
    let db = home.path().join("zuno.db");
    let status = Command::new("python3")
        .args(["-c", "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('DROP INDEX learning_job_lease'); c.commit()"])
        .arg(&db)
        .status();
    let Ok(status) = status else {
        panic!("python3 is needed to alter the database")
    };
    assert!(status.success());
    let (code, _, stderr) = run(zuno(home.path()).args(["jobs", "list"]));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("altered outside Zuno's migrations")
            && stderr.contains("Refusing to start"),
        "{stderr}"
    );
    let (code, _, stderr) = run(zuno(home.path()).args(["migrate", "--check"]));
    assert_eq!(code, 1, "{stderr}");
}

#[test]
fn migrate_works_against_postgres_too() {
    let admin = zuno_tests::postgres_admin_url();
    let home = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let db = runtime.block_on(zuno_tests::TestDb::postgres());
    let (code, stdout, stderr) =
        run(zuno(home.path()).args(["--database-url", &db.url, "migrate", "--check"]));
    assert_eq!(code, 0, "{stdout}{stderr} (admin {admin})");
    assert!(stdout.contains("schema verified"));
    drop(db);
}

#[test]
fn a_blank_token_and_insecure_mode_off_loopback_are_refused() {
    let home = tempfile::tempdir().unwrap();
    let (code, _, stderr) = run(zuno(home.path()).env("ZUNO_API_TOKEN", "   ").args([
        "serve",
        "--bind",
        "127.0.0.1:0",
    ]));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("ZUNO_API_TOKEN is set but blank"),
        "{stderr}"
    );
    let (code, _, stderr) =
        run(zuno(home.path()).args(["serve", "--insecure-no-auth", "--bind", "0.0.0.0:0"]));
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(
        std::fs::read_dir(home.path()).unwrap().count(),
        0,
        "nothing was created"
    );
}

#[test]
fn a_short_operator_token_is_refused_off_loopback() {
    let home = tempfile::tempdir().unwrap();
    let (code, _, stderr) =
        run(zuno(home.path())
            .env("ZUNO_API_TOKEN", "x")
            .args(["serve", "--bind", "0.0.0.0:0"]));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("ZUNO_API_TOKEN of 1 characters") && stderr.contains("at least 32"),
        "{stderr}"
    );
    let short = "a".repeat(31);
    let (code, _, stderr) =
        run(zuno(home.path())
            .env("ZUNO_API_TOKEN", &short)
            .args(["serve", "--bind", "0.0.0.0:0"]));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("at least 32"), "{stderr}");
    assert_eq!(
        std::fs::read_dir(home.path()).unwrap().count(),
        0,
        "nothing was created"
    );
}

#[tokio::test]
async fn insecure_no_auth_serves_loopback_without_a_token_and_says_so() {
    let home = tempfile::tempdir().unwrap();
    let (mut child, banner, base, _stdout) = zuno_tests::processes::serve(
        tokio::process::Command::from(zuno(home.path())).args([
            "serve",
            "--insecure-no-auth",
            "--bind",
            "127.0.0.1:0",
        ]),
        Stdio::piped(),
    )
    .await;
    assert!(banner.contains("--insecure-no-auth"), "{banner}");
    let mut errors = BufReader::new(child.stderr.take().unwrap()).lines();
    let warned = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = errors.next_line().await {
            if line.contains("WARNING: authentication is off") {
                return true;
            }
        }
        false
    })
    .await
    .unwrap();
    assert!(warned, "the start-up warning is printed");
    let response = reqwest::Client::new()
        .post(format!("{base}/api/projects"))
        .json(&serde_json::json!({"id": "p", "name": "P"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    // The browser rules hold even without a token.
    let response = reqwest::Client::new()
        .post(format!("{base}/api/projects"))
        .header("origin", "https://evil.example")
        .header("content-type", "text/plain")
        .body(r#"{"id":"q","name":"Q"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    assert!(
        !home.path().join("local-token").exists(),
        "no token is generated in insecure mode"
    );
}

#[test]
fn tokens_name_existing_projects_and_say_what_they_reach() {
    let home = tempfile::tempdir().unwrap();
    let (code, _, stderr) =
        run(zuno(home.path()).args(["tokens", "create", "--name", "ci", "--project", "ghost"]));
    assert_eq!(
        code, 3,
        "a project that does not exist is refused: {stderr}"
    );
    assert!(stderr.contains("--allow-create"), "{stderr}");
    let (code, secret, stderr) = run(zuno(home.path()).args([
        "tokens",
        "create",
        "--name",
        "ci",
        "--project",
        "ghost",
        "--allow-create",
    ]));
    assert_eq!(code, 0, "{stderr}");
    assert!(secret.trim().starts_with("zuno_"), "{secret}");
    let (code, _, stderr) = run(zuno(home.path()).args([
        "tokens",
        "create",
        "--name",
        "me",
        "--project",
        "ghost",
        "--allow-create",
        "--global",
        "--user",
    ]));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("global Memory: write") && stderr.contains("acts for the user"),
        "{stderr}"
    );
    let (code, listing, _) = run(zuno(home.path()).args(["tokens", "list"]));
    assert_eq!(code, 0);
    assert!(
        listing.contains("global:none") && listing.contains("global:write"),
        "{listing}"
    );
    let (code, _, stderr) = run(zuno(home.path()).args(["tokens", "create", "--name", "empty"]));
    assert_eq!(code, 2, "a token reaching nothing is refused: {stderr}");
}

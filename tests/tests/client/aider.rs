//! Aider chat histories: the parser on the real corpus (the dev files' human prompts as their
//! README counts them; the held-out files as parser material only) and `zuno import aider` end to
//! end, over HTTP on both backends and on the local database.

use std::io::BufReader;
use std::path::{Path, PathBuf};

use serde_json::Value;
use zuno_shared::config::Config;
use zuno_shared::transcript::import::{self, Host, ImportedMessage, Parsed, Position};
use zuno_shared::transcript::{Part, Role, ToolStatus};
use zuno_tests::server::TestServer;
use zuno_tests::{TestDb, on_both_backends};

use crate::fixtures::*;

fn parse_history(path: &Path) -> Parsed {
    let file = std::fs::File::open(path)
        .unwrap_or_else(|error| panic!("open {}: {error}", path.display()));
    import::parse(Host::Aider, BufReader::new(file), Position::default()).unwrap()
}

fn histories(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|error| panic!("corpus present at {}: {error}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.to_string_lossy().ends_with(".aider.chat.history.md"))
        .collect();
    files.sort();
    files
}

fn messages(parsed: &Parsed) -> impl Iterator<Item = &ImportedMessage> {
    parsed.sessions.iter().flat_map(|session| &session.messages)
}

fn prompts(parsed: &Parsed) -> Vec<&ImportedMessage> {
    messages(parsed).filter(|m| m.role == Role::User).collect()
}

fn tool_parts<'a>(parsed: &'a Parsed, name: &'a str) -> impl Iterator<Item = &'a Part> + 'a {
    messages(parsed)
        .flat_map(|m| &m.parts)
        .filter(move |part| matches!(part, Part::ToolCall { tool_name, .. } if tool_name == name))
}

fn command_of(part: &Part) -> Option<&str> {
    match part {
        Part::ToolCall { arguments, .. } => arguments["command"].as_str(),
        _ => None,
    }
}

/// What every parsed history must satisfy, whatever its content.
fn assert_sane(file: &Path, parsed: &Parsed) {
    let name = file.display();
    assert!(parsed.issues.is_empty(), "{name}: {:?}", parsed.issues);
    assert_eq!(parsed.unrecognized, None, "{name}");
    assert_eq!(
        parsed.consumed_bytes,
        std::fs::metadata(file).unwrap().len(),
        "{name}"
    );
    assert!(!parsed.sessions.is_empty(), "{name}");
    let text = String::from_utf8_lossy(&std::fs::read(file).unwrap()).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    let mut previous = 0;
    for session in &parsed.sessions {
        assert!(
            zuno_shared::ids::is_valid_external_id(&session.session_id()),
            "{name}: {}",
            session.session_id()
        );
        for message in &session.messages {
            assert!(
                message.line > previous,
                "{name}: messages follow the file: line {} after {previous}",
                message.line
            );
            previous = message.line;
            assert!(!message.parts.is_empty(), "{name}:{}", message.line);
            assert!(message.parts.len() <= 512);
            for part in &message.parts {
                assert!(
                    !matches!(
                        part,
                        Part::ToolCall {
                            status: ToolStatus::Pending,
                            ..
                        }
                    ),
                    "{name}:{}: aider output is never left pending",
                    message.line
                );
            }
            if message.role != Role::User {
                continue;
            }
            // A prompt is never a command, a logged confirm answer or an injected text, and its
            // line is the first `#### ` line of the input it came from.
            let [Part::Text { text, injected }] = message.parts.as_slice() else {
                panic!("{name}:{}: {:?}", message.line, message.parts);
            };
            assert!(!injected, "{name}:{}", message.line);
            let first = text.lines().next().unwrap_or_default();
            assert!(
                !first.starts_with('/') && !first.starts_with('!') && !first.contains("(Y)es/(N)o"),
                "{name}:{}: {first}",
                message.line
            );
            let logged = lines[usize::try_from(message.line).unwrap() - 1];
            assert!(logged.starts_with("####"), "{name}:{}", message.line);
            let logged_first = lines[usize::try_from(message.line).unwrap() - 1..]
                .iter()
                .map(|line| {
                    line.trim_start_matches('#')
                        .strip_prefix(' ')
                        .unwrap_or_default()
                        .strip_suffix("  ")
                        .unwrap_or_default()
                })
                .find(|line| !line.trim().is_empty());
            assert_eq!(logged_first, Some(first), "{name}:{}", message.line);
        }
    }
}

#[test]
fn the_dev_histories_yield_the_human_prompts_their_readme_counts() {
    let dir = corpus().join("dev").join("aider");
    // (file, human prompts, in-chat commands, architect hand-offs) as the corpus README has them.
    let expected = [
        ("Consistos-VigInt", 18, 2, 9),
        ("PierrunoYT-AI-Web-Crawler", 36, 1, 0),
        ("clusterpj-cluster-estate", 42, 23, 0),
        ("nishadhka-geomanager", 12, 3, 0),
    ];
    let files = histories(&dir);
    assert_eq!(files.len(), expected.len(), "{files:?}");
    for (name, human, commands, hand_offs) in expected {
        let file = dir.join(format!("{name}.aider.chat.history.md"));
        let parsed = parse_history(&file);
        assert_sane(&file, &parsed);
        assert_eq!(prompts(&parsed).len(), human, "{name}: human prompts");
        assert_eq!(
            tool_parts(&parsed, "aider_command").count(),
            commands,
            "{name}: commands"
        );
        assert_eq!(
            tool_parts(&parsed, "aider_editor").count(),
            hand_offs,
            "{name}: architect hand-offs"
        );
    }

    // The three `/undo`s of nishadhka: two follow an edit in the same turn (the change they
    // undo); the third is typed in a fresh run, before any prompt, and is startup output.
    let parsed = parse_history(&dir.join("nishadhka-geomanager.aider.chat.history.md"));
    let undos: Vec<(&ImportedMessage, usize)> = messages(&parsed)
        .flat_map(|m| {
            m.parts
                .iter()
                .enumerate()
                .filter(|(_, p)| command_of(p) == Some("/undo"))
                .map(move |(i, _)| (m, i))
        })
        .collect();
    assert_eq!(undos.len(), 3);
    for (message, index) in &undos[..2] {
        assert_eq!(message.role, Role::Assistant);
        assert!(!message.parts[*index].is_injected());
        assert!(
            message.parts[..*index].iter().any(|p| matches!(
                p,
                Part::ToolCall { tool_name, status: ToolStatus::Completed, .. }
                    if tool_name == "aider_edit"
            )),
            "line {}",
            message.line
        );
    }
    assert!(undos[2].0.parts.iter().all(Part::is_injected));

    // Consistos: the runs where the model's API key was rejected leave failed turns.
    let parsed = parse_history(&dir.join("Consistos-VigInt.aider.chat.history.md"));
    let failed = messages(&parsed)
        .filter(|m| m.status == zuno_shared::transcript::MessageStatus::Failed)
        .count();
    assert!(failed >= 2, "{failed}");
}

#[test]
fn the_held_out_histories_parse_without_issues_into_sane_sessions() {
    let files = histories(&corpus().join("aider"));
    assert_eq!(files.len(), 5, "{files:?}");
    for file in &files {
        let parsed = parse_history(file);
        assert_sane(file, &parsed);
        // Logged inputs: runs of `####` lines (prompts, commands, confirm answers, …).
        let text = std::fs::read_to_string(file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let inputs = lines
            .iter()
            .enumerate()
            .filter(|(i, line)| {
                line.starts_with("####")
                    && line.ends_with("  ")
                    && (*i == 0 || !lines[i - 1].starts_with("####"))
            })
            .count();
        let human = prompts(&parsed).len();
        assert!(
            human >= 10 && human < inputs,
            "{}: {human} prompts of {inputs} inputs",
            file.display()
        );
        assert!(
            tool_parts(&parsed, "aider_edit").next().is_some(),
            "{}",
            file.display()
        );
    }
}

/// `zuno import aider`, against `server` (its base URL and token) or the local database.
async fn import_aider(
    home: &Path,
    server: Option<&TestServer>,
    args: &[&str],
    path: &Path,
) -> Output {
    let mut command = zuno(home);
    command.args(["import", "aider", "--json"]);
    if let Some(server) = server {
        command
            .args(["--server", &server.base])
            .env("ZUNO_API_TOKEN", server.token());
    }
    command.args(args).arg(path);
    run(command, None).await
}

fn report(out: &Output) -> Value {
    assert_eq!(out.code, 0, "{}", out.stderr);
    serde_json::from_str(&out.stdout).unwrap_or_else(|_| panic!("{}", out.stdout))
}

async fn aider_import_is_idempotent_and_adds_only_appended_sessions(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    let repo = tempfile::tempdir().unwrap();
    let history = repo.path().join(".aider.chat.history.md");
    std::fs::write(&history, aider_two_sessions()).unwrap();
    // Only files named like aider's history are found, and not inside `node_modules`.
    std::fs::write(repo.path().join("notes.md"), "# notes\n").unwrap();
    std::fs::write(repo.path().join(".aider.input.history"), "+hello\n").unwrap();
    let vendored = repo.path().join("node_modules").join("pkg");
    std::fs::create_dir_all(&vendored).unwrap();
    std::fs::write(
        vendored.join(".aider.chat.history.md"),
        aider_appended_session(),
    )
    .unwrap();
    let home = tempfile::tempdir().unwrap();

    let first = report(&import_aider(home.path(), Some(&server), &[], repo.path()).await);
    assert_eq!(first["files"], 1, "{first}");
    assert_eq!(first["sessionsCreated"], 2, "{first}");
    assert_eq!(first["messagesAdded"], 7, "{first}");
    assert_eq!(first["messagesRejected"], 0, "{first}");
    assert_eq!(
        first["jobsAdmitted"], 1,
        "only the turn with an edit qualifies: the startup is host output, the question has no signal, the interrupted turn failed: {first}"
    );
    assert!(first["issues"].as_array().unwrap().is_empty(), "{first}");
    let sessions: Vec<String> = first["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect();
    assert!(
        sessions.iter().all(|s| s.starts_with("ad-")),
        "{sessions:?}"
    );

    let (status, session) = server.get(&format!("/api/session/{}", sessions[0])).await;
    assert_eq!(status, 200, "{session}");
    let (project, _) = import::project_for_cwd(
        &std::fs::canonicalize(repo.path())
            .unwrap()
            .to_string_lossy(),
    );
    assert_eq!(
        session["projectId"],
        project.as_str(),
        "the project is the directory aider ran in"
    );
    let (_, messages) = server
        .get(&format!("/api/session/{}/messages", sessions[0]))
        .await;
    let messages = messages.as_array().unwrap();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["assistant", "user", "assistant", "user", "assistant"]
    );
    assert!(
        messages[0]["parts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["injected"] == true),
        "the startup banner is never a learning source"
    );
    assert_eq!(
        messages[1]["parts"][0]["text"],
        "Use pnpm, not npm, in this repo."
    );
    let undo = messages[2]["parts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["toolName"] == "aider_command")
        .expect("the /undo is kept");
    assert_eq!(undo["arguments"]["command"], "/undo");
    assert_eq!(undo["status"], "completed");
    assert_eq!(undo["result"], "Removed: 1c0a157 build: use pnpm");
    let (_, second) = server
        .get(&format!("/api/session/{}/messages", sessions[1]))
        .await;
    let statuses: Vec<&str> = second
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        ["completed", "failed"],
        "the interrupted reply failed"
    );

    let again = report(&import_aider(home.path(), Some(&server), &[], repo.path()).await);
    assert_eq!(again["messagesAdded"], 0, "{again}");
    assert_eq!(again["messagesExisting"], 7, "{again}");
    assert_eq!(again["sessionsCreated"], 0, "{again}");
    assert_eq!(again["jobsAdmitted"], 0, "{again}");

    let mut appended = std::fs::read_to_string(&history).unwrap();
    appended.push_str(&aider_appended_session());
    std::fs::write(&history, appended).unwrap();
    let third = report(&import_aider(home.path(), Some(&server), &[], repo.path()).await);
    assert_eq!(third["sessionsCreated"], 1, "{third}");
    assert_eq!(third["messagesAdded"], 3, "only the appended run: {third}");
    assert_eq!(third["messagesExisting"], 7, "{third}");
    assert_eq!(third["jobsAdmitted"], 1, "{third}");
    assert_eq!(third["sessions"].as_array().unwrap().len(), 3, "{third}");
    let (_, jobs) = server
        .get(&format!("/api/jobs?kind=extract&sessionId={}", sessions[0]))
        .await;
    assert_eq!(jobs["jobs"].as_array().unwrap().len(), 1, "{jobs}");
}

on_both_backends!(aider_import_is_idempotent_and_adds_only_appended_sessions);

#[tokio::test]
async fn aider_import_on_the_local_database_reports_bad_lines_and_refuses_other_files() {
    let home = tempfile::tempdir().unwrap();
    let repo = tempfile::tempdir().unwrap();
    let history = repo.path().join(".aider.chat.history.md");
    std::fs::write(&history, aider_two_sessions()).unwrap();
    let out = report(&import_aider(home.path(), None, &["--project", "demo"], &history).await);
    assert_eq!(out["messagesAdded"], 7, "{out}");
    assert_eq!(out["jobsAdmitted"], 1, "{out}");
    assert!(home.path().join("zuno.db").exists());
    let mut command = zuno(home.path());
    command.args(["jobs", "list", "--kind", "extract", "--json"]);
    let jobs = run(command, None).await;
    assert_eq!(jobs.code, 0, "{}", jobs.stderr);
    let jobs: Value = serde_json::from_str(&jobs.stdout).unwrap();
    assert_eq!(jobs.as_array().unwrap().len(), 1, "{jobs}");
    assert_eq!(jobs[0]["projectId"], "demo");

    // A prompt before any session header is reported by line; the rest is imported.
    let stray = repo.path().join("stray.md");
    std::fs::write(
        &stray,
        format!(
            "{}{}",
            aider_history(&["#### a prompt with no session"]),
            aider_appended_session()
        ),
    )
    .unwrap();
    let partial = import_aider(home.path(), None, &["--project", "demo"], &stray).await;
    let partial_report = report(&partial);
    assert_eq!(partial_report["messagesAdded"], 3, "{partial_report}");
    assert_eq!(partial_report["issues"][0]["line"], 1, "{partial_report}");
    assert!(
        partial
            .stderr
            .contains("stray.md:1: skipped: input before any"),
        "{}",
        partial.stderr
    );

    // A file that is not an Aider history at all is refused before anything is written.
    let fresh = tempfile::tempdir().unwrap();
    let jsonl = repo.path().join("session.md");
    write_lines(&jsonl, &claude_code_lines());
    let refused = import_aider(fresh.path(), None, &[], &jsonl).await;
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused
            .stderr
            .contains("session.md:1: not an Aider chat history"),
        "{}",
        refused.stderr
    );
    assert!(
        std::fs::read_dir(fresh.path()).unwrap().next().is_none(),
        "nothing was written"
    );

    let empty = tempfile::tempdir().unwrap();
    let none = import_aider(home.path(), None, &[], empty.path()).await;
    assert_eq!(none.code, 2, "{}", none.stderr);
    assert!(
        none.stderr.contains("no Aider chat histories"),
        "{}",
        none.stderr
    );
}

#[tokio::test]
async fn the_real_aider_histories_import_and_reimport_as_a_no_op() {
    let home = tempfile::tempdir().unwrap();
    for (dir, files) in [
        (corpus().join("dev").join("aider"), 4),
        (corpus().join("aider"), 5),
    ] {
        let project = ["--project", "aider-corpus"];
        let first = report(&import_aider(home.path(), None, &project, &dir).await);
        assert_eq!(first["files"], files, "{first}");
        assert!(first["issues"].as_array().unwrap().is_empty(), "{first}");
        assert_eq!(first["messagesRejected"], 0, "{first}");
        let added = first["messagesAdded"].as_u64().unwrap();
        assert!(added > 100, "{first}");
        assert!(first["jobsAdmitted"].as_u64().unwrap() > 10, "{first}");
        let again = report(&import_aider(home.path(), None, &project, &dir).await);
        assert_eq!(again["messagesAdded"], 0, "{again}");
        assert_eq!(again["messagesExisting"].as_u64(), Some(added), "{again}");
    }
}

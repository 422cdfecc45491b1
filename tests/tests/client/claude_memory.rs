//! `zuno import claude-code-memory`: Claude Code's CLAUDE.md files, rules and auto memory become
//! the user's Memory entries with their provenance, without duplicates, under the caps; and the
//! installer's `--claude-md` line and `--import-memory` offer.

use serde_json::{Value, json};
use zuno_shared::config::Config;
use zuno_shared::transcript::import::project_for_cwd;
use zuno_tests::server::TestServer;
use zuno_tests::{TestDb, on_both_backends};

use crate::fixtures::*;

/// A user's Claude Code memory: user-level rules, a project `CLAUDE.md` (with Zuno's import
/// line), a rules file, and auto memory (an index with pointers and a note, a feedback topic
/// restating a CLAUDE.md rule, a `type: user` topic).
struct ClaudeFiles {
    home: tempfile::TempDir,
    project: tempfile::TempDir,
}

fn write(path: &std::path::Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn claude_files() -> ClaudeFiles {
    let home = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let claude = home.path().join(".claude");
    write(
        &claude.join("CLAUDE.md"),
        "# My preferences\n\n- Answer in English, even when I write in another language.\n",
    );
    write(
        &project.path().join("CLAUDE.md"),
        "# Demo app\n\n@.zuno/RULES.md\n\n## Commands\n\n- Run the tests with `cargo nextest run`.\n- Always use pnpm, not npm, to install dependencies.\n- Never push to main; open a pull request.\n",
    );
    write(
        &project.path().join(".claude/rules/style.md"),
        "Keep functions under 50 lines.\n",
    );
    let auto = claude
        .join("projects")
        .join(project.path().to_string_lossy().replace(['/', '.'], "-"))
        .join("memory");
    write(
        &auto.join("MEMORY.md"),
        "- [Installing](installing.md) — package manager\n- [About me](me.md) — role\n- The CI runs on Linux only.\n",
    );
    write(
        &auto.join("installing.md"),
        "---\nname: Installing\ndescription: which package manager\ntype: feedback\n---\n\nUse pnpm instead of npm to install dependencies.\n",
    );
    write(
        &auto.join("me.md"),
        "---\nname: About me\ndescription: the user's role\ntype: user\n---\n\nThe user is a backend developer: explain frontend code in more detail.\n",
    );
    ClaudeFiles { home, project }
}

fn import_command(
    server: &TestServer,
    files: &ClaudeFiles,
    flags: &[&str],
) -> std::process::Command {
    let mut command = zuno(server.home());
    command
        .env("HOME", files.home.path())
        .env_remove("CLAUDE_CONFIG_DIR")
        .args([
            "import",
            "claude-code-memory",
            "--json",
            "--server",
            &server.base,
        ])
        .args(flags)
        .arg(files.project.path());
    command
}

fn entries(read: &Value, scope: &str) -> Vec<(String, String)> {
    read["documents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["scope"] == scope)
        .flat_map(|d| d["entries"].as_array().unwrap().clone())
        .map(|e| {
            (
                e["content"].as_str().unwrap().to_owned(),
                e["owner"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

async fn claude_code_memory_becomes_the_users_entries_once(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    let files = claude_files();
    let cwd = files.project.path().to_string_lossy().into_owned();
    let (project, _) = project_for_cwd(&cwd);
    let (status, _) = server
        .post(
            "/api/projects",
            json!({"id": project, "name": "demo", "worktree": cwd}),
        )
        .await;
    assert_eq!(status, 201);
    // Memory already states one of the CLAUDE.md rules, in other words.
    add_project_rule(&server, &project, "Run tests with cargo nextest run.").await;

    let dry = run(import_command(&server, &files, &["--dry-run"]), None).await;
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    let dry: Value = serde_json::from_str(&dry.stdout).unwrap();
    assert_eq!(dry["added"], 6, "{dry}");
    let (_, read) = server.get(&format!("/api/projects/{project}/memory")).await;
    assert_eq!(
        entries(&read, "project").len(),
        1,
        "a dry run changes nothing"
    );

    let out = run(import_command(&server, &files, &[]), None).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(report["project"], project.as_str());
    assert_eq!(report["files"].as_array().unwrap().len(), 6, "{report}");
    assert_eq!(report["added"], 6, "{report}");
    assert_eq!(
        report["present"], 2,
        "the rule Memory had, and the auto-memory note restating a CLAUDE.md rule: {report}"
    );
    assert_eq!(report["skipped"], 0, "{report}");
    let outcomes: Vec<(&str, &str)> = report["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["content"].as_str().unwrap(),
                n["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert!(
        outcomes
            .iter()
            .all(|(content, _)| !content.starts_with('@') && !content.contains("](")),
        "import lines and index pointers are not notes: {outcomes:?}"
    );
    assert!(outcomes.contains(&(
        "Use pnpm instead of npm to install dependencies.",
        "present"
    )));

    let (_, read) = server.get(&format!("/api/projects/{project}/memory")).await;
    let project_entries = entries(&read, "project");
    let texts: Vec<&str> = project_entries.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(
        texts,
        [
            "Run tests with cargo nextest run.",
            "Always use pnpm, not npm, to install dependencies.",
            "Never push to main; open a pull request.",
            "Keep functions under 50 lines.",
            "The CI runs on Linux only.",
        ]
    );
    assert!(project_entries.iter().all(|(_, owner)| owner == "user"));
    let global: Vec<String> = entries(&read, "global")
        .into_iter()
        .map(|(c, _)| c)
        .collect();
    assert_eq!(
        global,
        [
            "Answer in English, even when I write in another language.",
            "The user is a backend developer: explain frontend code in more detail.",
        ]
    );
    // Provenance: each change names the file and line it came from.
    let (_, candidates) = server
        .get(&format!("/api/projects/{project}/memory/candidates"))
        .await;
    let claude_md = files.project.path().join("CLAUDE.md");
    assert!(
        candidates.as_array().unwrap().iter().any(|c| c["reason"]
            == format!(
                "imported from Claude Code memory: {}:8",
                claude_md.display()
            )),
        "{candidates}"
    );
    // The project rules are now projected where CLAUDE.md's import line reads them.
    let rules = std::fs::read_to_string(files.project.path().join(".zuno/RULES.md")).unwrap();
    assert!(rules.contains("Keep functions under 50 lines."), "{rules}");

    let again = run(import_command(&server, &files, &[]), None).await;
    assert_eq!(again.code, 0, "{}", again.stderr);
    let again: Value = serde_json::from_str(&again.stdout).unwrap();
    assert_eq!(
        (again["added"].as_u64(), again["present"].as_u64()),
        (Some(0), Some(8)),
        "{again}"
    );

    // A note the project document cannot hold is skipped with the server's reason; the rest of
    // the files are still read.
    write(
        &files.project.path().join(".claude/rules/long.md"),
        &format!(
            "{}\n\nPrefer small commits.\n",
            "Document every public item. ".repeat(110)
        ),
    );
    let capped = run(import_command(&server, &files, &[]), None).await;
    assert_eq!(capped.code, 0, "{}", capped.stderr);
    let capped: Value = serde_json::from_str(&capped.stdout).unwrap();
    assert_eq!(
        (capped["added"].as_u64(), capped["skipped"].as_u64()),
        (Some(1), Some(1)),
        "{capped}"
    );
    let skipped = capped["notes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["outcome"] == "skipped")
        .unwrap();
    assert!(
        skipped["detail"]
            .as_str()
            .unwrap()
            .contains("memory.project_char_limit"),
        "{skipped}"
    );
}

#[tokio::test]
async fn nothing_to_import_is_bad_input() {
    let home = tempfile::tempdir().unwrap();
    let empty = tempfile::tempdir().unwrap();
    let mut command = zuno(home.path());
    command
        .env("HOME", empty.path())
        .args(["import", "claude-code-memory"])
        .arg(empty.path());
    let out = run(command, None).await;
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("no Claude Code memory"),
        "{}",
        out.stderr
    );
}

/// `zuno install claude-code --claude-md` in a temporary HOME: the import line is shown, written
/// only with `--yes`, not added twice, and taken out again by `--uninstall`, which also removes
/// the settings files the install created. `--import-memory --yes` absorbs the memory it offers.
async fn install_claude_code_writes_the_rules_import_and_undoes_it(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    let files = claude_files();
    let claude_md = files.project.path().join("CLAUDE.md");
    let original = "# Demo app\n\nUse tabs for indentation.\n";
    std::fs::write(&claude_md, original).unwrap();
    let install = |flags: &[&str]| {
        let mut command = zuno(server.home());
        command
            .env("HOME", files.home.path())
            .env_remove("CLAUDE_CONFIG_DIR")
            .args([
                "install",
                "claude-code",
                "--claude-md",
                "--server",
                &server.base,
            ])
            .arg("--project-dir")
            .arg(files.project.path())
            .args(flags);
        command
    };
    let preview = run(install(&[]), None).await;
    assert_eq!(preview.code, 0, "{}", preview.stderr);
    assert!(
        preview.stdout.contains("+ @.zuno/RULES.md"),
        "{}",
        preview.stdout
    );
    assert!(
        preview.stdout.contains("Claude Code memory found"),
        "{}",
        preview.stdout
    );
    assert_eq!(std::fs::read_to_string(&claude_md).unwrap(), original);

    let applied = run(install(&["--yes"]), None).await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    assert_eq!(
        std::fs::read_to_string(&claude_md).unwrap(),
        format!("{original}\n@.zuno/RULES.md\n")
    );
    let settings = files.home.path().join(".claude/settings.json");
    let mcp = files.home.path().join(".claude.json");
    assert!(settings.exists() && mcp.exists());
    let again = run(install(&["--yes"]), None).await;
    assert_eq!(
        again.stdout.matches("already up to date").count(),
        3,
        "{}",
        again.stdout
    );

    let (project, _) = project_for_cwd(&files.project.path().to_string_lossy());
    let imported = run(install(&["--yes", "--import-memory"]), None).await;
    assert_eq!(imported.code, 0, "{}", imported.stderr);
    assert!(
        imported.stdout.contains("Claude Code memory imported"),
        "{}",
        imported.stdout
    );
    let (_, read) = server.get(&format!("/api/projects/{project}/memory")).await;
    assert!(
        entries(&read, "project")
            .iter()
            .any(|(c, _)| c == "Use tabs for indentation."),
        "{read}"
    );

    let removed = run(install(&["--uninstall", "--yes"]), None).await;
    assert_eq!(removed.code, 0, "{}", removed.stderr);
    assert_eq!(std::fs::read_to_string(&claude_md).unwrap(), original);
    assert!(!settings.exists(), "{}", removed.stdout);
    assert!(!mcp.exists(), "{}", removed.stdout);
}

on_both_backends!(
    claude_code_memory_becomes_the_users_entries_once,
    install_claude_code_writes_the_rules_import_and_undoes_it,
);

//! `zuno install claude-code`: diff first, `--yes` to write, idempotent, other settings kept.

use serde_json::{Value, json};

use crate::fixtures::*;

#[tokio::test]
async fn install_shows_the_diff_applies_with_yes_and_is_idempotent() {
    let home = tempfile::tempdir().unwrap();
    let claude = tempfile::tempdir().unwrap();
    let settings = claude.path().join(".claude").join("settings.json");
    let mcp = claude.path().join(".claude.json");
    std::fs::create_dir_all(settings.parent().unwrap()).unwrap();
    let existing = json!({
        "model": "opus",
        "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "notify-send done"}]}]}
    });
    std::fs::write(&settings, serde_json::to_string_pretty(&existing).unwrap()).unwrap();
    let install = |yes: bool| {
        let mut command = zuno(home.path());
        command
            .args([
                "install",
                "claude-code",
                "--server",
                "http://127.0.0.1:7878",
            ])
            .arg("--settings")
            .arg(&settings)
            .arg("--mcp-config")
            .arg(&mcp);
        if yes {
            command.arg("--yes");
        }
        command
    };

    let preview = run(install(false), None).await;
    assert_eq!(preview.code, 0, "{}", preview.stderr);
    assert!(preview.stdout.contains("+ "), "{}", preview.stdout);
    assert!(
        preview.stdout.contains("hook claude-code UserPromptSubmit"),
        "{}",
        preview.stdout
    );
    assert!(
        preview.stdout.contains("nothing written"),
        "{}",
        preview.stdout
    );
    let untouched: Value =
        serde_json::from_str(&std::fs::read_to_string(&settings).unwrap()).unwrap();
    assert_eq!(untouched, existing, "no --yes, no write");
    assert!(!mcp.exists());

    let applied = run(install(true), None).await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    let written: Value =
        serde_json::from_str(&std::fs::read_to_string(&settings).unwrap()).unwrap();
    assert_eq!(written["model"], "opus", "other settings are kept");
    let stop = written["hooks"]["Stop"].as_array().unwrap();
    assert_eq!(stop.len(), 2, "the user's own Stop hook stays beside ours");
    assert_eq!(stop[0]["hooks"][0]["command"], "notify-send done");
    let pre_tool_use = &written["hooks"]["PreToolUse"][0];
    assert_eq!(
        pre_tool_use["matcher"], "Bash|Edit|Write|MultiEdit|NotebookEdit|apply_patch",
        "only the tools guards check start the hook: {pre_tool_use}"
    );
    for event in ["SessionStart", "UserPromptSubmit", "PreToolUse", "Stop"] {
        let groups = written["hooks"][event].as_array().unwrap();
        let ours: Vec<&Value> = groups
            .iter()
            .flat_map(|g| g["hooks"].as_array().unwrap())
            .filter(|h| h["command"].as_str().unwrap().contains("hook claude-code"))
            .collect();
        assert_eq!(ours.len(), 1, "{event}");
        let command = ours[0]["command"].as_str().unwrap();
        assert!(
            command.ends_with(&format!(
                "hook claude-code {event} --server http://127.0.0.1:7878"
            )),
            "{command}"
        );
        assert!(command.contains(" --home "), "{command}");
        assert!(ours[0]["timeout"].as_u64().unwrap() <= 30);
    }
    let servers: Value = serde_json::from_str(&std::fs::read_to_string(&mcp).unwrap()).unwrap();
    assert_eq!(servers["mcpServers"]["zuno"]["type"], "stdio");
    // ZUNO_HOME was set at install time: the installed commands look for the local token in
    // the same data directory. No token is written into either file.
    let home_dir = home.path().to_string_lossy().into_owned();
    assert_eq!(
        servers["mcpServers"]["zuno"]["args"],
        json!([
            "--home",
            home_dir,
            "mcp",
            "--server",
            "http://127.0.0.1:7878"
        ])
    );
    for file in [&settings, &mcp] {
        let text = std::fs::read_to_string(file).unwrap();
        assert!(
            !text.contains("zuno_") && !text.to_lowercase().contains("token"),
            "no token in {}: {text}",
            file.display()
        );
    }
    assert!(
        applied.stdout.contains("local token in"),
        "{}",
        applied.stdout
    );

    let before = std::fs::read_to_string(&settings).unwrap();
    let again = run(install(true), None).await;
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(
        again.stdout.matches("already up to date").count(),
        2,
        "{}",
        again.stdout
    );
    assert_eq!(std::fs::read_to_string(&settings).unwrap(), before);
}

/// Mode bits of a file (`stat`), for the write-keeps-the-mode checks.
fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// A `settings.json` kept in a dotfiles repository and symlinked into `~/.claude` (as dotfile
/// managers do), written in the user's own style: the installer writes through the link to the
/// repository's file (atomically beside it, its mode kept, no temporary left), the link stays a
/// link, untouched parts keep their bytes (key order, four-space indent, an inline array) and new
/// lines follow that indent; `--uninstall` gives back both files byte for byte.
#[tokio::test]
async fn install_writes_through_a_symlinked_settings_file_and_uninstall_restores_its_bytes() {
    use std::os::unix::fs::PermissionsExt;
    let home = tempfile::tempdir().unwrap();
    let user = tempfile::tempdir().unwrap();
    let dotfiles = user.path().join("dotfiles").join("claude");
    std::fs::create_dir_all(&dotfiles).unwrap();
    let real = dotfiles.join("settings.json");
    let original = "{\n    \"theme\": \"dark\",\n    \"permissions\": {\"allow\": [\"Bash(ls:*)\", \"Read\"]},\n    \"model\": \"opus\",\n    \"hooks\": {\n        \"Stop\": [\n            {\"hooks\": [{\"type\": \"command\", \"command\": \"notify-send done\"}]}\n        ]\n    }\n}\n";
    std::fs::write(&real, original).unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o640)).unwrap();
    let claude = user.path().join(".claude");
    std::fs::create_dir_all(&claude).unwrap();
    let settings = claude.join("settings.json");
    std::os::unix::fs::symlink("../dotfiles/claude/settings.json", &settings).unwrap();
    // The MCP configuration in tabs and CRLF line endings, a regular file.
    let mcp = user.path().join(".claude.json");
    let mcp_original = "{\r\n\t\"numStartups\": 3,\r\n\t\"mcpServers\": {\r\n\t\t\"docs\": {\"command\": \"docs-mcp\"}\r\n\t}\r\n}\r\n";
    std::fs::write(&mcp, mcp_original).unwrap();
    let install = |flags: &[&str]| {
        let mut command = zuno(home.path());
        command
            .args([
                "install",
                "claude-code",
                "--server",
                "http://127.0.0.1:7878",
            ])
            .arg("--settings")
            .arg(&settings)
            .arg("--mcp-config")
            .arg(&mcp)
            .args(flags);
        command
    };

    let applied = run(install(&["--yes"]), None).await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    assert!(
        std::fs::symlink_metadata(&settings)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link is still a link"
    );
    let written = std::fs::read_to_string(&real).unwrap();
    assert_eq!(mode(&real), 0o640, "the repository file keeps its mode");
    let names: Vec<String> = std::fs::read_dir(&dotfiles)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["settings.json"], "no temporary file is left");
    assert!(
        written.starts_with(
            "{\n    \"theme\": \"dark\",\n    \"permissions\": {\"allow\": [\"Bash(ls:*)\", \"Read\"]},\n    \"model\": \"opus\",\n    \"hooks\": {\n        \"Stop\": [\n            {\"hooks\": [{\"type\": \"command\", \"command\": \"notify-send done\"}]},\n            {\n                \"hooks\": [\n"
        ),
        "the user's keys keep their order and bytes, ours follow in four spaces:\n{written}"
    );
    assert!(
        written.contains("\n        \"SessionStart\": [\n            {\n"),
        "{written}"
    );
    assert!(
        !written.contains("\n  \""),
        "no line is indented in two spaces:\n{written}"
    );
    let value: Value = serde_json::from_str(&written).unwrap();
    assert_eq!(value["hooks"]["Stop"].as_array().unwrap().len(), 2);
    let mcp_written = std::fs::read_to_string(&mcp).unwrap();
    assert!(
        mcp_written.starts_with(
            "{\r\n\t\"numStartups\": 3,\r\n\t\"mcpServers\": {\r\n\t\t\"docs\": {\"command\": \"docs-mcp\"},\r\n\t\t\"zuno\": {\r\n\t\t\t\"type\": \"stdio\",\r\n"
        ),
        "{mcp_written:?}"
    );
    assert!(
        !mcp_written.replace("\r\n", "").contains('\n'),
        "CRLF kept: {mcp_written:?}"
    );

    let again = run(install(&["--yes"]), None).await;
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(std::fs::read_to_string(&real).unwrap(), written);

    let removed = run(install(&["--uninstall", "--yes"]), None).await;
    assert_eq!(removed.code, 0, "{}", removed.stderr);
    assert_eq!(
        std::fs::read_to_string(&real).unwrap(),
        original,
        "byte for byte"
    );
    assert_eq!(std::fs::read_to_string(&mcp).unwrap(), mcp_original);
    assert!(
        std::fs::symlink_metadata(&settings)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(mode(&real), 0o640);
}

/// A symlinked file holding nothing but Zuno's entries is emptied on `--uninstall`, not removed
/// (removing the link would leave the repository's file behind; removing the target would leave
/// a dangling link); a dangling link is written through, creating its target.
#[tokio::test]
async fn uninstall_empties_a_symlinked_file_instead_of_removing_it() {
    let home = tempfile::tempdir().unwrap();
    let user = tempfile::tempdir().unwrap();
    let settings = user.path().join("settings.json");
    let real = user.path().join("dotfiles").join("settings.json");
    std::os::unix::fs::symlink(&real, &settings).unwrap();
    let mcp = user.path().join(".mcp.json");
    let install = |flags: &[&str]| {
        let mut command = zuno(home.path());
        command
            .args(["install", "claude-code"])
            .arg("--settings")
            .arg(&settings)
            .arg("--mcp-config")
            .arg(&mcp)
            .args(flags);
        command
    };
    let applied = run(install(&["--yes"]), None).await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    let value: Value = serde_json::from_str(&std::fs::read_to_string(&real).unwrap()).unwrap();
    assert!(value["hooks"]["SessionStart"].is_array(), "{value}");
    assert!(
        std::fs::symlink_metadata(&settings)
            .unwrap()
            .file_type()
            .is_symlink()
    );

    let removed = run(install(&["--uninstall", "--yes"]), None).await;
    assert_eq!(removed.code, 0, "{}", removed.stderr);
    assert_eq!(std::fs::read_to_string(&real).unwrap(), "{}\n");
    assert!(
        std::fs::symlink_metadata(&settings)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(!mcp.exists(), "a regular file left empty is removed");
}

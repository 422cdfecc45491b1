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

//! "A model without setup": `zuno install claude-code|codex` proposes the agent's own command
//! line as the learning model (diff first, `--yes` writes, a configured provider is never
//! replaced), else a local Ollama; `zuno learn status` says which model path is active.
//! Every run has its own HOME and a `PATH` holding only the stand-ins the test puts there.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use zuno_shared::config::{Config, ProviderApi, load_file};
use zuno_tests::server::TestServer;
use zuno_tests::{TestDb, on_both_backends};

use crate::fixtures::*;

/// A temporary HOME and data directory, and a `PATH` directory for stand-ins.
struct Machine {
    home: tempfile::TempDir,
    zuno_home: tempfile::TempDir,
    bin: tempfile::TempDir,
}

impl Machine {
    fn new() -> Machine {
        Machine {
            home: tempfile::tempdir().unwrap(),
            zuno_home: tempfile::tempdir().unwrap(),
            bin: tempfile::tempdir().unwrap(),
        }
    }

    /// Puts an executable `name` on this machine's `PATH` (it is never run by the installer).
    fn stand_in(&self, name: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = self.bin.path().join(name);
        std::fs::write(&path, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn config_file(&self) -> PathBuf {
        self.zuno_home.path().join("config.json")
    }

    /// `zuno install <agent>` writing only below this machine's HOME.
    fn install(&self, agent: &str, yes: bool) -> Command {
        let mut command = zuno(self.zuno_home.path());
        command
            .env("HOME", self.home.path())
            .env("PATH", self.bin.path())
            .env_remove("ZUNO_CONFIG")
            .args(["install", agent]);
        let dir = self.home.path();
        match agent {
            "claude-code" => command
                .arg("--settings")
                .arg(dir.join(".claude/settings.json"))
                .arg("--mcp-config")
                .arg(dir.join(".claude.json"))
                .arg("--project-dir")
                .arg(dir),
            _ => command
                .env("CODEX_HOME", dir.join(".codex"))
                .arg("--hooks-file")
                .arg(dir.join(".codex/hooks.json"))
                .arg("--codex-config")
                .arg(dir.join(".codex/config.toml")),
        };
        if yes {
            command.arg("--yes");
        }
        command
    }
}

fn written_config(path: &Path) -> Config {
    load_file(path).expect("the written configuration is valid")
}

#[tokio::test]
async fn install_claude_code_proposes_its_command_line_as_the_model() {
    let machine = Machine::new();
    let claude = machine.stand_in("claude");

    let preview = run(machine.install("claude-code", false), None).await;
    assert_eq!(preview.code, 0, "{}", preview.stderr);
    let config_file = machine.config_file();
    let out = &preview.stdout;
    assert!(
        out.contains(&format!("--- {}", config_file.display())),
        "{out}"
    );
    assert!(out.contains(r#"+       "api": "claude_cli","#), "{out}");
    assert!(
        out.contains(&format!(r#""command": "{}""#, claude.display())),
        "{out}"
    );
    assert!(
        out.contains(r#""extractor_model": "claude-code/haiku""#),
        "{out}"
    );
    assert!(out.contains("nothing written"), "{out}");
    assert!(!config_file.exists(), "nothing is written without --yes");

    let applied = run(machine.install("claude-code", true), None).await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    let config = written_config(&config_file);
    let provider = &config.providers["claude-code"];
    assert_eq!(provider.api, ProviderApi::ClaudeCli);
    assert_eq!(provider.command(), Some(claude.to_str().unwrap()));
    assert_eq!(
        config.learning.extractor_model.as_deref(),
        Some("claude-code/haiku")
    );

    // Installed: the provider is there, nothing more is proposed.
    let before = std::fs::read_to_string(&config_file).unwrap();
    let again = run(machine.install("claude-code", true), None).await;
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert!(
        !again.stdout.contains(&config_file.display().to_string()),
        "{}",
        again.stdout
    );
    assert_eq!(std::fs::read_to_string(&config_file).unwrap(), before);
}

#[tokio::test]
async fn install_codex_proposes_its_command_line_as_the_model() {
    let machine = Machine::new();
    let codex = machine.stand_in("codex");
    // Claude Code on PATH does not matter to the Codex installer.
    machine.stand_in("claude");
    let applied = run(machine.install("codex", true), None).await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    assert!(
        applied.stdout.contains(r#""api": "codex_cli""#),
        "{}",
        applied.stdout
    );
    let config = written_config(&machine.config_file());
    assert_eq!(config.providers.len(), 1, "{:?}", config.providers);
    assert_eq!(config.providers["codex"].api, ProviderApi::CodexCli);
    assert_eq!(
        config.providers["codex"].command(),
        Some(codex.to_str().unwrap())
    );
    assert_eq!(
        config.learning.extractor_model.as_deref(),
        Some("codex/default"),
        "Codex's own model"
    );
}

#[tokio::test]
async fn without_the_agent_or_ollama_nothing_is_proposed() {
    let machine = Machine::new();
    // `zuno` on PATH is not an agent.
    machine.stand_in("zuno");
    for agent in ["claude-code", "codex"] {
        let applied = run(machine.install(agent, true), None).await;
        assert_eq!(applied.code, 0, "{}", applied.stderr);
        assert!(
            applied.stdout.contains("no model configured (rules-2)")
                && applied.stdout.contains("zuno install claude-code"),
            "{}",
            applied.stdout
        );
        assert!(!machine.config_file().exists(), "{}", applied.stdout);
    }
}

#[tokio::test]
async fn a_configured_provider_is_never_replaced() {
    let machine = Machine::new();
    machine.stand_in("claude");
    let existing = json!({
        "providers": {"openai": {"api": "openai_chat", "base_url": "https://api.openai.com/v1",
                                 "api_key_env": "OPENAI_API_KEY", "small_model": "gpt-5-mini"}}
    });
    let text = serde_json::to_string_pretty(&existing).unwrap();
    std::fs::write(machine.config_file(), &text).unwrap();
    let applied = run(machine.install("claude-code", true), None).await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    assert!(!applied.stdout.contains("claude_cli"), "{}", applied.stdout);
    assert_eq!(
        std::fs::read_to_string(machine.config_file()).unwrap(),
        text
    );
}

#[tokio::test]
async fn a_local_ollama_is_proposed_when_the_agent_is_not_on_path() {
    // A stand-in Ollama answering `GET /api/tags` on a loopback port named by OLLAMA_HOST.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/api/tags",
        axum::routing::get(|| async {
            axum::Json(json!({"models": [
                {"name": "nomic-embed-text:latest", "model": "nomic-embed-text:latest"},
                {"name": "qwen3:4b", "model": "qwen3:4b"}
            ]}))
        }),
    );
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let machine = Machine::new();
    let mut install = machine.install("claude-code", false);
    install.env("OLLAMA_HOST", address.to_string());
    let preview = run(install, None).await;
    server.abort();
    assert_eq!(preview.code, 0, "{}", preview.stderr);
    let out = &preview.stdout;
    assert!(out.contains(r#""api": "openai_chat""#), "{out}");
    assert!(
        out.contains(&format!(r#""base_url": "http://{address}/v1""#)),
        "{out}"
    );
    assert!(
        out.contains(r#""extractor_model": "ollama/qwen3:4b""#),
        "an embedding model cannot answer: {out}"
    );
    assert!(!machine.config_file().exists());
}

async fn learn_status_names_the_active_model_path(db: TestDb) {
    let mut config: Config = serde_json::from_value(json!({
        "providers": {"claude-code": {"api": "claude_cli", "small_model": "haiku"}},
        "learning": {"extractor_model": "claude-code/haiku"}
    }))
    .unwrap();
    config.learning.post_turn.enabled = false;
    let server = TestServer::start(&db, config, None).await;
    server
        .post("/api/projects", json!({"id": "p", "name": "P"}))
        .await;
    let mut command = zuno(server.home());
    command.args([
        "learn",
        "--project",
        "p",
        "status",
        "--server",
        &server.base,
    ]);
    let status = run(command, None).await;
    assert_eq!(status.code, 0, "{}", status.stderr);
    assert!(
        status
            .stdout
            .contains("active: claude_cli claude-code/haiku"),
        "{}",
        status.stdout
    );
    assert!(!status.stdout.contains("hint"), "{}", status.stdout);
    let mut command = zuno(server.home());
    command.args([
        "learn",
        "--project",
        "p",
        "status",
        "--json",
        "--server",
        &server.base,
    ]);
    let json: Value = serde_json::from_str(&run(command, None).await.stdout).unwrap();
    assert_eq!(
        json["modelPath"],
        json!({"active": "claude_cli claude-code/haiku", "provider": "claude-code",
               "api": "claude_cli", "model": "haiku"})
    );
}

/// Without a model, turns that carry no explicit correction teach the rules extractor nothing:
/// `learn status` says how much it read and why nothing was kept, and how to get a model.
async fn learn_status_explains_an_empty_result(db: TestDb) {
    let server = TestServer::start(&db, Config::default(), None).await;
    server
        .post("/api/projects", json!({"id": "p", "name": "P"}))
        .await;
    let (_, session) = server.post("/api/projects/p/sessions", json!({})).await;
    let session = session["id"].as_str().unwrap().to_owned();
    for prompt in [
        "add a sort dropdown to the listings page",
        "the translation keys go in en.json only, I do the other locales",
    ] {
        server
            .post(
                &format!("/api/session/{session}/messages"),
                json!({"role": "user", "parts": [{"type": "text", "text": prompt}]}),
            )
            .await;
        server
            .post(
                &format!("/api/session/{session}/messages"),
                json!({"role": "assistant", "status": "completed", "parts": [
                    {"type": "tool_call", "toolName": "edit", "arguments": {"path": "app/page.tsx"},
                     "result": "ok", "status": "completed"}]}),
            )
            .await;
    }
    server.drain_extraction("status-test").await;
    let mut command = zuno(server.home());
    command.args([
        "learn",
        "--project",
        "p",
        "status",
        "--json",
        "--server",
        &server.base,
    ]);
    let json: Value = serde_json::from_str(&run(command, None).await.stdout).unwrap();
    assert_eq!(json["experiences"], 0, "{json}");
    let explanation = json["explanation"].as_str().unwrap_or_default();
    assert!(
        explanation
            .starts_with("2 prompts read, 2 closed turns admitted for extraction, 0 lessons"),
        "{explanation}"
    );
    assert!(
        explanation.contains("rules-2") && explanation.contains("zuno install claude-code"),
        "{explanation}"
    );
}

on_both_backends!(
    learn_status_names_the_active_model_path,
    learn_status_explains_an_empty_result
);

//! `zuno install claude-code|codex`: wires an agent to Zuno (its hooks and the `zuno mcp`
//! server). It shows the diff first and writes only with `--yes`; running it again changes
//! nothing (Zuno's entries are recognised and updated in place); `--uninstall` takes out exactly
//! what it added and leaves everything else in those files as it was.
//!
//! - Claude Code: hooks in `settings.json`, the MCP server in `~/.claude.json` (`.mcp.json` for
//!   the project scope); with `--claude-md`, an `@.zuno/RULES.md` import line in the project's
//!   `CLAUDE.md`, so Zuno's project rules load natively even where hooks are disabled. It also
//!   offers to import Claude Code's own memory (`--import-memory`).
//! - Codex: hooks in `hooks.json` beside Codex's configuration, the MCP server as
//!   `[mcp_servers.zuno]` in `config.toml` (edited in place, comments and layout kept), and the
//!   hooks feature switched on (`[features] codex_hooks = true`) unless the user set it either way.
//!
//! Without a model configured, both also propose one in Zuno's own `config.json` (same diff,
//! same `--yes`): the agent's command line as a provider (`claude_cli`, `codex_cli`) when its
//! executable is on `PATH`, else a local Ollama's OpenAI-compatible endpoint with one of its
//! models. A configured provider is never replaced, and `--uninstall` leaves the model alone.
//!
//! No token is ever written into these files (a project-scope file is often committed): the
//! installed commands read the local token from Zuno's data directory when they run, and a
//! non-default data directory (`--home`/`ZUNO_HOME` at install time) is written into them so they
//! look in the same place.

use std::path::{Path, PathBuf};

use clap::ValueEnum;
use serde_json::{Map, Value, json};

use crate::agent_file;
use crate::error::CliError;
use crate::global::GlobalArgs;

/// Hook events Zuno handles, with the timeout (seconds) written for each and the tools a
/// matcher limits it to (`PreToolUse`: the tools guards check, so reads and searches start no
/// process).
const HOOKS: [(&str, u64, Option<&str>); 4] = [
    ("SessionStart", 10, None),
    ("UserPromptSubmit", 10, None),
    (
        "PreToolUse",
        5,
        Some("Bash|Edit|Write|MultiEdit|NotebookEdit|apply_patch"),
    ),
    ("Stop", 30, None),
];
/// The line that makes Claude Code load Zuno's project rules from `CLAUDE.md`.
pub const RULES_IMPORT_LINE: &str = "@.zuno/RULES.md";
/// Marks the Codex feature switch the installer added (so `--uninstall` removes only its own).
const ADDED_BY_ZUNO: &str = "# added by `zuno install codex` (hooks run only with it)";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scope {
    /// The user's configuration (`~/.claude/…`, `~/.codex/…`).
    User,
    /// The current directory's (`.claude/settings.json` and `.mcp.json`, `.codex/…`).
    Project,
}

/// What both installers take.
#[derive(Debug, clap::Args)]
pub struct CommonArgs {
    #[arg(long, value_enum, default_value_t = Scope::User)]
    pub scope: Scope,
    /// The server the hooks and MCP server call (written into the commands).
    #[arg(long)]
    pub server: Option<String>,
    /// Register the MCP server with `--read-only` (no `memory_update`).
    #[arg(long)]
    pub read_only: bool,
    /// Apply the changes (without it, only the diff is shown).
    #[arg(long)]
    pub yes: bool,
    /// Take Zuno's hooks, MCP server and import line out again (diff first; `--yes` applies).
    #[arg(long)]
    pub uninstall: bool,
}

#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// The settings file to edit (overrides --scope).
    #[arg(long)]
    pub settings: Option<PathBuf>,
    /// The MCP configuration file to edit (overrides --scope).
    #[arg(long)]
    pub mcp_config: Option<PathBuf>,
    /// Add an `@.zuno/RULES.md` import line to the project's `CLAUDE.md`, so Zuno's project rules
    /// load natively even where hooks are disabled.
    #[arg(long)]
    pub claude_md: bool,
    /// The project directory for `--claude-md` and `--import-memory` (default: the current
    /// directory).
    #[arg(long)]
    pub project_dir: Option<PathBuf>,
    /// With `--yes`, also import Claude Code's own memory (CLAUDE.md files, rules, auto memory)
    /// into Zuno's Memory (`zuno import claude-code-memory`).
    #[arg(long)]
    pub import_memory: bool,
    /// Claude Code's configuration directory, for the memory import (default:
    /// `$CLAUDE_CONFIG_DIR`, else `~/.claude`).
    #[arg(long)]
    pub claude_home: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct CodexInstallArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// The hooks file to edit (overrides --scope; default `$CODEX_HOME/hooks.json`, where
    /// `CODEX_HOME` defaults to `~/.codex`).
    #[arg(long)]
    pub hooks_file: Option<PathBuf>,
    /// The Codex `config.toml` to edit (overrides --scope).
    #[arg(long)]
    pub codex_config: Option<PathBuf>,
}

#[derive(Debug, clap::Subcommand)]
pub enum InstallCommand {
    /// Claude Code hooks (SessionStart, UserPromptSubmit, Stop) and the `zuno mcp` server.
    ClaudeCode(InstallArgs),
    /// Codex hooks (SessionStart, UserPromptSubmit, Stop) and the `zuno mcp` server.
    Codex(CodexInstallArgs),
}

/// One file's planned content: `None` before means absent, `None` after means remove it.
struct Edit {
    path: PathBuf,
    before: Option<String>,
    after: Option<String>,
}

impl Edit {
    fn changes(&self) -> bool {
        self.before != self.after
    }
}

/// What the installed commands are: this binary, with the data directory when one was given.
struct Commands {
    exe: String,
    home: Option<String>,
    server: Option<String>,
    read_only: bool,
}

impl Commands {
    fn new(global: &GlobalArgs, common: &CommonArgs) -> Result<Commands, CliError> {
        let exe = std::env::current_exe()
            .map_err(|error| CliError::new(CliError::FAILURE, error.to_string()))?;
        let home = match &global.home {
            Some(home) => Some(
                std::path::absolute(home)
                    .map_err(|error| CliError::new(CliError::BAD_INPUT, error.to_string()))?
                    .to_string_lossy()
                    .into_owned(),
            ),
            None => None,
        };
        Ok(Commands {
            exe: exe.to_string_lossy().into_owned(),
            home,
            server: common.server.clone(),
            read_only: common.read_only,
        })
    }

    /// The hook command line for `agent` (`claude-code`, `codex`) and `event`.
    fn hook(&self, agent: &str, event: &str) -> String {
        let mut command = shell_quote(&self.exe);
        if let Some(home) = &self.home {
            command.push_str(&format!(" --home {}", shell_quote(home)));
        }
        command.push_str(&format!(" hook {agent} {event}"));
        if let Some(server) = &self.server {
            command.push_str(&format!(" --server {}", shell_quote(server)));
        }
        command
    }

    /// The MCP server's arguments.
    fn mcp_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(home) = &self.home {
            args.push(String::from("--home"));
            args.push(home.clone());
        }
        args.push(String::from("mcp"));
        if let Some(server) = &self.server {
            args.push(String::from("--server"));
            args.push(server.clone());
        }
        if self.read_only {
            args.push(String::from("--read-only"));
        }
        args
    }
}

pub async fn run(global: &GlobalArgs, command: InstallCommand) -> Result<(), CliError> {
    match command {
        InstallCommand::ClaudeCode(args) => claude_code(global, args).await,
        InstallCommand::Codex(args) => codex(global, &args).await,
    }
}

fn home_dir() -> Result<PathBuf, CliError> {
    directories::BaseDirs::new()
        .map(|dirs| dirs.home_dir().to_path_buf())
        .ok_or_else(|| CliError::new(CliError::FAILURE, "no home directory"))
}

fn current_dir() -> Result<PathBuf, CliError> {
    std::env::current_dir().map_err(|error| CliError::new(CliError::FAILURE, error.to_string()))
}

async fn claude_code(global: &GlobalArgs, args: InstallArgs) -> Result<(), CliError> {
    let common = &args.common;
    let (settings_default, mcp_default) = match common.scope {
        Scope::User => {
            let home = home_dir()?;
            (
                home.join(".claude").join("settings.json"),
                home.join(".claude.json"),
            )
        }
        Scope::Project => {
            let dir = current_dir()?;
            (
                dir.join(".claude").join("settings.json"),
                dir.join(".mcp.json"),
            )
        }
    };
    let settings_path = args.settings.clone().unwrap_or(settings_default);
    let mcp_path = args.mcp_config.clone().unwrap_or(mcp_default);
    let project_dir = match &args.project_dir {
        Some(dir) => dir.clone(),
        None => current_dir()?,
    };
    let commands = Commands::new(global, common)?;
    let uninstall = common.uninstall;
    let mut edits = vec![
        json_edit(&settings_path, |value| {
            if uninstall {
                remove_hooks(value, "claude-code");
            } else {
                add_hooks(value, &commands, "claude-code");
            }
        })?,
        json_edit(&mcp_path, |value| {
            if uninstall {
                remove_mcp(value);
            } else {
                add_mcp(value, &commands);
            }
        })?,
    ];
    let claude_md = project_dir.join("CLAUDE.md");
    if uninstall || args.claude_md {
        let before = read_optional(&claude_md)?;
        let after = if uninstall {
            // A symlinked CLAUDE.md is emptied, never removed (the link would dangle).
            before
                .as_deref()
                .and_then(without_rules_import)
                .or_else(|| (before.is_some() && agent_file::is_link(&claude_md)).then(String::new))
        } else {
            Some(with_rules_import(before.as_deref().unwrap_or("")))
        };
        edits.push(Edit {
            path: claude_md,
            before,
            after,
        });
    }
    if !uninstall {
        edits.extend(model_edit(global, Agent::ClaudeCode).await?);
    }
    apply(&edits, common.yes)?;
    if !uninstall {
        offer_memory_import(global, &args, &project_dir).await?;
        token_note(global, common)?;
    }
    Ok(())
}

/// Tells what Claude Code memory there is to absorb, and imports it with `--import-memory --yes`.
async fn offer_memory_import(
    global: &GlobalArgs,
    args: &InstallArgs,
    project_dir: &Path,
) -> Result<(), CliError> {
    let project_dir = std::path::absolute(project_dir)
        .map_err(|error| CliError::new(CliError::BAD_INPUT, error.to_string()))?;
    let home = crate::claude_memory::claude_home(args.claude_home.as_deref());
    let (files, notes) = crate::claude_memory::collect(&project_dir, home.as_deref(), true);
    if notes.is_empty() {
        return Ok(());
    }
    if !(args.import_memory && args.common.yes) {
        println!(
            "Claude Code memory found: {} entr{} in {} file(s); `zuno import claude-code-memory {}` (or this command with --import-memory --yes) adds them to Zuno's Memory",
            notes.len(),
            if notes.len() == 1 { "y" } else { "ies" },
            files.len(),
            project_dir.display()
        );
        return Ok(());
    }
    let server = crate::client::ServerArgs {
        server: args.common.server.clone(),
        token: None,
    };
    let client = crate::client::ApiClient::connect(global, &server).await?;
    let report =
        crate::claude_memory::import(&client, &project_dir, None, files, notes, false).await?;
    println!(
        "Claude Code memory imported into project `{}`: {} added, {} already in Memory, {} skipped",
        report.project, report.added, report.present, report.skipped
    );
    Ok(())
}

async fn codex(global: &GlobalArgs, args: &CodexInstallArgs) -> Result<(), CliError> {
    let common = &args.common;
    let dir = match common.scope {
        Scope::User => match std::env::var_os("CODEX_HOME").filter(|dir| !dir.is_empty()) {
            Some(dir) => PathBuf::from(dir),
            None => home_dir()?.join(".codex"),
        },
        Scope::Project => current_dir()?.join(".codex"),
    };
    let hooks_path = args
        .hooks_file
        .clone()
        .unwrap_or_else(|| dir.join("hooks.json"));
    let config_path = args
        .codex_config
        .clone()
        .unwrap_or_else(|| dir.join("config.toml"));
    let commands = Commands::new(global, common)?;
    let uninstall = common.uninstall;
    let hooks = json_edit(&hooks_path, |value| {
        if uninstall {
            remove_hooks(value, "codex");
        } else {
            add_hooks(value, &commands, "codex");
        }
    })?;
    let before = read_optional(&config_path)?;
    let mut document: toml_edit::DocumentMut =
        before.as_deref().unwrap_or("").parse().map_err(|error| {
            CliError::new(
                CliError::BAD_INPUT,
                format!(
                    "`{}` is not valid TOML ({error}); fix it first",
                    config_path.display()
                ),
            )
        })?;
    let disabled = if uninstall {
        remove_codex_config(&mut document);
        None
    } else {
        add_codex_config(&mut document, &commands)
    };
    let text = document.to_string();
    let after = if document.to_string() == before.as_deref().unwrap_or("") {
        before.clone()
    } else if uninstall && text.trim().is_empty() && !agent_file::is_link(&config_path) {
        None
    } else {
        Some(text)
    };
    let mut edits = vec![
        hooks,
        Edit {
            path: config_path.clone(),
            before,
            after,
        },
    ];
    if !uninstall {
        edits.extend(model_edit(global, Agent::Codex).await?);
    }
    apply(&edits, common.yes)?;
    if !uninstall {
        if let Some(key) = disabled {
            println!(
                "note: `{}` turns hooks off (`[features] {key} = false`): Zuno's hooks will not run until you enable them",
                config_path.display()
            );
        }
        println!(
            "Codex asks you to review and trust new hooks (`/hooks`) before they run; the MCP server needs no review"
        );
        token_note(global, common)?;
    }
    Ok(())
}

/// The agent an installer wires, for the model it proposes.
#[derive(Debug, Clone, Copy)]
enum Agent {
    ClaudeCode,
    Codex,
}

/// A model to propose: the provider entry to add to `config.json` and the extractor model.
struct ModelProposal {
    provider: &'static str,
    entry: Value,
    model: String,
    why: String,
}

/// Plans the model edit of Zuno's `config.json`, or `None` when a provider or an extractor
/// model is configured already, or no model was found.
async fn model_edit(global: &GlobalArgs, agent: Agent) -> Result<Option<Edit>, CliError> {
    let path = match &global.config {
        Some(path) => path.clone(),
        None => zuno_shared::paths::Paths::resolve(global.home.as_deref()).config_file(),
    };
    let current = match read_optional(&path)? {
        Some(text) if !text.trim().is_empty() => match serde_json::from_str::<Value>(&text) {
            Ok(value) => value,
            // `zuno` itself reports an unreadable configuration; the hooks still install.
            Err(_) => return Ok(None),
        },
        _ => json!({}),
    };
    let has_providers = current
        .get("providers")
        .is_some_and(|providers| providers.as_object().is_none_or(|map| !map.is_empty()));
    let has_model = current.pointer("/learning/extractor_model").is_some();
    if !current.is_object() || has_providers || has_model {
        return Ok(None);
    }
    let Some(proposal) = propose_model(agent).await else {
        println!(
            "learning: no model configured (rules-2). {}",
            zuno_shared::learning::projection::NO_MODEL_HINT
        );
        return Ok(None);
    };
    println!(
        "learning: no model configured; {} — the diff below adds it as the extraction model `{}`",
        proposal.why, proposal.model
    );
    let edit = json_edit(&path, |config| {
        let Some(root) = config.as_object_mut() else {
            return;
        };
        let providers = root.entry("providers").or_insert_with(|| json!({}));
        if let Some(providers) = providers.as_object_mut() {
            providers.insert(proposal.provider.to_owned(), proposal.entry.clone());
        }
        let learning = root.entry("learning").or_insert_with(|| json!({}));
        if let Some(learning) = learning.as_object_mut() {
            learning.insert(
                String::from("extractor_model"),
                Value::from(proposal.model.as_str()),
            );
        }
    })?;
    Ok(Some(edit))
}

/// The agent's own command line when its executable is on `PATH`, else a local Ollama.
async fn propose_model(agent: Agent) -> Option<ModelProposal> {
    let (executable, provider, api, model) = match agent {
        Agent::ClaudeCode => ("claude", "claude-code", "claude_cli", "haiku"),
        Agent::Codex => (
            "codex",
            "codex",
            "codex_cli",
            zuno_shared::provider::CLI_DEFAULT_MODEL,
        ),
    };
    if let Some(found) = find_on_path(executable) {
        let command = found.to_string_lossy().into_owned();
        return Some(ModelProposal {
            provider,
            entry: json!({ "api": api, "command": command, "small_model": model }),
            model: format!("{provider}/{model}"),
            why: format!(
                "`{executable}` is on PATH ({command}): learning can ask it under your own login"
            ),
        });
    }
    let (base_url, model) = ollama_model().await?;
    Some(ModelProposal {
        provider: "ollama",
        entry: json!({ "api": "openai_chat", "base_url": base_url, "small_model": model }),
        model: format!("ollama/{model}"),
        why: format!("a local Ollama answers at {base_url}"),
    })
}

/// The first executable file named `name` in a `PATH` directory.
fn find_on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(name))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        })
}

/// A local Ollama's OpenAI-compatible base URL and one of its chat models (`GET /api/tags`,
/// with a short timeout). The server is `OLLAMA_HOST` (Ollama's own variable), else
/// 127.0.0.1:11434. Embedding models are passed over: they cannot answer.
async fn ollama_model() -> Option<(String, String)> {
    let host = std::env::var("OLLAMA_HOST")
        .ok()
        .filter(|host| !host.trim().is_empty())
        .unwrap_or_else(|| String::from("127.0.0.1:11434"));
    let origin = if host.starts_with("http://") || host.starts_with("https://") {
        host.trim_end_matches('/').to_owned()
    } else {
        format!("http://{}", host.trim_end_matches('/'))
    };
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(std::time::Duration::from_millis(1500))
        .build()
        .ok()?;
    let response = client.get(format!("{origin}/api/tags")).send().await.ok()?;
    let tags: Value = response.error_for_status().ok()?.json().await.ok()?;
    let model = tags["models"]
        .as_array()?
        .iter()
        .filter_map(|model| model["name"].as_str())
        .find(|name| !name.contains("embed"))?;
    Some((format!("{origin}/v1"), model.to_owned()))
}

fn token_note(global: &GlobalArgs, common: &CommonArgs) -> Result<(), CliError> {
    let server = common
        .server
        .as_deref()
        .unwrap_or(crate::hook::DEFAULT_SERVER);
    if crate::client::is_loopback_url(server) {
        let settings = global.settings()?;
        println!(
            "the hooks and the MCP server authenticate with the local token in {} (created by the server's first start)",
            zuno_shared::tokens::local::path(&settings.paths).display()
        );
    } else {
        println!(
            "the hooks and the MCP server call {server}: give them its token in ZUNO_API_TOKEN (it is not written into these files)"
        );
    }
    Ok(())
}

fn read_optional(path: &Path) -> Result<Option<String>, CliError> {
    crate::agent_file::read_optional(path).map_err(|error| {
        CliError::new(
            CliError::FAILURE,
            format!("cannot read `{}`: {error}", path.display()),
        )
    })
}

/// Plans an edit of a JSON object file. The user's text is edited in place (see
/// [`crate::json_text`]): what the change doesn't touch keeps its bytes, so an unchanged document
/// is byte for byte the same and `--uninstall` gives back what was there before. A file left
/// holding an empty object by `--uninstall` is removed (a symlinked one is kept, emptied).
fn json_edit(path: &Path, update: impl FnOnce(&mut Value)) -> Result<Edit, CliError> {
    let before = read_optional(path)?;
    let value: Value = match &before {
        Some(text) if !text.trim().is_empty() => serde_json::from_str(text).map_err(|error| {
            CliError::new(
                CliError::BAD_INPUT,
                format!(
                    "`{}` is not valid JSON ({error}); fix it first",
                    path.display()
                ),
            )
        })?,
        _ => json!({}),
    };
    if !value.is_object() {
        return Err(CliError::new(
            CliError::BAD_INPUT,
            format!("`{}` does not hold a JSON object", path.display()),
        ));
    }
    let mut updated = value.clone();
    update(&mut updated);
    let after = if updated == value {
        before.clone()
    } else if updated.as_object().is_some_and(Map::is_empty) && !agent_file::is_link(path) {
        None
    } else {
        Some(match before.as_deref() {
            Some(text) if !text.trim().is_empty() => crate::json_text::edit(text, &value, &updated),
            _ => pretty(&updated),
        })
    };
    Ok(Edit {
        path: path.to_path_buf(),
        before,
        after,
    })
}

/// Shows each change as a diff and, with `yes`, writes (or removes) the files.
fn apply(edits: &[Edit], yes: bool) -> Result<(), CliError> {
    let mut changed = false;
    for edit in edits {
        if !edit.changes() {
            match edit.before {
                Some(_) => println!("{}: already up to date", edit.path.display()),
                None => println!("{}: nothing to remove", edit.path.display()),
            }
            continue;
        }
        changed = true;
        println!("--- {}", edit.path.display());
        println!("+++ {}", edit.path.display());
        print!(
            "{}",
            diff(
                edit.before.as_deref().unwrap_or(""),
                edit.after.as_deref().unwrap_or("")
            )
        );
        if edit.after.is_none() {
            println!("(the file is removed: nothing else is left in it)");
        }
        if yes {
            match &edit.after {
                Some(text) => write(&edit.path, text)?,
                None => std::fs::remove_file(&edit.path).map_err(|error| {
                    CliError::new(
                        CliError::FAILURE,
                        format!("cannot remove `{}`: {error}", edit.path.display()),
                    )
                })?,
            }
            println!("wrote {}", edit.path.display());
        }
    }
    if changed && !yes {
        println!("nothing written: run again with --yes to apply");
    }
    Ok(())
}

fn pretty(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
}

/// Writes through a symlink to the file it names, atomically, keeping that file's mode.
fn write(path: &Path, text: &str) -> Result<(), CliError> {
    agent_file::write(path, text).map(drop).map_err(|error| {
        CliError::new(
            CliError::FAILURE,
            format!("cannot write `{}`: {error}", path.display()),
        )
    })
}

fn shell_quote(value: &str) -> String {
    if value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-' | ':'))
    {
        value.to_owned()
    } else {
        format!("'{}'", value.replace('\'', r"'\''"))
    }
}

/// Whether a hook handler is Zuno's for `agent`.
fn is_ours(handler: &Value, agent: &str) -> bool {
    handler
        .get("command")
        .and_then(Value::as_str)
        .is_some_and(|command| command.contains(&format!(" hook {agent} ")))
}

/// Adds (or updates) one command hook per event; an existing Zuno hook for the event is
/// recognised by its `hook <agent> <Event>` command and replaced in place. Claude Code and
/// Codex read the same shape: event → matcher groups → handlers.
fn add_hooks(settings: &mut Value, commands: &Commands, agent: &str) {
    let Some(root) = settings.as_object_mut() else {
        return;
    };
    let hooks = root
        .entry("hooks")
        .or_insert_with(|| Value::Object(Map::new()));
    if !hooks.is_object() {
        *hooks = Value::Object(Map::new());
    }
    let Some(hooks) = hooks.as_object_mut() else {
        return;
    };
    for (event, timeout, matcher) in HOOKS {
        let handler = json!({ "type": "command", "command": commands.hook(agent, event), "timeout": timeout });
        let marker = format!(" hook {agent} {event}");
        let groups = hooks
            .entry(event)
            .or_insert_with(|| Value::Array(Vec::new()));
        if !groups.is_array() {
            *groups = Value::Array(Vec::new());
        }
        let Some(groups) = groups.as_array_mut() else {
            continue;
        };
        let mut found = false;
        for group in groups.iter_mut() {
            let Some(handlers) = group.get_mut("hooks").and_then(Value::as_array_mut) else {
                continue;
            };
            for existing in handlers.iter_mut() {
                let ours = existing
                    .get("command")
                    .and_then(Value::as_str)
                    .is_some_and(|command| command.contains(&marker));
                if ours {
                    *existing = handler.clone();
                    found = true;
                }
            }
        }
        if !found {
            groups.push(match matcher {
                Some(matcher) => json!({ "matcher": matcher, "hooks": [handler] }),
                None => json!({ "hooks": [handler] }),
            });
        }
    }
}

/// Removes Zuno's hook handlers for `agent`, then the groups, events and `hooks` object they
/// leave empty; other hooks stay as they are.
fn remove_hooks(settings: &mut Value, agent: &str) {
    let Some(root) = settings.as_object_mut() else {
        return;
    };
    let Some(hooks) = root.get_mut("hooks").and_then(Value::as_object_mut) else {
        return;
    };
    for groups in hooks.values_mut() {
        let Some(groups) = groups.as_array_mut() else {
            continue;
        };
        groups.retain_mut(|group| {
            let Some(handlers) = group.get_mut("hooks").and_then(Value::as_array_mut) else {
                return true;
            };
            let before = handlers.len();
            handlers.retain(|handler| !is_ours(handler, agent));
            before == handlers.len() || !handlers.is_empty()
        });
    }
    hooks.retain(|_, groups| !groups.as_array().is_some_and(Vec::is_empty));
    if hooks.is_empty() {
        root.remove("hooks");
    }
}

/// Adds (or updates) the `zuno` stdio MCP server in a Claude Code MCP configuration.
fn add_mcp(config: &mut Value, commands: &Commands) {
    let Some(root) = config.as_object_mut() else {
        return;
    };
    let servers = root
        .entry("mcpServers")
        .or_insert_with(|| Value::Object(Map::new()));
    if !servers.is_object() {
        *servers = Value::Object(Map::new());
    }
    if let Some(servers) = servers.as_object_mut() {
        servers.insert(
            String::from("zuno"),
            json!({ "type": "stdio", "command": commands.exe, "args": commands.mcp_args() }),
        );
    }
}

/// Removes the `zuno` MCP server (and `mcpServers` when nothing else is in it).
fn remove_mcp(config: &mut Value) {
    let Some(root) = config.as_object_mut() else {
        return;
    };
    let Some(servers) = root.get_mut("mcpServers").and_then(Value::as_object_mut) else {
        return;
    };
    servers.remove("zuno");
    if servers.is_empty() {
        root.remove("mcpServers");
    }
}

/// `text` with the rules import line appended (unchanged when it already has one), in the file's
/// own line ending.
pub fn with_rules_import(text: &str) -> String {
    if text.lines().any(|line| line.trim() == RULES_IMPORT_LINE) {
        return text.to_owned();
    }
    let newline = if text.contains("\r\n") { "\r\n" } else { "\n" };
    let mut out = text.to_owned();
    if !out.is_empty() {
        if !out.ends_with('\n') {
            out.push_str(newline);
        }
        out.push_str(newline);
    }
    out.push_str(RULES_IMPORT_LINE);
    out.push_str(newline);
    out
}

/// `text` without the rules import line (and the blank line written before it), every other
/// line kept byte for byte; `None` when nothing else is left.
pub fn without_rules_import(text: &str) -> Option<String> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let Some(at) = lines
        .iter()
        .position(|line| line.trim() == RULES_IMPORT_LINE)
    else {
        return Some(text.to_owned());
    };
    let mut kept: Vec<&str> = Vec::with_capacity(lines.len());
    kept.extend_from_slice(&lines[..at]);
    if at + 1 == lines.len() && kept.last().is_some_and(|line| line.trim().is_empty()) {
        kept.pop();
    }
    kept.extend_from_slice(&lines[at + 1..]);
    if kept.iter().all(|line| line.trim().is_empty()) {
        return None;
    }
    Some(kept.concat())
}

/// Adds `[mcp_servers.zuno]` and turns Codex hooks on unless the user set the switch. Returns
/// the switch's key when the user turned hooks off.
fn add_codex_config(document: &mut toml_edit::DocumentMut, commands: &Commands) -> Option<String> {
    use toml_edit::{Array, Item, Table, value};
    let servers = document
        .entry("mcp_servers")
        .or_insert_with(|| {
            let mut table = Table::new();
            table.set_implicit(true);
            Item::Table(table)
        })
        .as_table_mut();
    if let Some(servers) = servers {
        let server = servers
            .entry("zuno")
            .or_insert_with(|| Item::Table(Table::new()));
        if let Some(server) = server.as_table_mut() {
            server.insert("command", value(commands.exe.as_str()));
            let args: Array = commands.mcp_args().iter().map(String::as_str).collect();
            server.insert("args", value(args));
        }
    }
    let features = document
        .entry("features")
        .or_insert_with(|| Item::Table(Table::new()))
        .as_table_mut()?;
    for key in ["hooks", "codex_hooks"] {
        if let Some(setting) = features.get(key).and_then(Item::as_bool) {
            return (!setting).then(|| key.to_owned());
        }
    }
    features.insert("codex_hooks", value(true));
    if let Some(mut key) = features.key_mut("codex_hooks") {
        key.leaf_decor_mut()
            .set_prefix(format!("{ADDED_BY_ZUNO}\n"));
    }
    None
}

/// Removes `[mcp_servers.zuno]` and the feature switch the installer added, with the tables
/// they leave empty.
fn remove_codex_config(document: &mut toml_edit::DocumentMut) {
    if let Some(servers) = document
        .get_mut("mcp_servers")
        .and_then(toml_edit::Item::as_table_like_mut)
    {
        servers.remove("zuno");
        if servers.is_empty() {
            document.remove("mcp_servers");
        }
    }
    if let Some(features) = document
        .get_mut("features")
        .and_then(toml_edit::Item::as_table_mut)
    {
        let added = features.key("codex_hooks").is_some_and(|key| {
            key.leaf_decor()
                .prefix()
                .and_then(|prefix| prefix.as_str())
                .is_some_and(|prefix| prefix.contains(ADDED_BY_ZUNO))
        });
        if added {
            features.remove("codex_hooks");
        }
        if features.is_empty() {
            document.remove("features");
        }
    }
}

/// A line diff (longest common subsequence) with `-`/`+`/` ` prefixes.
pub fn diff(old: &str, new: &str) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let mut table = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            table[i][j] = if a[i] == b[j] {
                table[i + 1][j + 1] + 1
            } else {
                table[i + 1][j].max(table[i][j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut out = String::new();
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            out.push_str(&format!("  {}\n", a[i]));
            i += 1;
            j += 1;
        } else if j < b.len() && (i == a.len() || table[i][j + 1] >= table[i + 1][j]) {
            out.push_str(&format!("+ {}\n", b[j]));
            j += 1;
        } else {
            out.push_str(&format!("- {}\n", a[i]));
            i += 1;
        }
    }
    out
}

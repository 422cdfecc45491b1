//! `zuno install claude-code`: adds Zuno's hooks to Claude Code's settings and its MCP server
//! to Claude Code's MCP configuration. It shows the diff first and writes only with `--yes`;
//! running it again changes nothing (entries are recognised and updated in place).
//!
//! No token is ever written into these files (a project-scope `.mcp.json` is often committed):
//! the installed commands read the local token from Zuno's data directory when they run, and a
//! non-default data directory (`--home`/`ZUNO_HOME` at install time) is written into them so they
//! look in the same place.

use std::path::{Path, PathBuf};

use clap::ValueEnum;
use serde_json::{Map, Value, json};

use super::{CliError, GlobalArgs};

/// Hook events Zuno handles, with the timeout (seconds) written for each.
const HOOKS: [(&str, u64); 3] = [("SessionStart", 10), ("UserPromptSubmit", 10), ("Stop", 30)];

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scope {
    /// `~/.claude/settings.json` and `~/.claude.json`.
    User,
    /// `.claude/settings.json` and `.mcp.json` in the current directory.
    Project,
}

#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    #[arg(long, value_enum, default_value_t = Scope::User)]
    pub scope: Scope,
    /// The settings file to edit (overrides --scope).
    #[arg(long)]
    pub settings: Option<PathBuf>,
    /// The MCP configuration file to edit (overrides --scope).
    #[arg(long)]
    pub mcp_config: Option<PathBuf>,
    /// The server the hooks and MCP server call (written into the commands).
    #[arg(long)]
    pub server: Option<String>,
    /// Register the MCP server with `--read-only` (no `memory_update`).
    #[arg(long)]
    pub read_only: bool,
    /// Apply the changes (without it, only the diff is shown).
    #[arg(long)]
    pub yes: bool,
}

#[derive(Debug, clap::Subcommand)]
pub enum InstallCommand {
    /// Claude Code hooks (SessionStart, UserPromptSubmit, Stop) and the `zuno mcp` server.
    ClaudeCode(InstallArgs),
}

pub fn run(global: &GlobalArgs, command: InstallCommand) -> Result<(), CliError> {
    let InstallCommand::ClaudeCode(args) = command;
    let (settings_path, mcp_path) = targets(&args)?;
    let exe = std::env::current_exe()
        .map_err(|error| CliError::new(CliError::FAILURE, error.to_string()))?;
    let exe = exe.to_string_lossy().into_owned();
    let home = match &global.home {
        Some(home) => Some(
            std::path::absolute(home)
                .map_err(|error| CliError::new(CliError::BAD_INPUT, error.to_string()))?
                .to_string_lossy()
                .into_owned(),
        ),
        None => None,
    };
    let home = home.as_deref();
    let mut changed = false;
    for (path, update) in [
        (
            &settings_path,
            Box::new(|v: &mut Value| add_hooks(v, &exe, home, args.server.as_deref()))
                as Box<dyn Fn(&mut Value)>,
        ),
        (
            &mcp_path,
            Box::new(|v: &mut Value| {
                add_mcp(v, &exe, home, args.server.as_deref(), args.read_only)
            }),
        ),
    ] {
        let before_text = match std::fs::read_to_string(path) {
            Ok(text) => Some(text),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => {
                return Err(CliError::new(
                    CliError::FAILURE,
                    format!("cannot read `{}`: {error}", path.display()),
                ));
            }
        };
        let before: Value = match &before_text {
            Some(text) if !text.trim().is_empty() => {
                serde_json::from_str(text).map_err(|error| {
                    CliError::new(
                        CliError::BAD_INPUT,
                        format!(
                            "`{}` is not valid JSON ({error}); fix it first",
                            path.display()
                        ),
                    )
                })?
            }
            _ => json!({}),
        };
        if !before.is_object() {
            return Err(CliError::new(
                CliError::BAD_INPUT,
                format!("`{}` does not hold a JSON object", path.display()),
            ));
        }
        let mut after = before.clone();
        update(&mut after);
        if after == before && before_text.is_some() {
            println!("{}: already up to date", path.display());
            continue;
        }
        changed = true;
        let old = before_text
            .as_deref()
            .map(|_| pretty(&before))
            .unwrap_or_default();
        let new = pretty(&after);
        println!("--- {}", path.display());
        println!("+++ {}", path.display());
        print!("{}", diff(&old, &new));
        if args.yes {
            write(path, &new)?;
            println!("wrote {}", path.display());
        }
    }
    if changed && !args.yes {
        println!("nothing written: run again with --yes to apply");
    }
    let server = args
        .server
        .as_deref()
        .unwrap_or(super::hook::DEFAULT_SERVER);
    if super::client::is_loopback_url(server) {
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

fn targets(args: &InstallArgs) -> Result<(PathBuf, PathBuf), CliError> {
    let (settings, mcp) = match args.scope {
        Scope::User => {
            let home = directories::BaseDirs::new()
                .map(|dirs| dirs.home_dir().to_path_buf())
                .ok_or_else(|| CliError::new(CliError::FAILURE, "no home directory"))?;
            (
                home.join(".claude").join("settings.json"),
                home.join(".claude.json"),
            )
        }
        Scope::Project => {
            let dir = std::env::current_dir()
                .map_err(|error| CliError::new(CliError::FAILURE, error.to_string()))?;
            (
                dir.join(".claude").join("settings.json"),
                dir.join(".mcp.json"),
            )
        }
    };
    Ok((
        args.settings.clone().unwrap_or(settings),
        args.mcp_config.clone().unwrap_or(mcp),
    ))
}

fn pretty(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
}

fn write(path: &Path, text: &str) -> Result<(), CliError> {
    let fail = |error: std::io::Error| {
        CliError::new(
            CliError::FAILURE,
            format!("cannot write `{}`: {error}", path.display()),
        )
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(fail)?;
    }
    let temporary = path.with_extension("zuno-tmp");
    std::fs::write(&temporary, text).map_err(fail)?;
    std::fs::rename(&temporary, path).map_err(fail)
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

/// Adds (or updates) one command hook per event; an existing Zuno hook for the event is
/// recognised by its `hook claude-code <Event>` command and replaced in place.
pub fn add_hooks(settings: &mut Value, exe: &str, home: Option<&str>, server: Option<&str>) {
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
    for (event, timeout) in HOOKS {
        let mut command = shell_quote(exe);
        if let Some(home) = home {
            command.push_str(&format!(" --home {}", shell_quote(home)));
        }
        command.push_str(&format!(" hook claude-code {event}"));
        if let Some(server) = server {
            command.push_str(&format!(" --server {}", shell_quote(server)));
        }
        let handler = json!({ "type": "command", "command": command, "timeout": timeout });
        let marker = format!(" hook claude-code {event}");
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
            groups.push(json!({ "hooks": [handler] }));
        }
    }
}

/// Adds (or updates) the `zuno` stdio MCP server.
pub fn add_mcp(
    config: &mut Value,
    exe: &str,
    home: Option<&str>,
    server: Option<&str>,
    read_only: bool,
) {
    let Some(root) = config.as_object_mut() else {
        return;
    };
    let servers = root
        .entry("mcpServers")
        .or_insert_with(|| Value::Object(Map::new()));
    if !servers.is_object() {
        *servers = Value::Object(Map::new());
    }
    let mut args = Vec::new();
    if let Some(home) = home {
        args.push(Value::from("--home"));
        args.push(Value::from(home));
    }
    args.push(Value::from("mcp"));
    if let Some(server) = server {
        args.push(Value::from("--server"));
        args.push(Value::from(server));
    }
    if read_only {
        args.push(Value::from("--read-only"));
    }
    if let Some(servers) = servers.as_object_mut() {
        servers.insert(
            String::from("zuno"),
            json!({ "type": "stdio", "command": exe, "args": args }),
        );
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

//! A tool call as an agent's `PreToolUse` hook reports it (Claude Code and Codex), read into
//! what guards match: a shell command line, or the paths an edit touches.

use std::path::{Component, Path};

use serde_json::Value;

use super::matcher::ToolCall;

/// The call `tool_name` with `tool_input` makes, or `None` for a tool guards do not check
/// (reads, searches, web fetches). Edited paths inside `worktree` become relative to it.
pub fn tool_call(tool_name: &str, tool_input: &Value, worktree: Option<&Path>) -> Option<ToolCall> {
    // Codex records a function call's arguments as a JSON string.
    let parsed;
    let tool_input = match tool_input {
        Value::String(text) if text.trim_start().starts_with('{') => {
            parsed = serde_json::from_str::<Value>(text).unwrap_or_else(|_| tool_input.clone());
            &parsed
        }
        _ => tool_input,
    };
    let field = |name: &str| tool_input.get(name).and_then(Value::as_str);
    // Claude Code names tools `Bash`, `Edit`…; Codex `shell`, `apply_patch`; other hosts and
    // imported histories spell them in lower case.
    match tool_name.to_ascii_lowercase().as_str() {
        "bash" | "shell" | "shell_command" | "local_shell" | "exec_command" | "container.exec"
        | "run_command" | "terminal" => shell_line(
            tool_input
                .get("command")
                .or_else(|| tool_input.get("cmd"))?,
        )
        .map(ToolCall::Shell),
        "edit" | "write" | "multiedit" | "notebookedit" | "create" | "str_replace_editor" => {
            let path = field("file_path")
                .or_else(|| field("notebook_path"))
                .or_else(|| field("path"))?;
            Some(ToolCall::Edit(vec![relative(path, worktree)]))
        }
        "apply_patch" => {
            let patch = field("command")
                .or_else(|| field("input"))
                .or_else(|| field("patch"))
                .or_else(|| tool_input.as_str())?;
            let paths: Vec<String> = patched_paths(patch)
                .into_iter()
                .map(|path| relative(&path, worktree))
                .collect();
            (!paths.is_empty()).then_some(ToolCall::Edit(paths))
        }
        _ => None,
    }
}

/// A command as a line: a string as it is; an argv array (Codex's shell tool) joined with each
/// word quoted, so `["bash", "-lc", "npm i"]` reads as `bash -lc 'npm i'`.
fn shell_line(command: &Value) -> Option<String> {
    match command {
        Value::String(line) => Some(line.clone()),
        Value::Array(words) => {
            let words: Vec<String> = words
                .iter()
                .filter_map(Value::as_str)
                .map(|word| format!("'{}'", word.replace('\'', r"'\''")))
                .collect();
            (!words.is_empty()).then(|| words.join(" "))
        }
        _ => None,
    }
}

/// The files an `apply_patch` envelope adds, updates, deletes or moves to.
pub fn patched_paths(patch: &str) -> Vec<String> {
    const HEADERS: [&str; 4] = [
        "*** Add File: ",
        "*** Update File: ",
        "*** Delete File: ",
        "*** Move to: ",
    ];
    patch
        .lines()
        .filter_map(|line| HEADERS.iter().find_map(|h| line.strip_prefix(h)))
        .map(|path| path.trim().to_owned())
        .filter(|path| !path.is_empty())
        .collect()
}

/// `path` relative to `worktree` when it lies inside it (lexically, `..` resolved); otherwise
/// absolute (a relative glob never matches it).
fn relative(path: &str, worktree: Option<&Path>) -> String {
    let normal = normalise(Path::new(path));
    let inside = worktree
        .map(normalise)
        .and_then(|root| normal.strip_prefix(&root).ok().map(Path::to_path_buf));
    let Some(inside) = inside
        .filter(|_| normal.is_absolute())
        .or_else(|| (!normal.is_absolute()).then(|| normal.clone()))
    else {
        return normal.to_string_lossy().replace('\\', "/");
    };
    inside
        .components()
        .filter_map(|part| match part {
            Component::Normal(name) => Some(name.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("/")
}

fn normalise(path: &Path) -> std::path::PathBuf {
    let mut out = std::path::PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hook_inputs_read_as_tool_calls() {
        let root = Path::new("/home/me/web");
        assert_eq!(
            tool_call(
                "Bash",
                &json!({"command": "npm i", "description": "x"}),
                Some(root)
            ),
            Some(ToolCall::Shell("npm i".into()))
        );
        assert_eq!(
            tool_call("Bash", &json!({"command": ["bash", "-lc", "npm i"]}), None),
            Some(ToolCall::Shell("'bash' '-lc' 'npm i'".into()))
        );
        assert_eq!(
            tool_call(
                "Edit",
                &json!({"file_path": "/home/me/web/vendor/../vendor/a.js"}),
                Some(root)
            ),
            Some(ToolCall::Edit(vec!["vendor/a.js".into()]))
        );
        assert_eq!(
            tool_call("Write", &json!({"file_path": "/etc/hosts"}), Some(root)),
            Some(ToolCall::Edit(vec!["/etc/hosts".into()]))
        );
        let patch = "*** Begin Patch\n*** Update File: vendor/a.js\n@@\n-a\n+b\n*** Add File: src/b.ts\n+x\n*** End Patch";
        assert_eq!(
            tool_call("apply_patch", &json!({"command": patch}), Some(root)),
            Some(ToolCall::Edit(vec![
                "vendor/a.js".into(),
                "src/b.ts".into()
            ]))
        );
        assert_eq!(
            tool_call("Read", &json!({"file_path": "/home/me/web/a"}), Some(root)),
            None
        );
    }
}

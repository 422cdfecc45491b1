//! What a guard matches: a program (with the arguments that must follow it) in any simple
//! command a shell call would run, or a path an edit or write touches.

use serde::{Deserialize, Serialize};

use super::shell::{self, SimpleCommand};

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Matcher {
    /// A program, and the arguments that must all follow it (in order, not necessarily next to
    /// each other): `npm`; `git push --force`. `npm` also covers `npx`, `pnpm` covers `pnpx`,
    /// `bun` covers `bunx` (the same tool's runner).
    Command {
        program: String,
        #[serde(default)]
        args: Vec<String>,
    },
    /// A path glob, relative to the worktree, that edits and writes may not touch: `vendor/`
    /// (a directory and everything under it), `*.lock`, `src/generated/**`.
    Path { glob: String },
}

impl Matcher {
    /// A canonical text of the matcher: two guards with the same key guard the same thing.
    pub fn key(&self) -> String {
        match self {
            Matcher::Command { program, args } if args.is_empty() => format!("cmd:{program}"),
            Matcher::Command { program, args } => format!("cmd:{program} {}", args.join(" ")),
            Matcher::Path { glob } => format!("path:{glob}"),
        }
    }

    /// How a person reads it: `npm …`, `edits of vendor/`.
    pub fn describe(&self) -> String {
        match self {
            Matcher::Command { program, args } if args.is_empty() => format!("`{program}`"),
            Matcher::Command { program, args } => format!("`{program} {}`", args.join(" ")),
            Matcher::Path { glob } => format!("edits of `{glob}`"),
        }
    }
}

/// A tool call as guards see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolCall {
    /// A shell command line.
    Shell(String),
    /// Paths an edit, write or patch touches, relative to the worktree when they lie in it.
    Edit(Vec<String>),
}

/// The programs a guard on `program` covers.
fn covered(program: &str) -> &[&str] {
    match program {
        "npm" => &["npm", "npx"],
        "pnpm" => &["pnpm", "pnpx"],
        "bun" => &["bun", "bunx"],
        "pip" => &["pip", "pip3"],
        _ => &[],
    }
}

/// The program `command` runs through a runner, and its arguments: `python -m pip install x`
/// runs `pip install x`, `uv run black .` runs `black .` (also `poetry`, `pipenv`, `pdm`, `rye`,
/// `hatch`, `conda`).
fn effective(command: &SimpleCommand) -> (&str, &[String]) {
    let through = |flag: &str| command.args.first().is_some_and(|a| a == flag);
    let runner = command.program.starts_with("python") && through("-m")
        || matches!(
            command.program.as_str(),
            "uv" | "poetry" | "pipenv" | "pdm" | "rye" | "hatch" | "conda"
        ) && through("run");
    if runner && let Some(inner) = command.args.get(1) {
        return (inner.as_str(), &command.args[2..]);
    }
    (command.program.as_str(), &command.args)
}

fn command_matches(program: &str, args: &[String], command: &SimpleCommand) -> bool {
    let runs = |name: &str| name == program || covered(program).contains(&name);
    let (module, module_args) = effective(command);
    let ran_args = if runs(&command.program) {
        command.args.as_slice()
    } else if runs(module) {
        module_args
    } else {
        return false;
    };
    let mut rest = ran_args.iter();
    args.iter()
        .all(|wanted| rest.any(|arg| arg == wanted || same_subcommand(program, wanted, arg)))
}

/// Spellings of one meaning (`npm i` is `npm install`, `git commit -n` is `--no-verify`).
fn same_subcommand(program: &str, wanted: &str, arg: &str) -> bool {
    const INSTALL: &[&str] = &["install", "i", "add", "in", "isntall"];
    match program {
        "npm" | "pnpm" | "yarn" | "bun" => INSTALL.contains(&wanted) && INSTALL.contains(&arg),
        "git" => matches!((wanted, arg), ("--no-verify", "-n") | ("--force", "-f")),
        _ => false,
    }
}

/// Whether `path` (relative, `/`-separated) matches `glob`: a trailing `/` means the directory
/// and everything under it, `**` any number of directories, `*` any run within one name. A glob
/// without `/` matches a name at any depth (`*.lock`, `.env`).
pub fn glob_matches(glob: &str, path: &str) -> bool {
    let path = path.trim_start_matches("./");
    let glob = glob.trim_start_matches("./");
    if let Some(dir) = glob.strip_suffix('/') {
        return glob_matches(&format!("{dir}/**"), path) || glob_matches(dir, path);
    }
    if !glob.contains('/') {
        return path.split('/').any(|name| wildcard(glob, name));
    }
    segments(
        &glob.split('/').collect::<Vec<_>>(),
        &path.split('/').collect::<Vec<_>>(),
    )
}

fn segments(glob: &[&str], path: &[&str]) -> bool {
    match glob.split_first() {
        None => path.is_empty(),
        Some((&"**", rest)) => (0..=path.len()).any(|skip| segments(rest, &path[skip..])),
        Some((first, rest)) => path
            .split_first()
            .is_some_and(|(name, tail)| wildcard(first, name) && segments(rest, tail)),
    }
}

fn wildcard(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            name.starts_with(head)
                && (head.len()..=name.len())
                    .filter(|&at| name.is_char_boundary(at))
                    .any(|at| wildcard(tail, &name[at..]))
        }
    }
}

/// A tool call read once for many matchers: a shell line parsed into its simple commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PreparedCall {
    Shell(Vec<SimpleCommand>),
    Edit(Vec<String>),
}

impl ToolCall {
    pub fn prepare(&self) -> PreparedCall {
        match self {
            ToolCall::Shell(line) => PreparedCall::Shell(shell::simple_commands(line)),
            ToolCall::Edit(paths) => PreparedCall::Edit(paths.clone()),
        }
    }
}

impl Matcher {
    /// The first part of `call` this matcher forbids, as text: the simple command or the path.
    pub fn matches(&self, call: &ToolCall) -> Option<String> {
        self.matches_prepared(&call.prepare())
    }

    /// [`Matcher::matches`] on a call already read.
    pub fn matches_prepared(&self, call: &PreparedCall) -> Option<String> {
        match (self, call) {
            (Matcher::Command { program, args }, PreparedCall::Shell(commands)) => commands
                .iter()
                .find(|command| command_matches(program, args, command))
                .map(|command| {
                    std::iter::once(command.program.as_str())
                        .chain(command.args.iter().map(String::as_str))
                        .collect::<Vec<_>>()
                        .join(" ")
                }),
            (Matcher::Path { glob }, PreparedCall::Edit(paths)) => {
                paths.iter().find(|path| glob_matches(glob, path)).cloned()
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(program: &str, args: &[&str]) -> Matcher {
        Matcher::Command {
            program: program.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
        }
    }

    #[test]
    fn a_command_guard_finds_its_program_in_any_simple_command() {
        let npm = command("npm", &[]);
        for line in [
            "npm i",
            "npx jest",
            "cd web && npm ci",
            "env CI=1 npm test",
            "sudo npm i -g x",
            "bash -lc 'npm run build'",
            "cmd /c npm.cmd install",
        ] {
            assert!(
                npm.matches(&ToolCall::Shell(line.into())).is_some(),
                "{line}"
            );
        }
        for line in [
            "pnpm install",
            "echo npm",
            "git commit -m 'npm'",
            "cat npm.log",
            "yarn add npm-run-all",
        ] {
            assert_eq!(npm.matches(&ToolCall::Shell(line.into())), None, "{line}");
        }
        let pip = command("pip", &[]);
        for line in [
            "pip install x",
            "pip3 install -r requirements.txt",
            "python3 -m pip install x",
        ] {
            assert!(
                pip.matches(&ToolCall::Shell(line.into())).is_some(),
                "{line}"
            );
        }
        assert_eq!(
            pip.matches(&ToolCall::Shell("uv pip install x".into())),
            None
        );
        let no_verify = command("git", &["commit", "--no-verify"]);
        assert!(
            no_verify
                .matches(&ToolCall::Shell("git commit -n -m wip".into()))
                .is_some()
        );
        assert_eq!(
            no_verify.matches(&ToolCall::Shell("git commit -m wip".into())),
            None
        );
        let python = command("python", &[]);
        assert!(
            python
                .matches(&ToolCall::Shell("python app.py".into()))
                .is_some()
        );
        assert_eq!(
            python.matches(&ToolCall::Shell("python3 app.py".into())),
            None
        );
        let force = command("git", &["push", "--force"]);
        assert!(
            force
                .matches(&ToolCall::Shell("git push origin main --force".into()))
                .is_some()
        );
        assert_eq!(
            force.matches(&ToolCall::Shell("git push origin main".into())),
            None
        );
        let install = command("npm", &["install"]);
        assert!(
            install
                .matches(&ToolCall::Shell("npm i lodash".into()))
                .is_some()
        );
        assert_eq!(install.matches(&ToolCall::Shell("npm test".into())), None);
    }

    #[test]
    fn a_path_guard_matches_edits_by_glob() {
        let vendor = Matcher::Path {
            glob: "vendor/".into(),
        };
        let edit = |p: &str| ToolCall::Edit(vec![p.into()]);
        assert!(vendor.matches(&edit("vendor/lib/a.js")).is_some());
        assert!(vendor.matches(&edit("vendor")).is_some());
        assert_eq!(vendor.matches(&edit("src/vendor.js")), None);
        assert_eq!(
            vendor.matches(&ToolCall::Shell("rm -rf vendor/".into())),
            None
        );
        assert!(glob_matches("*.lock", "web/yarn.lock"));
        assert!(glob_matches("src/generated/**", "src/generated/a/b.ts"));
        assert!(!glob_matches("src/generated/**", "src/gen/a.ts"));
        assert!(glob_matches("migrations/*.sql", "migrations/0001_init.sql"));
        assert!(!glob_matches(
            "migrations/*.sql",
            "migrations/old/0001_init.sql"
        ));
    }
}

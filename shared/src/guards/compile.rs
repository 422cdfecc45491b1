//! The rules compiler: from a lesson's text to the guards it implies. Only plain, checkable
//! forms compile — a forbidden program or command ("use pnpm, not npm", "never run
//! `git push --force`", "不要用 npm") or a path edits may not touch ("don't edit vendor/",
//! "不要修改 vendor/") — and only when the forbidden thing is code-shaped: a backticked span, a
//! program this module knows, or a path. "Never run migrations on prod" names no command and
//! compiles to nothing. A soft preference ("prefer rg over grep") is no rule to enforce.

use std::sync::LazyLock;

use regex::Regex;

use super::matcher::Matcher;
use super::shell::program_name;

/// A guard a lesson implies: what it forbids and, when the lesson names one, what to do instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledGuard {
    pub matcher: Matcher,
    pub alternative: Option<String>,
}

/// Programs a lesson may forbid by bare name (a backticked command needs no entry here).
const KNOWN_PROGRAMS: &[&str] = &[
    "npm",
    "npx",
    "yarn",
    "pnpm",
    "pnpx",
    "bun",
    "bunx",
    "pip",
    "pip3",
    "pipx",
    "python",
    "python2",
    "python3",
    "poetry",
    "uv",
    "conda",
    "node",
    "deno",
    "tsc",
    "cargo",
    "rustc",
    "go",
    "make",
    "cmake",
    "gradle",
    "mvn",
    "docker",
    "docker-compose",
    "podman",
    "kubectl",
    "helm",
    "terraform",
    "git",
    "curl",
    "wget",
    "brew",
    "apt",
    "apt-get",
    "yum",
    "dnf",
    "jest",
    "vitest",
    "mocha",
    "pytest",
    "eslint",
    "prettier",
    "black",
    "ruff",
    "mypy",
    "tox",
    "java",
    "javac",
    "dotnet",
    "gcc",
    "clang",
    "composer",
    "ruby",
    "gem",
    "bundle",
    "rake",
    "psql",
    "mysql",
    "sqlite3",
    "alembic",
    "sudo",
    "rm",
    "nvm",
    "virtualenv",
    "pipenv",
    "webpack",
    "vite",
    "grunt",
    "gulp",
    "lerna",
    "nx",
    "turbo",
];

const PACKAGE_MANAGERS: &[&str] = &["npm", "yarn", "pnpm", "bun"];

/// A code-shaped phrase: a backticked span or a run of ASCII word characters, dots, slashes
/// and dashes (ASCII only, so it ends where Chinese text begins).
const TOKEN: &str = r"`[^`\n]{1,80}`|[A-Za-z0-9_][A-Za-z0-9_./+-]*";

static USE_NOT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"(?i)\b(?:use|using|run|with|install (?:\w+ )?with)\s+(?P<x>{TOKEN})\s*(?:\([^)]{{0,60}}\))?\s*[,;(—–-]?\s*(?:and\s+|but\s+)?(?:not|never|instead of|rather than)\s+(?:use\s+|run\s+|with\s+)?(?P<y>{TOKEN})"
    ))
    .expect("a valid pattern")
});
static INSTEAD_OF: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"(?i)(?P<x>{TOKEN})\s+instead of\s+(?P<y>{TOKEN})"
    ))
    .expect("a valid pattern")
});
static NEVER_RUN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"(?i)\b(?:never|don't|do not|dont|must not|mustn't|should not|shouldn't|no longer|stop)\s+(?:use|using|run|running|call|calling|invoke|execute)\s+(?P<y>{TOKEN})|\bavoid\s+(?:using\s+|running\s+)?(?P<y2>{TOKEN})"
    ))
    .expect("a valid pattern")
});
static NOT_ALLOWED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"(?i)(?P<y>{TOKEN})\s+(?:is|are)\s+(?:not allowed|forbidden|banned|not permitted|prohibited)"
    ))
    .expect("a valid pattern")
});
static NEVER_EDIT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"(?i)\b(?:never|don't|do not|dont|must not|mustn't|should not|shouldn't|avoid)\s+(?:edit|editing|modify|modifying|touch|touching|change|changing|write to|writing to|hand-edit|hand edit)\s+(?:any\s+)?(?:files?\s+(?:in|under)\s+|anything\s+(?:in|under)\s+|the\s+)?(?P<p>{TOKEN})"
    ))
    .expect("a valid pattern")
});
static NOT_ON_PATH: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"(?i)(?P<y>{TOKEN})\s+(?:is|are)\s+not\s+(?:on|in)\s+(?:the\s+)?PATH|(?:there is|there's)\s+no\s+(?P<s>`[^`]+`|[a-z0-9._-]+\s+[a-z0-9:._-]+)\s+script|(?:there is|there's)\s+no\s+(?P<mk>Makefile|justfile|package\.json)"
    ))
    .expect("a valid pattern")
});
static CREATE_INSTEAD: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"(?i)instead of creating\s+(?:a\s+|an\s+|the\s+)?(?:new\s+)?(?P<p>{TOKEN})|\b(?:never|don't|do not)\s+create\s+(?:a\s+|an\s+|the\s+)?(?:new\s+)?(?P<p2>{TOKEN})"
    ))
    .expect("a valid pattern")
});
static NO_FLAG: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)(?:\bno|\bnever use|\bnever pass|\bdon't use|\bdo not use|\bnever)\s+`?(?P<flag>--[a-z][a-z-]+)`?").expect("a valid pattern")
});
static PACKAGE_MANAGER_OF: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\buse\s+`?(?P<x>npm|yarn|pnpm|bun)`?\s+as\s+(?:this|the)\s+(?:project's\s+|repository's\s+|repo's\s+)?package manager").expect("a valid pattern")
});
static USE_INSTEAD: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"(?i)\buse\s+(?P<x>{TOKEN})\s+instead\b\s*(?:$|[.;,!])"
    ))
    .expect("a valid pattern")
});
static ZH_USE_NOT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"(?:用|使用|改用|请用)\s*(?P<x>{TOKEN})\s*[,，、]?\s*(?:来\S{{0,6}}?)?[,，]?\s*(?:不要|别|不用|而不是|而非|不是|代替|替代|取代)\s*(?:再)?\s*(?:用|使用)?\s*(?P<y>{TOKEN})"
    ))
    .expect("a valid pattern")
});
static ZH_NEVER_RUN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"(?:不要|别|禁止|不准|不许|不能|切勿|勿)\s*(?:再)?\s*(?:用|使用|运行|执行|调用)?\s*(?P<y>{TOKEN})"
    ))
    .expect("a valid pattern")
});
static ZH_NEVER_EDIT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"(?:不要|别|禁止|不准|不许|不能|切勿|勿)\s*(?:再)?\s*(?:手动修改|手工修改|手改|修改|编辑|改动|动|改)\s*(?P<p>{TOKEN})"
    ))
    .expect("a valid pattern")
});

/// The guards `lesson` implies, without duplicates.
pub fn compile(lesson: &str) -> Vec<CompiledGuard> {
    let mut found: Vec<CompiledGuard> = Vec::new();
    command_forms(lesson, &mut found);
    other_forms(lesson, &mut found);
    if found.is_empty()
        && let Some(captures) = USE_INSTEAD.captures(lesson)
    {
        // "Use yarn instead": of the package manager agents reach for by default.
        let x = unquote(&captures["x"]);
        if PACKAGE_MANAGERS.contains(&x.as_str()) && x != "npm" {
            found.extend(command_guard("npm", &[x]));
        }
    }
    found
}

fn add(found: &mut Vec<CompiledGuard>, guard: Option<CompiledGuard>) {
    if let Some(guard) = guard
        && !found.iter().any(|g| g.matcher == guard.matcher)
    {
        found.push(guard);
    }
}

/// "Use X, not Y", "X instead of Y", "never run Y", "Y is not on PATH" and their Chinese forms.
fn command_forms(lesson: &str, found: &mut Vec<CompiledGuard>) {
    for pattern in [&*USE_NOT, &*ZH_USE_NOT] {
        for captures in pattern.captures_iter(lesson) {
            add(
                found,
                command_guard(&captures["y"], &[unquote(&captures["x"])]),
            );
        }
    }
    for captures in INSTEAD_OF.captures_iter(lesson) {
        let mut alternatives = alternatives_in(lesson);
        alternatives.push(unquote(&captures["x"]));
        add(found, command_guard(&captures["y"], &alternatives));
    }
    for captures in NEVER_RUN.captures_iter(lesson) {
        let y = captures.name("y").or_else(|| captures.name("y2"));
        if let Some(y) = y {
            add(found, command_guard(y.as_str(), &alternatives_in(lesson)));
        }
    }
    for captures in NOT_ON_PATH.captures_iter(lesson) {
        if let Some(y) = captures.name("y") {
            add(found, command_guard(y.as_str(), &alternatives_in(lesson)));
        } else if let Some(script) = captures.name("s") {
            let quoted = format!("`{}`", unquote(script.as_str()));
            add(found, command_guard(&quoted, &alternatives_in(lesson)));
        } else if let Some(file) = captures.name("mk") {
            let program = match file.as_str().to_ascii_lowercase().as_str() {
                "makefile" => "make",
                "justfile" => "just",
                _ => "npm",
            };
            add(
                found,
                command_guard(&format!("`{program}`"), &alternatives_in(lesson)),
            );
        }
    }
}

/// Files not to create or edit, a project's package manager, forbidden flags and commands.
fn other_forms(lesson: &str, found: &mut Vec<CompiledGuard>) {
    for captures in CREATE_INSTEAD.captures_iter(lesson) {
        if let Some(p) = captures.name("p").or_else(|| captures.name("p2")) {
            add(found, path_guard(p.as_str()));
        }
    }
    if let Some(captures) = PACKAGE_MANAGER_OF.captures(lesson) {
        let x = captures["x"].to_ascii_lowercase();
        for other in ["npm", "yarn", "pnpm"].into_iter().filter(|pm| *pm != x) {
            add(found, command_guard(other, std::slice::from_ref(&x)));
        }
    }
    for captures in NO_FLAG.captures_iter(lesson) {
        add(found, flag_guard(lesson, &captures["flag"]));
    }
    for captures in NOT_ALLOWED.captures_iter(lesson) {
        add(
            found,
            command_guard(&captures["y"], &alternatives_in(lesson)),
        );
    }
    for captures in ZH_NEVER_RUN.captures_iter(lesson) {
        let y = captures.name("y").expect("the pattern captures y");
        let forbidden = with_following_arguments(lesson, y.as_str(), y.end());
        add(found, command_guard(&forbidden, &alternatives_in(lesson)));
    }
    for pattern in [&*NEVER_EDIT, &*ZH_NEVER_EDIT] {
        for captures in pattern.captures_iter(lesson) {
            add(found, path_guard(&captures["p"]));
        }
    }
}

fn unquote(token: &str) -> String {
    let text = token.trim_end_matches(['.', ',', ';', ':', ')', '!']);
    text.trim_matches('`').trim().to_owned()
}

/// The alternatives a lesson names in "use X" clauses, in order.
fn alternatives_in(lesson: &str) -> Vec<String> {
    static USE: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(&format!(
            r"(?i)(?:\buse|\bwith|用|使用|改用)\s*(?P<x>{TOKEN})"
        ))
        .expect("a valid pattern")
    });
    USE.captures_iter(lesson)
        .map(|c| unquote(&c["x"]))
        .collect()
}

/// A command guard on `forbidden` when it names a command: backticked, or a known program. The
/// alternative is the first of `alternatives` that is not the forbidden command itself.
fn command_guard(forbidden: &str, alternatives: &[String]) -> Option<CompiledGuard> {
    let backticked = forbidden.starts_with('`');
    let words: Vec<String> = unquote(forbidden)
        .split_whitespace()
        .map(|w| w.trim_end_matches(['.', ',', ';', ':', ')']).to_owned())
        .filter(|w| !w.is_empty())
        .collect();
    let program = program_name(words.first()?);
    if !backticked && !KNOWN_PROGRAMS.contains(&program.as_str()) {
        return None;
    }
    if !program
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "._+-".contains(c))
    {
        return None;
    }
    let args: Vec<String> = if backticked {
        words[1..]
            .iter()
            .take_while(|w| !w.contains(['<', '>', '$', '*', '…']))
            .cloned()
            .collect()
    } else {
        Vec::new()
    };
    let forbidden_text = words.join(" ");
    let alternative = alternatives
        .iter()
        .find(|x| {
            let first = program_name(x.split_whitespace().next().unwrap_or(""));
            **x != forbidden_text && !(args.is_empty() && first == program)
        })
        .cloned();
    Some(CompiledGuard {
        matcher: Matcher::Command { program, args },
        alternative,
    })
}

/// `y` with the ASCII words that follow it in a Chinese lesson, as one backticked command:
/// "不要 pnpm up --latest 升 minor" forbids `pnpm up --latest`, not every `pnpm`. The words stop
/// where the Chinese prose resumes (or at punctuation).
fn with_following_arguments(lesson: &str, y: &str, end: usize) -> String {
    static ARGUMENTS: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"^(?:[ \t]+(?:--?[A-Za-z][A-Za-z0-9-]*(?:=[^\s]*)?|[a-z0-9][a-z0-9:._/@-]*))+")
            .expect("a valid pattern")
    });
    if y.starts_with('`') {
        return y.to_owned();
    }
    match ARGUMENTS.find(&lesson[end..]) {
        Some(arguments) => format!("`{y}{}`", arguments.as_str().trim_end()),
        None => y.to_owned(),
    }
}

/// A guard on a forbidden flag, attached to the program the lesson names (the first known one;
/// `git commit` for a lesson about commits).
fn flag_guard(lesson: &str, flag: &str) -> Option<CompiledGuard> {
    let lower = lesson.to_ascii_lowercase();
    let named = lower
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '.'))
        .find(|word| KNOWN_PROGRAMS.contains(word) && *word != "sudo");
    let (program, mut args) = match named {
        Some(program) => (program.to_owned(), Vec::new()),
        None if lower.contains("commit") => (String::from("git"), vec![String::from("commit")]),
        None if lower.contains("push") => (String::from("git"), vec![String::from("push")]),
        None => return None,
    };
    args.push(flag.to_owned());
    Some(CompiledGuard {
        matcher: Matcher::Command { program, args },
        alternative: None,
    })
}

/// A path guard on `forbidden` when it is path-shaped: it has a `/` or a file extension, and
/// does not climb out of the worktree.
fn path_guard(forbidden: &str) -> Option<CompiledGuard> {
    let path = unquote(forbidden);
    let path = path.trim_end_matches(['.', ',', ';', ':', ')']);
    let shaped = path.contains('/')
        || path.rsplit_once('.').is_some_and(|(stem, ext)| {
            !stem.is_empty()
                && (1..=5).contains(&ext.len())
                && ext.chars().all(|c| c.is_ascii_alphanumeric())
        });
    if !shaped
        || path.starts_with('/')
        || path.split('/').any(|part| part == "..")
        || path.contains("://")
    {
        return None;
    }
    Some(CompiledGuard {
        matcher: Matcher::Path {
            glob: path.to_owned(),
        },
        alternative: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(lesson: &str) -> Vec<(String, Option<String>)> {
        compile(lesson)
            .into_iter()
            .map(|g| (g.matcher.key(), g.alternative))
            .collect()
    }

    fn one(key: &str, alternative: Option<&str>) -> Vec<(String, Option<String>)> {
        vec![(key.to_owned(), alternative.map(str::to_owned))]
    }

    #[test]
    fn plain_english_lessons_compile_to_guards() {
        assert_eq!(keys("Use pnpm, not npm."), one("cmd:npm", Some("pnpm")));
        assert_eq!(
            keys("Use `pnpm`, not `npm`, in this repository."),
            one("cmd:npm", Some("pnpm"))
        );
        assert_eq!(
            keys("Install packages with pnpm, not npm"),
            one("cmd:npm", Some("pnpm"))
        );
        assert_eq!(
            keys("Run scripts with python3, not python."),
            one("cmd:python", Some("python3"))
        );
        assert_eq!(keys("Use yarn instead."), one("cmd:npm", Some("yarn")));
        assert_eq!(
            keys("Use bun instead of npm for scripts"),
            one("cmd:npm", Some("bun"))
        );
        assert_eq!(
            keys("Don't edit vendor/ — it is generated."),
            one("path:vendor/", None)
        );
        assert_eq!(
            keys("Never modify files in src/generated/"),
            one("path:src/generated/", None)
        );
        assert_eq!(
            keys("Never run `git push --force` on main."),
            one("cmd:git push --force", None)
        );
        assert_eq!(
            keys("Use `cargo nextest run`, not `cargo test`."),
            one("cmd:cargo test", Some("cargo nextest run"))
        );
        assert_eq!(
            keys("pip is not allowed here; use uv."),
            one("cmd:pip", Some("uv"))
        );
    }

    #[test]
    fn plain_chinese_lessons_compile_to_guards() {
        assert_eq!(keys("用 pnpm，不要用 npm"), one("cmd:npm", Some("pnpm")));
        assert_eq!(
            keys("使用 python3 而不是 python 运行脚本"),
            one("cmd:python", Some("python3"))
        );
        assert_eq!(
            keys("不要用 npm 安装依赖，用 pnpm"),
            one("cmd:npm", Some("pnpm"))
        );
        assert_eq!(
            keys("禁止运行 `git push --force`"),
            one("cmd:git push --force", None)
        );
        assert_eq!(
            keys("不要修改 vendor/ 目录下的文件"),
            one("path:vendor/", None)
        );
        // The words after the program are its arguments: only that upgrade is forbidden, not
        // every `pnpm`.
        assert_eq!(
            keys("升级依赖只升 patch 版本，不要 pnpm up --latest 升 minor 及以上"),
            one("cmd:pnpm up --latest", None)
        );
    }

    #[test]
    fn lessons_without_a_checkable_command_compile_to_nothing() {
        for lesson in [
            "Never run migrations on prod.",
            "Prefer rg over grep.",
            "Always answer in English.",
            "Don't use emojis in commit messages.",
            "Keep functions short; avoid deep nesting.",
            "Judge a fix of app.py by whether it prints Gemini's analysis.",
            "不要在回答里用表格",
            "Don't edit the README without asking.",
            "Never touch ../other-repo/config.json",
        ] {
            assert_eq!(
                keys(lesson),
                Vec::<(String, Option<String>)>::new(),
                "{lesson}"
            );
        }
    }
}

//! What a lesson tells the agent to do, read against what rules forbid: whether a text names a
//! forbidden command without forbidding it itself ("it only completes with `--no-verify`"
//! against "never use --no-verify"), and whether it teaches bypassing a safeguard (skipping
//! hooks, signing or certificate checks). Maintenance sends such a candidate to review instead
//! of Memory when no user statement backs it; the learning harness counts Memory entries that
//! endorse what a labelled lesson forbids as contradictions.

use super::compile::compile;
use super::matcher::Matcher;

/// Flags and settings that switch a safeguard off. A lesson learned from tool output that
/// recommends one is a workaround the user never approved, not a verified procedure.
const BYPASSES: &[&str] = &[
    "--no-verify",
    "--no-gpg-sign",
    "commit.gpgsign=false",
    "--insecure",
    "--no-check-certificate",
    "http.sslverify=false",
    "git_ssl_no_verify=1",
    "git_ssl_no_verify=true",
    "node_tls_reject_unauthorized=0",
    "strict-ssl=false",
    "--trusted-host",
    "--break-system-packages",
    "--allow-unauthenticated",
    "--dangerously-skip-permissions",
    "husky=0",
    "--skip-hooks",
];

/// The lower-cased words of `text`, split where a command line or prose would split them
/// (quotes, backticks, brackets and sentence punctuation), keeping `-`, `.`, `=`, `/`, `_`.
fn words(text: &str) -> Vec<String> {
    text.split(|c: char| {
        c.is_whitespace()
            || matches!(
                c,
                '`' | '"' | '\'' | '(' | ')' | ',' | ';' | ':' | '!' | '?'
            )
    })
    .map(|word| word.trim_end_matches('.').to_ascii_lowercase())
    .filter(|word| !word.is_empty())
    .collect()
}

/// Whether `text` itself forbids `flag` or `matcher` (it compiles to a guard on the same thing).
fn forbids(text: &str, matcher: &Matcher) -> bool {
    let forbidden_flag = |m: &Matcher| match m {
        Matcher::Command { args, .. } => args.last().filter(|a| a.starts_with('-')).cloned(),
        Matcher::Path { .. } => None,
    };
    let flag = forbidden_flag(matcher);
    compile(text).iter().any(|guard| {
        guard.matcher == *matcher || (flag.is_some() && forbidden_flag(&guard.matcher) == flag)
    })
}

/// Whether `text` names what the command `matcher` forbids — its flag, or its program with
/// every argument — and does not forbid it itself. Path guards are not judged: naming a
/// directory is no instruction to edit it.
pub fn endorses(text: &str, matcher: &Matcher) -> bool {
    let Matcher::Command { program, args } = matcher else {
        return false;
    };
    let words = words(text);
    let has = |needle: &str| words.iter().any(|w| w == needle);
    let named = match args.last() {
        Some(flag) if flag.starts_with('-') => has(flag) && mentioned_affirmatively(text, flag),
        _ => {
            has(program)
                && args.iter().all(|arg| has(arg))
                && mentioned_affirmatively(text, program)
        }
    };
    named && !forbids(text, matcher)
}

/// The first safeguard bypass `text` recommends (names without forbidding it), if any:
/// `--no-verify`, `--no-gpg-sign`, `--insecure`, a force push, …
pub fn recommended_bypass(text: &str) -> Option<String> {
    let words = words(text);
    let pushes = words.iter().any(|w| w == "push");
    let affirmed =
        |needle: &str| words.iter().any(|w| w == needle) && mentioned_affirmatively(text, needle);
    let found = BYPASSES
        .iter()
        .copied()
        .find(|bypass| affirmed(bypass))
        .or_else(|| {
            ["--force", "-f"]
                .into_iter()
                .find(|f| pushes && affirmed(f))
        })?;
    let args = match found {
        "--force" | "-f" => vec![String::from("push"), String::from("--force")],
        flag => vec![flag.to_owned()],
    };
    let matcher = Matcher::Command {
        program: String::from("git"),
        args,
    };
    (!forbids(text, &matcher)).then(|| String::from(if found == "-f" { "--force" } else { found }))
}

/// Words that, earlier in the same clause, turn a mention into a prohibition: "fix the hook
/// instead of using --no-verify", "never run migrations on prod (e.g. npm run migrate:prod)".
const NEGATIONS: &[&str] = &[
    "never",
    "don't",
    "do not",
    "not ",
    "without",
    "instead of",
    "avoid",
    "no ",
    "rather than",
    "不要",
    "别",
    "禁止",
    "不能",
    "不许",
    "勿",
    "而不是",
];

/// Whether some mention of `needle` (as a whole word) stands in a clause with no negation
/// before it.
fn mentioned_affirmatively(text: &str, needle: &str) -> bool {
    let lower = text.to_lowercase();
    let is_word = |c: char| c.is_alphanumeric() || matches!(c, '-' | '_' | '.' | '=' | '/');
    lower.match_indices(needle).any(|(at, _)| {
        let before_ok = lower[..at].chars().next_back().is_none_or(|c| !is_word(c));
        let after = &lower[at + needle.len()..];
        let after_ok = after
            .trim_start_matches('.')
            .chars()
            .next()
            .is_none_or(|c| !is_word(c));
        let clause = &lower[clause_start(&lower, at)..at];
        before_ok && after_ok && !NEGATIONS.iter().any(|n| clause.contains(n))
    })
}

/// Where the clause holding byte `at` begins: after the last `;`, `!`, `?`, line break or
/// sentence-ending `. ` before it ("e.g. " and "i.e. " end nothing).
fn clause_start(lower: &str, at: usize) -> usize {
    let head = &lower[..at];
    head.char_indices()
        .rev()
        .find(|&(index, c)| match c {
            ';' | '!' | '?' | '\n' | '。' | '；' => true,
            '.' => {
                let next_is_space = head[index + 1..].starts_with(' ');
                let abbreviation = head[..index].ends_with("e.g") || head[..index].ends_with("i.e");
                next_is_space && !abbreviation
            }
            _ => false,
        })
        .map_or(0, |(index, c)| index + c.len_utf8())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(program: &str, args: &[&str]) -> Matcher {
        Matcher::Command {
            program: program.to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
        }
    }

    #[test]
    fn a_workaround_endorses_the_flag_a_rule_forbids() {
        let rule = compile("Always run the commit hooks (no --no-verify).");
        assert_eq!(rule[0].matcher, command("git", &["commit", "--no-verify"]));
        let workaround = "git commit hangs here; it only completes with --no-gpg-sign --no-verify.";
        assert!(endorses(workaround, &rule[0].matcher));
        assert!(!endorses(
            "Never commit with --no-verify; fix the hook.",
            &rule[0].matcher
        ));
        assert!(!endorses(
            "Run the tests before committing.",
            &rule[0].matcher
        ));
    }

    #[test]
    fn a_program_is_endorsed_only_as_a_word() {
        let npm = command("npm", &[]);
        assert!(endorses("Install with npm ci in CI.", &npm));
        assert!(!endorses("Install with pnpm install.", &npm));
        assert!(!endorses("Use pnpm, not npm.", &npm));
        assert!(!endorses(
            "Never run migrations against production (e.g. npm run migrate:prod).",
            &npm
        ));
        assert!(!endorses(
            "Don't edit vendor/.",
            &Matcher::Path {
                glob: "vendor/".into()
            }
        ));
    }

    #[test]
    fn bypasses_are_found_unless_the_text_forbids_them() {
        assert_eq!(
            recommended_bypass("Commit with --no-gpg-sign when gpg hangs."),
            Some(String::from("--no-gpg-sign"))
        );
        assert_eq!(
            recommended_bypass("If the push is rejected, run git push -f."),
            Some(String::from("--force"))
        );
        assert_eq!(
            recommended_bypass("curl the mirror with `--insecure` (its certificate expired)."),
            Some(String::from("--insecure"))
        );
        assert_eq!(
            recommended_bypass("Never use --no-verify; fix the lint."),
            None
        );
        assert_eq!(
            recommended_bypass("Fix the failing hook instead of committing with --no-verify."),
            None
        );
        assert_eq!(recommended_bypass("Use git push --force-with-lease."), None);
        assert_eq!(recommended_bypass("不要用 --no-verify 跳过钩子。"), None);
    }
}

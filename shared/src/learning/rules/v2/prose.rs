//! The user's own words in a message: only they can carry an instruction. Everything else a
//! person pastes into a prompt — fenced or indented code, `> ` quotes, logs, compiler output,
//! stack traces, command lines and their output, JSON — is excluded line by line; inside the
//! remaining lines, quoted text, inline code, URLs and paths are *literal*: they may be the
//! argument of an instruction ("use `pnpm`") but never its trigger (the README says "never use
//! npm").

use std::ops::Range;
use std::sync::LazyLock;

use regex::Regex;

/// A prompt with more non-empty lines than this is a pasted document: only its first and last
/// paragraphs (at most [`EDGE_LINES`] lines each) are read as the user's words.
const DOCUMENT_LINES: usize = 12;
const EDGE_LINES: usize = 3;
/// Quoted spans longer than this are not quotes (an unmatched quote mark).
const MAX_QUOTE_BYTES: usize = 240;

/// The prose lines of a folded text and which of their bytes are literal.
#[derive(Debug, Clone)]
pub struct Prose {
    pub lines: Vec<Range<usize>>,
    literal: Vec<bool>,
}

impl Prose {
    /// Reads `folded` (a lower-cased, NFKC-folded text).
    pub fn new(folded: &str) -> Prose {
        let mut literal = vec![false; folded.len()];
        let mut lines = Vec::new();
        let mut in_fence = false;
        let mut offset = 0;
        for line in folded.split('\n') {
            let range = offset..offset + line.len();
            offset += line.len() + 1;
            let trimmed = line.trim_start();
            if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
                in_fence = !in_fence;
                continue;
            }
            if in_fence || trimmed.is_empty() {
                lines.push(None);
                continue;
            }
            let indented = line.starts_with('\t') || line.starts_with("    ");
            if indented || trimmed.starts_with('>') || looks_like_output(line) {
                lines.push(Some(Err(())));
                continue;
            }
            lines.push(Some(Ok(range)));
        }
        let lines = edges(lines);
        for range in &lines {
            mark_literals(folded, range.clone(), &mut literal);
        }
        Prose { lines, literal }
    }

    /// Whether the byte at `at` lies in quoted text, inline code, a URL or a path.
    pub fn is_literal(&self, at: usize) -> bool {
        self.literal.get(at).copied().unwrap_or(true)
    }
}

/// The user's own words of `text` (its prose lines, in the original spelling), joined by
/// newlines: what describes a situation, without the logs and documents pasted with it.
pub fn own_text(text: &str) -> String {
    let folded = super::fold::Folded::new(text);
    let prose = Prose::new(&folded.text);
    prose
        .lines
        .iter()
        .filter_map(|line| text.get(folded.original(line.clone())))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `Some(Ok(range))` a prose line, `Some(Err(()))` a non-prose line, `None` blank (or inside a
/// fence). A long prompt keeps only the prose of its first and last paragraphs.
fn edges(lines: Vec<Option<Result<Range<usize>, ()>>>) -> Vec<Range<usize>> {
    let non_empty = lines.iter().filter(|line| line.is_some()).count();
    let prose = |line: &Option<Result<Range<usize>, ()>>| match line {
        Some(Ok(range)) => Some(range.clone()),
        _ => None,
    };
    if non_empty <= DOCUMENT_LINES {
        return lines.iter().filter_map(prose).collect();
    }
    let paragraph = |iter: &mut dyn Iterator<Item = &Option<Result<Range<usize>, ()>>>| {
        let mut kept = Vec::new();
        let mut started = false;
        for line in iter {
            match line {
                None if started => break,
                None => continue,
                Some(_) => {
                    started = true;
                    if kept.len() < EDGE_LINES {
                        kept.push(prose(line));
                    }
                }
            }
        }
        kept.into_iter().flatten().collect::<Vec<_>>()
    };
    let mut first = paragraph(&mut lines.iter());
    let mut last = paragraph(&mut lines.iter().rev());
    last.reverse();
    for range in last {
        if !first.contains(&range) {
            first.push(range);
        }
    }
    first
}

/// Whether a line is pasted output rather than something the user wrote: log and diagnostic
/// prefixes, stack frames, code frames, timestamps, shell prompts, HTTP logs, JSON, long
/// unbroken tokens, or mostly symbols.
pub fn looks_like_output(line: &str) -> bool {
    static PATTERNS: LazyLock<Vec<Regex>> = LazyLock::new(|| {
        [
            // Diagnostics and log levels at the start of a line.
            r"^\s*(error|warning|warn|info|debug|trace|fatal|panic|critical|exception|traceback|caused by|failed|passed)\b\s*[:\[(!]",
            r"^\s*\[\s*(error|warn|warning|info|debug|log|hook|trace|fatal|notice)\s*\]",
            r"^\s*(npm (err!|warn)|err_[a-z_]+|error\[e\d+\]|[a-z]+(error|exception|warning):)",
            // Stack frames and code frames.
            r"^\s*at \S.*[(:]\S*\d",
            r#"^\s*file ".*", line \d+"#,
            r"^\s*>?\s*\d+\s*\|",
            r"^\s*\|",
            r"^\s*\^[\^~\s]*$",
            r"^\s*-->",
            r"\[-w[a-z0-9=-]+\]",
            r"^\s*[\w./\\-]+\.[a-z]{1,5}:\d+(:\d+)?\b",
            // Timestamps and addresses.
            r"^\s*\[?\d{4}-\d{2}-\d{2}[ t]\d{2}:\d{2}",
            r"^\s*\[?\d{1,2}:\d{2}:\d{2}",
            r"0x[0-9a-f]{6,}",
            // Shell prompts and command lines.
            r"^\s*(\$|#|>>>|%)\s+\S",
            r"^\s*ps [a-z]:\\",
            r"^\s*(\([\w.-]+\)\s*)?[a-z]:\\[^>]*>",
            r"^\s*[\w.-]+@[\w.-]+:\S*\s*[$#]",
            // Output markers.
            r"\b(exit code|exited with code|exit status) -?\d+",
            r"^\s*(wall time|output|chunk id|original token count|process exited)\s*:",
            r"\b(no such file or directory|command not found|permission denied)\b",
            // HTTP logs.
            r"\b(get|post|put|delete|patch|head) /\S* http/\d",
            r"\[?http/\d(\.\d)? \d{3}\b",
            // JSON and key-value dumps.
            r#"^\s*[{\[]\s*["{\[]"#,
            r#"^\s*"[\w.-]+"\s*:"#,
            // Long unbroken tokens (hashes, base64, minified code).
            r"\S{80,}",
        ]
        .into_iter()
        .map(|pattern| Regex::new(pattern).expect("a valid pattern"))
        .collect()
    });
    if PATTERNS.iter().any(|pattern| pattern.is_match(line)) {
        return true;
    }
    mostly_symbols(line)
}

/// A line of 16+ characters where more than a quarter are neither letters, digits, spaces nor
/// ordinary sentence punctuation.
fn mostly_symbols(line: &str) -> bool {
    let mut total = 0usize;
    let mut symbols = 0usize;
    for c in line.chars() {
        total += 1;
        let ordinary =
            c.is_alphanumeric() || c.is_whitespace() || ",.'!?-:;()\"".contains(c) || !c.is_ascii();
        if !ordinary {
            symbols += 1;
        }
    }
    total >= 16 && symbols * 4 > total
}

/// Marks quoted text, inline code, URLs and paths of `range` as literal.
fn mark_literals(text: &str, range: Range<usize>, literal: &mut [bool]) {
    let line = &text[range.clone()];
    let base = range.start;
    let mut mark = |r: Range<usize>| {
        for flag in &mut literal[base + r.start..base + r.end] {
            *flag = true;
        }
    };
    static TOKENS: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(
            r#"(?x)
              `[^`]*`                                  # inline code
            | https?://\S+ | www\.\S+                   # URLs
            | [\w.+-]+@[\w-]+\.[\w.-]+                 # e-mail addresses
            | (?:^|\s)(?:~|\.{1,2})?/[\w.~-]+(?:/[\w.~-]*)*   # absolute and relative paths
            | [a-z]:\\\S*                              # Windows paths
            | \b[\w.-]+(?:/[\w.-]+)+                   # a/b/c paths
            "#,
        )
        .expect("a valid pattern")
    });
    for found in TOKENS.find_iter(line) {
        mark(found.range());
    }
    for quoted in quotes(line) {
        mark(quoted);
    }
}

/// Byte ranges of `"…"` and `'…'` quotations in `line` (quote marks included). A `'` opens a
/// quotation only after the start, whitespace or an opening bracket, and closes one only before
/// the end, whitespace or punctuation, so `don't` and `it's` are words, not quotes.
fn quotes(line: &str) -> Vec<Range<usize>> {
    let mut found = Vec::new();
    let chars: Vec<(usize, char)> = line.char_indices().collect();
    let mut i = 0;
    while i < chars.len() {
        let (at, c) = chars[i];
        let opens = match c {
            '"' => true,
            '\'' => i == 0 || chars[i - 1].1.is_whitespace() || "([{:".contains(chars[i - 1].1),
            _ => false,
        };
        if !opens {
            i += 1;
            continue;
        }
        let close = chars[i + 1..].iter().position(|&(end_at, d)| {
            if d != c || end_at - at > MAX_QUOTE_BYTES {
                return false;
            }
            c == '"'
                || chars
                    .iter()
                    .find(|&&(next_at, _)| next_at > end_at)
                    .is_none_or(|&(_, next)| !next.is_alphanumeric())
        });
        match close {
            Some(offset) => {
                let (end_at, end_char) = chars[i + 1 + offset];
                found.push(at..end_at + end_char.len_utf8());
                i += offset + 2;
            }
            None => i += 1,
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learning::rules::v2::fold::Folded;

    fn own_lines(text: &str) -> Vec<String> {
        let folded = Folded::new(text);
        let prose = Prose::new(&folded.text);
        prose
            .lines
            .iter()
            .map(|r| folded.text[r.clone()].to_owned())
            .collect()
    }

    #[test]
    fn pasted_output_is_not_the_users_words() {
        for line in [
            "warning: comparison of unsigned expression in '>= 0' is always true [-Wtype-limits]",
            "error[E0382]: borrow of moved value: `x`",
            "  File \"/app/main.py\", line 12, in <module>",
            "    at Object.<anonymous> (/src/index.js:4:11)",
            "TypeError: property.price is undefined",
            "npm ERR! Missing script: \"test\"",
            "2025-01-29T19:29:50Z info: Pushed soci index manifest",
            "0x15685ad30 INFO videodecoder gstvideodecoder.c:1636",
            "Wall time: 0.1 seconds",
            "PS C:\\Users\\me\\repo> pnpm install",
            "$ cargo test",
            "127.0.0.1 - - [03/Oct/2024 13:03:43] \"GET / HTTP/1.1\" 200 -",
            "{\"id\": 1, \"never\": true}",
            "src/main.rs:12:5: never do this",
            "Process exited with code 1",
        ] {
            assert!(looks_like_output(&line.to_lowercase()), "{line}");
        }
        for line in [
            "Never run migrations on prod.",
            "No, use pnpm, not npm",
            "use `pnpm` instead, because the lockfile is pnpm-lock.yaml",
            "以后都用中文回答，代码注释和 commit message 还是用英文",
            "That's wrong — it's pnpm.",
            "i use setx or set",
        ] {
            assert!(!looks_like_output(&line.to_lowercase()), "{line}");
        }
    }

    #[test]
    fn fences_quotes_and_indented_code_are_excluded() {
        let text =
            "Please fix it.\n```\nnever use this\n```\n> always quote\n    don't indent\nthanks";
        assert_eq!(own_lines(text), ["please fix it.", "thanks"]);
    }

    #[test]
    fn long_pastes_keep_their_edges() {
        let mut text = String::from("use this guide to build the crawler\n\n");
        for i in 0..30 {
            text.push_str(&format!("always call the api number {i} with care\n"));
        }
        text.push_str("\nand keep it short");
        let lines = own_lines(&text);
        assert_eq!(
            lines.first().unwrap(),
            "use this guide to build the crawler"
        );
        assert_eq!(lines.last().unwrap(), "and keep it short");
        assert!(lines.len() <= 2 * EDGE_LINES);
    }

    #[test]
    fn quotes_code_urls_and_paths_are_literal() {
        let text = "the readme says \"never use npm\" and `always` see https://x.io/never, src/never/a.rs, don't";
        let folded = Folded::new(text);
        let prose = Prose::new(&folded.text);
        let at = |needle: &str| folded.text.find(needle).unwrap();
        assert!(prose.is_literal(at("never use")));
        assert!(prose.is_literal(at("always")));
        assert!(prose.is_literal(at("x.io")));
        assert!(prose.is_literal(at("src/never")));
        assert!(!prose.is_literal(at("don't")));
        assert!(!prose.is_literal(at("readme")));
    }
}

//! The Markdown form of a resident Memory projection: [`render`] writes entries as a bullet
//! list under a header comment, [`parse`] reads them back from a file a person may have edited.
//! Pure text functions; reading and writing the file is [`crate::managed_file`]'s job.

/// Renders entries as Markdown: a header comment naming the scope, the revision and how to accept
/// edits (`zuno learn import-memory <scope>`), a blank line, then one `- entry` per entry with the
/// continuation lines of a multi-line entry indented by two spaces (blank lines inside an entry
/// stay blank).
///
/// Entries are normalised first ([`normalize_entry`]; empty ones are dropped) and projected
/// ([`projected_entry`]: invisible and reordering characters become `[U+XXXX]` markers, as in
/// prompt sections, so the file shows a person what a model reading it would see; `@` and `<`
/// are escaped so the file imports nothing and hides nothing), so
/// `parse(&render(s, r, x)) == projected(normalize(x))`, and `== x` when every entry is already
/// normalised and projected.
/// An entry whose first line would turn `- …` into a thematic break (`---`, `- -`) is written
/// with a `* ` bullet instead, so it still round-trips. `scope` is `global` or `project`; `>` and
/// control characters are dropped from it so it cannot end the comment.
pub fn render(scope: &str, revision: i64, entries: &[String]) -> String {
    let scope: String = scope
        .chars()
        .filter(|c| *c != '>' && !c.is_control())
        .collect();
    let mut out = format!(
        "<!--\n\
         Zuno resident Memory ({scope} scope), revision {revision}.\n\
         The accepted entries live in Zuno's database; this file is a readable projection of them.\n\
         Edits made here are kept but not used until you accept them with:\n\
         \x20 zuno learn import-memory {scope}\n\
         -->\n"
    );
    let mut first_entry = true;
    for entry in entries
        .iter()
        .filter_map(|entry| normalize_entry(entry))
        .map(|entry| projected_entry(&entry))
    {
        if first_entry {
            out.push('\n');
            first_entry = false;
        }
        let mut lines = entry.split('\n');
        let first = lines.next().unwrap_or_default();
        let marker = if is_thematic_break(&format!("- {first}")) {
            "* "
        } else {
            "- "
        };
        out.push_str(marker);
        out.push_str(first);
        out.push('\n');
        for line in lines {
            if !line.is_empty() {
                out.push_str("  ");
                out.push_str(line);
            }
            out.push('\n');
        }
    }
    out
}

/// An entry as its projection writes it: [`visible_entry`], then [`inert_entry`]. Idempotent,
/// so an imported projection renders to the same file.
pub fn projected_entry(entry: &str) -> String {
    inert_entry(&visible_entry(entry))
}

/// An entry whose Markdown can neither import a file nor hide text: every `@` and every `<`
/// followed by a non-space character gets a backslash, unless it already has one or sits in code
/// (a fenced code block, or an inline code span when the entry's code spans are unambiguous).
///
/// Why: `CLAUDE.md` imports `.zuno/RULES.md` (`@.zuno/RULES.md`), and Claude Code reads an `@`
/// that starts a token outside code (the pattern `(?:^|\s)@\S+`, also at the start of a text
/// run after emphasis or a link) as an import of that path, recursively: an entry "keys are in
/// @~/.ssh/id_ed25519" would put the key into the model's context. `\@` is a Markdown escape:
/// rendered Markdown still shows `@`, and neither the raw text (`@` after a backslash) nor the
/// parsed text (an escape, then text without `@`) matches. A backslash survives the secret
/// filter and a copy-paste, where a zero-width character or an unbalanced backtick would not. A
/// `<` would open an HTML comment (`<!--`, which hides every later entry in a rendered file), a
/// tag or an autolink; `\<` shows it as text.
///
/// Code is left alone because an escape shows there literally. A fence counts only when
/// CommonMark would surely open one (indent at most three, three or more backticks or tildes),
/// and closes at any line that could close it, so a doubt escapes more. Inline code spans are
/// skipped only when every backtick run outside fences closes on its own line and no line with
/// backticks holds a backslash before a backtick or a table `|`; otherwise spans could pair
/// across lines or cells differently than a renderer pairs them, and everything is escaped.
pub fn inert_entry(entry: &str) -> String {
    let lines: Vec<&str> = entry.split('\n').collect();
    let fenced = fenced_lines(&lines);
    let spans_are_clear = lines
        .iter()
        .zip(&fenced)
        .all(|(line, fenced)| *fenced || line_code_spans(line).is_some());
    let mut out = String::with_capacity(entry.len() + 8);
    for (i, (line, fenced)) in lines.iter().zip(&fenced).enumerate() {
        if i > 0 {
            out.push('\n');
        }
        if *fenced {
            out.push_str(line);
            continue;
        }
        let spans = if spans_are_clear {
            line_code_spans(line).unwrap_or_default()
        } else {
            Vec::new()
        };
        escape_line(line, &spans, &mut out);
    }
    out
}

/// Escapes `@` and `<` (before a non-space character) outside `spans` (byte ranges of code).
fn escape_line(line: &str, spans: &[(usize, usize)], out: &mut String) {
    let mut backslashes = 0usize;
    let mut chars = line.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        let in_code = spans
            .iter()
            .any(|(start, end)| (*start..*end).contains(&at));
        let next_is_text = chars.peek().is_some_and(|(_, next)| !next.is_whitespace());
        if !in_code && matches!(c, '@' | '<') && next_is_text && backslashes.is_multiple_of(2) {
            out.push('\\');
        }
        backslashes = if c == '\\' && !in_code {
            backslashes + 1
        } else {
            0
        };
        out.push(c);
    }
}

/// Which lines are inside a fenced code block (the fence lines included), as every renderer
/// would agree: a fence opens on a line indented by spaces only, at most three; it closes on a
/// line CommonMark closes it with. A line that some renderer might read as a close and
/// CommonMark does not (indented further, or ending in other fence characters) leaves the rest
/// of the entry unfenced, since a renderer that closed there would read a later fence line as
/// an opening one.
fn fenced_lines(lines: &[&str]) -> Vec<bool> {
    let mut fenced = vec![false; lines.len()];
    let mut open: Option<Fence> = None;
    for (i, line) in lines.iter().enumerate() {
        let indent = line.len() - line.trim_start_matches(' ').len();
        let text = line.trim_start_matches([' ', '\t']);
        match open {
            Some(fence) => {
                let run = text.chars().take_while(|c| *c == fence.ch).count();
                let rest = &text[run * fence.ch.len_utf8()..];
                let strict = indent <= 3
                    && text.len() == line.len() - indent
                    && run >= fence.len
                    && rest.trim().is_empty();
                let possible =
                    run >= fence.len && rest.chars().all(|c| matches!(c, '`' | '~' | ' ' | '\t'));
                if possible && !strict {
                    break;
                }
                fenced[i] = true;
                if strict {
                    open = None;
                }
            }
            None if indent <= 3 && text.len() == line.len() - indent => {
                open = open_fence(text);
                fenced[i] = open.is_some();
            }
            None => {}
        }
    }
    fenced
}

/// The byte ranges of a line's inline code spans (backtick runs paired left to right with the
/// next run of the same length), or `None` when a run does not close on this line, a backtick
/// follows a backslash, or the line could be a table row.
fn line_code_spans(line: &str) -> Option<Vec<(usize, usize)>> {
    let bytes = line.as_bytes();
    let mut runs = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'`' {
            let start = i;
            while i < bytes.len() && bytes[i] == b'`' {
                i += 1;
            }
            runs.push((start, i - start));
        } else {
            i += 1;
        }
    }
    if runs.is_empty() {
        return Some(Vec::new());
    }
    if line.contains('|')
        || runs
            .iter()
            .any(|(start, _)| *start > 0 && bytes[start - 1] == b'\\')
    {
        return None;
    }
    let mut spans = Vec::new();
    let mut k = 0;
    while k < runs.len() {
        let (start, len) = runs[k];
        let close = (k + 1..runs.len()).find(|j| runs[*j].1 == len)?;
        spans.push((start, runs[close].0 + len));
        k = close + 1;
    }
    Some(spans)
}

/// An entry as its projection shows it: every invisible or reordering codepoint (zero-width
/// characters, bidi controls, tags, variation selectors, …) as a visible `[U+XXXX]` marker, and a
/// `[U+` already in the text written `&#91;U+`, so every marker in a file was put there by Zuno.
/// Entries without such characters are unchanged.
pub fn visible_entry(entry: &str) -> String {
    use crate::text::codepoints::is_invisible_or_reordering;
    let mut out = String::with_capacity(entry.len());
    let mut chars = entry.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\n' => out.push('\n'),
            '[' if {
                let mut rest = chars.clone();
                matches!(rest.next(), Some('U' | 'u')) && rest.next() == Some('+')
            } =>
            {
                out.push_str("&#91;");
            }
            c if is_invisible_or_reordering(c) => {
                out.push_str(&format!("[U+{:04X}]", c as u32));
            }
            c => out.push(c),
        }
    }
    out
}

/// The canonical form of one entry, as [`parse`] produces it: lines split on `\n`/`\r\n`,
/// trailing whitespace removed from every line, leading and trailing blank lines removed, leading
/// whitespace removed from the first line (later lines keep their indentation). `None` when
/// nothing is left.
pub fn normalize_entry(entry: &str) -> Option<String> {
    let lines: Vec<&str> = entry.lines().map(str::trim_end).collect();
    let start = lines.iter().position(|line| !line.is_empty())?;
    let end = lines.iter().rposition(|line| !line.is_empty())?;
    let mut out = String::new();
    for (i, line) in lines[start..=end].iter().enumerate() {
        if i == 0 {
            out.push_str(line.trim_start());
        } else {
            out.push('\n');
            out.push_str(line);
        }
    }
    Some(out)
}

/// Parses entries back from any Markdown a user may have edited.
///
/// * `-`, `*` and `+` bullets and ordered items (`1.`, `2)`) are entries. Lines indented to the
///   item's content column continue it (that indentation is removed; blank lines followed by
///   such a line stay in the entry); an unindented text line right after it is a lazy
///   continuation. Nested lists therefore stay inside their parent entry.
/// * Outside items, each paragraph (lines up to a blank line) is one entry, so a file written
///   without bullets yields one entry per paragraph.
/// * HTML comments (the header), blank lines, ATX (`#`) headings, thematic breaks and one-line
///   setext headings (a line over `===`/`---`) are ignored; a longer paragraph over such an
///   underline is kept as an entry rather than dropped. Fenced code blocks
///   (```` ``` ````/`~~~`) are kept whole, blank lines and `#` lines included, in the entry
///   that contains them.
/// * A leading byte-order mark and `\r\n` line ends are accepted; each entry is
///   [`normalize_entry`]-ed.
///
/// `parse(&render(s, r, x))` returns the normalised `x`.
pub fn parse(content: &str) -> Vec<String> {
    let content = content.strip_prefix('\u{feff}').unwrap_or(content);
    let mut parser = Parser::default();
    for line in content.lines() {
        parser.feed(line);
    }
    parser.close();
    parser.entries
}

#[derive(Default)]
struct Parser {
    entries: Vec<String>,
    block: Block,
    in_comment: bool,
}

#[derive(Default)]
enum Block {
    #[default]
    None,
    Item(Item),
    Paragraph(Paragraph),
}

struct Item {
    lines: Vec<String>,
    /// The content column: continuation lines are indented at least this far.
    offset: usize,
    /// Blank lines seen since the last content line, kept if the item continues.
    blanks: usize,
    fence: Option<Fence>,
}

struct Paragraph {
    lines: Vec<String>,
    fence: Option<Fence>,
}

#[derive(Clone, Copy)]
struct Fence {
    ch: char,
    len: usize,
}

impl Item {
    /// Takes `line` into this item, or returns false when the line ends it.
    fn take(&mut self, line: &str) -> bool {
        if line.is_empty() {
            if self.fence.is_some() {
                self.lines.push(String::new());
            } else {
                self.blanks += 1;
            }
            return true;
        }
        if indent_width(line) >= self.offset {
            for _ in 0..std::mem::take(&mut self.blanks) {
                self.lines.push(String::new());
            }
            let text = strip_indent(line, self.offset);
            self.fence = next_fence(self.fence, text);
            self.lines.push(text.to_string());
            return true;
        }
        let text = line.trim_start_matches([' ', '\t']);
        let lazy = self.fence.is_none()
            && self.blanks == 0
            && self.lines.iter().any(|line| !line.is_empty())
            && is_plain_text(text);
        if lazy {
            self.lines.push(text.to_string());
        }
        lazy
    }
}

impl Parser {
    fn feed(&mut self, raw: &str) {
        let line = raw.trim_end();
        if self.in_comment {
            if let Some(end) = line.find("-->") {
                self.in_comment = false;
                let rest = &line[end + 3..];
                if !rest.trim().is_empty() {
                    self.feed(rest);
                }
            }
            return;
        }
        if let Block::Item(item) = &mut self.block {
            if item.take(line) {
                return;
            }
            self.close();
        }
        self.top_level(line);
    }

    /// A line outside any item.
    fn top_level(&mut self, line: &str) {
        if let Block::Paragraph(paragraph) = &mut self.block
            && let Some(fence) = paragraph.fence
        {
            paragraph.lines.push(line.to_string());
            if closes_fence(fence, line.trim_start_matches([' ', '\t'])) {
                paragraph.fence = None;
            }
            return;
        }
        if line.is_empty() {
            self.close();
            return;
        }
        let indent = indent_width(line);
        let text = line.trim_start_matches([' ', '\t']);
        let in_paragraph = matches!(self.block, Block::Paragraph(_));
        if indent <= 3 {
            if let Some(rest) = text.strip_prefix("<!--") {
                self.close();
                match rest.find("-->") {
                    Some(end) => {
                        let after = &rest[end + 3..];
                        if !after.trim().is_empty() {
                            self.feed(after);
                        }
                    }
                    None => self.in_comment = true,
                }
                return;
            }
            if is_setext_underline(text) {
                // A one-line paragraph over `===`/`---` is a heading. A longer paragraph is kept
                // (the underline is read as a separator) rather than dropping several lines of
                // hand-written text.
                if let Block::Paragraph(paragraph) = &self.block
                    && paragraph.lines.len() == 1
                {
                    self.block = Block::None;
                    return;
                }
                if text.starts_with('=') {
                    return;
                }
            }
            if is_thematic_break(text) || is_heading(text) {
                self.close();
                return;
            }
            if let Some(start) = bullet(line)
                && !(in_paragraph && start.ordered_not_one)
            {
                self.close();
                self.block = Block::Item(Item {
                    lines: vec![start.content.to_string()],
                    offset: start.offset,
                    blanks: 0,
                    fence: open_fence(start.content),
                });
                return;
            }
        }
        let fence = if indent <= 3 { open_fence(text) } else { None };
        match &mut self.block {
            Block::Paragraph(paragraph) => {
                paragraph.lines.push(text.to_string());
                paragraph.fence = fence;
            }
            _ => {
                self.close();
                self.block = Block::Paragraph(Paragraph {
                    lines: vec![text.to_string()],
                    fence,
                });
            }
        }
    }

    fn close(&mut self) {
        let lines = match std::mem::take(&mut self.block) {
            Block::None => return,
            Block::Item(item) => item.lines,
            Block::Paragraph(paragraph) => paragraph.lines,
        };
        if let Some(entry) = normalize_entry(&lines.join("\n")) {
            self.entries.push(entry);
        }
    }
}

struct Bullet<'a> {
    offset: usize,
    content: &'a str,
    /// An ordered item numbered other than 1, which may not interrupt a paragraph.
    ordered_not_one: bool,
}

/// A list-item start (`- x`, `* x`, `+ x`, `1. x`, `1) x`) indented at most three columns.
fn bullet(line: &str) -> Option<Bullet<'_>> {
    let lead = indent_width(line);
    if lead > 3 {
        return None;
    }
    let text = line.trim_start_matches([' ', '\t']);
    let (marker, ordered_not_one) = match text.as_bytes().first()? {
        b'-' | b'*' | b'+' => (1, false),
        b'0'..=b'9' => {
            let digits = text.bytes().take_while(u8::is_ascii_digit).count();
            if digits > 9 || !matches!(text.as_bytes().get(digits), Some(b'.' | b')')) {
                return None;
            }
            (digits + 1, text[..digits].parse::<u32>().ok() != Some(1))
        }
        _ => return None,
    };
    let rest = &text[marker..];
    if rest.is_empty() {
        return Some(Bullet {
            offset: lead + marker + 1,
            content: "",
            ordered_not_one,
        });
    }
    if !rest.starts_with([' ', '\t']) {
        return None;
    }
    let gap = match indent_width(rest) {
        gap @ 1..=4 => gap,
        _ => 1,
    };
    Some(Bullet {
        offset: lead + marker + gap,
        content: rest.trim_start_matches([' ', '\t']),
        ordered_not_one,
    })
}

/// A line that may lazily continue an item: not the start of any other block.
fn is_plain_text(text: &str) -> bool {
    !(text.starts_with("<!--")
        || is_thematic_break(text)
        || is_heading(text)
        || (is_setext_underline(text) && text.starts_with('='))
        || bullet(text).is_some()
        || open_fence(text).is_some())
}

fn is_heading(text: &str) -> bool {
    let hashes = text.bytes().take_while(|b| *b == b'#').count();
    (1..=6).contains(&hashes) && matches!(text.as_bytes().get(hashes), None | Some(b' ' | b'\t'))
}

/// `===` or `---` (no inner spaces) under a paragraph line.
fn is_setext_underline(text: &str) -> bool {
    !text.is_empty()
        && (text.bytes().all(|b| b == b'=') || (text.len() >= 2 && text.bytes().all(|b| b == b'-')))
}

/// Three or more `-`, `*` or `_` (one kind), optionally separated by spaces.
fn is_thematic_break(text: &str) -> bool {
    let mut kind = None;
    let mut count = 0;
    for c in text.chars() {
        match c {
            ' ' | '\t' => {}
            '-' | '*' | '_' if *kind.get_or_insert(c) == c => count += 1,
            _ => return false,
        }
    }
    count >= 3
}

fn open_fence(text: &str) -> Option<Fence> {
    let ch = text.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let len = text.chars().take_while(|c| *c == ch).count();
    if len < 3 || (ch == '`' && text[len..].contains('`')) {
        return None;
    }
    Some(Fence { ch, len })
}

fn closes_fence(fence: Fence, text: &str) -> bool {
    let len = text.chars().take_while(|c| *c == fence.ch).count();
    len >= fence.len && text[len * fence.ch.len_utf8()..].trim().is_empty()
}

fn next_fence(current: Option<Fence>, text: &str) -> Option<Fence> {
    let text = text.trim_start_matches([' ', '\t']);
    match current {
        Some(fence) if closes_fence(fence, text) => None,
        Some(fence) => Some(fence),
        None => open_fence(text),
    }
}

/// Leading columns of spaces and tabs (tab stops every four columns).
fn indent_width(line: &str) -> usize {
    let mut col = 0;
    for c in line.chars() {
        match c {
            ' ' => col += 1,
            '\t' => col += 4 - col % 4,
            _ => break,
        }
    }
    col
}

/// `line` without up to `width` columns of leading spaces and tabs.
fn strip_indent(line: &str, width: usize) -> &str {
    let mut col = 0;
    for (i, c) in line.char_indices() {
        if col >= width {
            return &line[i..];
        }
        match c {
            ' ' => col += 1,
            '\t' => col += 4 - col % 4,
            _ => return &line[i..],
        }
    }
    ""
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(items: &[&str]) -> Vec<String> {
        items.iter().map(|item| item.to_string()).collect()
    }

    #[test]
    fn render_then_parse_round_trips() {
        let original = entries(&[
            "Prefer `cargo nextest` over `cargo test`.",
            "Multi-line rule:\nsecond line\n  indented third line",
            "提交前运行 `cargo fmt`,不要用 `--all`。",
            "多行中文条目\n第二行:保持简洁。",
            "Blank lines inside\n\n\nstay inside",
            "A code block:\n```sh\n# not a heading\n\ncargo test\n```\nafter the fence",
            "Unclosed fence\n```\nstill here",
            "- looks like a bullet\n* and so does this\n1. and this",
            "# looks like a heading\n<!-- looks like a comment -->\n---\n===",
            "---",
            "- - -",
            "***",
            "<!-- starts a comment",
            "Tabs\tinside\n\tand a leading tab",
            "\u{3000}ideographic space later\nok",
        ]);
        let rendered = render("project", 42, &original);
        let parsed = parse(&rendered);
        let normalized: Vec<String> = original.iter().filter_map(|e| normalize_entry(e)).collect();
        let projected: Vec<String> = normalized.iter().map(|e| projected_entry(e)).collect();
        assert_eq!(parsed, projected, "rendered:\n{rendered}");
        // Only the ideographic-space entry changes under normalisation.
        assert_eq!(
            normalized.last().unwrap(),
            "ideographic space later\nok",
            "leading whitespace of the first line is not content"
        );
        // Only the two entries holding `<!--` change under projection.
        assert_eq!(
            parsed[8],
            "# looks like a heading\n\\<!-- looks like a comment -->\n---\n==="
        );
        assert_eq!(parsed[12], "\\<!-- starts a comment");
        for i in (0..14).filter(|i| ![8, 12].contains(i)) {
            assert_eq!(parsed[i], original[i]);
        }
        // Rendering is stable.
        assert_eq!(render("project", 42, &parsed), rendered);
    }

    #[test]
    fn render_layout() {
        let rendered = render(
            "global",
            7,
            &entries(&["One", "Two\nlines\n\nand a gap", "  ", ""]),
        );
        assert!(rendered.starts_with("<!--\n"));
        assert!(rendered.contains("global scope"));
        assert!(rendered.contains("revision 7"));
        assert!(rendered.contains("zuno learn import-memory global"));
        assert!(rendered.ends_with("-->\n\n- One\n- Two\n  lines\n\n  and a gap\n"));
        assert_eq!(
            parse(&rendered),
            entries(&["One", "Two\nlines\n\nand a gap"])
        );
        // No entries: just the header, which parses to nothing.
        assert_eq!(parse(&render("project", 0, &[])), Vec::<String>::new());
        // A hostile scope cannot close the comment early.
        let rendered = render("x-->- injected", 1, &entries(&["a"]));
        assert_eq!(parse(&rendered), entries(&["a"]));
    }

    #[test]
    fn projections_show_invisible_and_reordering_characters_as_markers() {
        let hostile = entries(&[
            "Use pnpm\u{202E}mpn esu\u{202C} always",
            "zero\u{200B}width and a forged [U+0041] marker",
            "plain entry",
        ]);
        let rendered = render("project", 3, &hostile);
        assert!(
            rendered.contains("- Use pnpm[U+202E]mpn esu[U+202C] always\n"),
            "{rendered}"
        );
        assert!(rendered.contains("- zero[U+200B]width and a forged &#91;U+0041] marker\n"));
        assert!(
            !rendered
                .chars()
                .any(|c| matches!(c as u32, 0x200B | 0x202C | 0x202E)),
            "no invisible character reaches the file"
        );
        let parsed = parse(&rendered);
        let visible: Vec<String> = hostile.iter().map(|e| visible_entry(e)).collect();
        assert_eq!(parsed, visible);
        assert_eq!(parsed[2], "plain entry", "ordinary entries are unchanged");
    }

    #[test]
    fn projections_escape_imports_and_html_outside_code() {
        let hostile = entries(&[
            "Deploy keys are documented in @~/.ssh/id_ed25519",
            "@~/.aws/credentials first, then *emphasis*@/etc/passwd and [link @./secrets.md](x)",
            "<!-- hide everything after this",
            "mail alice@example.com, compare a < b and a<b",
            "Run `npm i -D @types/node` and ``a ` @inside``, not @outside",
            "Setup:\n```sh\nnpm i @scope/pkg <tag>\n```\nthen @~/.ssh/config",
            "already \\@escaped and \\\\@not-escaped",
            "last entry",
        ]);
        let rendered = render("project", 1, &hostile);
        assert!(
            rendered.contains("- Deploy keys are documented in \\@~/.ssh/id_ed25519\n"),
            "{rendered}"
        );
        assert!(rendered.contains(
            "- \\@~/.aws/credentials first, then *emphasis*\\@/etc/passwd and [link \\@./secrets.md](x)\n"
        ));
        assert!(rendered.contains("- \\<!-- hide everything after this\n"));
        assert!(rendered.contains("- mail alice\\@example.com, compare a < b and a\\<b\n"));
        assert!(
            rendered.contains("- Run `npm i -D @types/node` and ``a ` @inside``, not \\@outside\n")
        );
        assert!(rendered.contains(
            "- Setup:\n  ```sh\n  npm i @scope/pkg <tag>\n  ```\n  then \\@~/.ssh/config\n"
        ));
        assert!(rendered.contains("- already \\@escaped and \\\\\\@not-escaped\n"));
        // Outside code, no `@` starts a token and no `<` opens markup.
        let fenced = "  npm i @scope/pkg <tag>";
        for line in rendered.lines().skip(6).filter(|line| *line != fenced) {
            for (at, c) in line.char_indices() {
                if matches!(c, '@' | '<')
                    && line[at + 1..].starts_with(|n: char| !n.is_whitespace())
                {
                    let escaped = line[..at].ends_with('\\');
                    let code = line.contains('`');
                    assert!(escaped || code, "unescaped {c} in {line:?}");
                }
            }
        }
        let parsed = parse(&rendered);
        assert_eq!(parsed.len(), hostile.len(), "every entry still parses");
        assert_eq!(parsed.last().unwrap(), "last entry");
        // Projection is idempotent: an imported file renders to itself.
        assert_eq!(render("project", 1, &parsed), rendered);
    }

    #[test]
    fn ambiguous_code_is_escaped_too() {
        // A code span that may pair across lines, a table row, an escaped backtick: no skipping.
        assert_eq!(
            inert_entry("`open\nclose` @x `y`"),
            "`open\nclose` \\@x `y`"
        );
        assert_eq!(inert_entry("| `a | @b` |"), "| `a | \\@b` |");
        assert_eq!(inert_entry("\\`a `@b`"), "\\`a `\\@b`");
        // A fence some renderer may close early leaves the rest unfenced.
        assert_eq!(
            inert_entry("```\n@in\n    ```\n@x\n```\n@y"),
            "```\n@in\n    ```\n\\@x\n```\n\\@y"
        );
        assert_eq!(inert_entry("```\n@in\n```~\n@x"), "```\n@in\n```~\n\\@x");
        // Tab-indented fences are not trusted; an unclosed fence runs to the end.
        assert_eq!(inert_entry("\t```\n@x"), "\t```\n\\@x");
        assert_eq!(inert_entry("~~~\n@x <y"), "~~~\n@x <y");
        // `@` or `<` before a space or at the end imports and opens nothing.
        assert_eq!(inert_entry("a @ b <"), "a @ b <");
    }

    #[test]
    fn normalizes_messy_entries() {
        let messy = entries(&[
            "  padded  ",
            "\n\nlead\n  keep indent  \n\n",
            "crlf\r\nline",
        ]);
        let parsed = parse(&render("global", 1, &messy));
        assert_eq!(
            parsed,
            entries(&["padded", "lead\n  keep indent", "crlf\nline"])
        );
    }

    #[test]
    fn parses_hand_edited_markdown() {
        let text = "\u{feff}# Project rules\r\n\
            \r\n\
            Intro paragraph written by hand\r\n\
            that wraps onto a second line.\r\n\
            \r\n\
            ## Style\n\
            \n\
            * star bullet\n\
            + plus bullet\n\
            -   wide bullet\n    with its continuation\n\
            - lazy bullet\n\
            continues here\n\
            \n\
            Setext heading\n\
            ==============\n\
            \n\
            1. first ordered\n\
            2) second ordered\n\
            \n\
            - outer\n  - nested stays inside\n\
            \n\
            * * *\n\
            <!-- a note to self -->\n\
            Another paragraph.\n\
            Second setext\n\
            ---\n\
            ```bash\n\
            # a comment in code, not a heading\n\
            \n\
            make test\n\
            ```\n\
            \n\n\n\
            Last paragraph";
        assert_eq!(
            parse(text),
            entries(&[
                "Intro paragraph written by hand\nthat wraps onto a second line.",
                "star bullet",
                "plus bullet",
                "wide bullet\nwith its continuation",
                "lazy bullet\ncontinues here",
                "first ordered",
                "second ordered",
                "outer\n- nested stays inside",
                "Another paragraph.\nSecond setext",
                "```bash\n# a comment in code, not a heading\n\nmake test\n```",
                "Last paragraph",
            ])
        );
    }

    #[test]
    fn parses_paragraph_only_files() {
        let text = "Always run the linters.\n\n\
                    Never push to main.\nAsk first.\n\n\n\
                    用中文写提交说明。\n";
        assert_eq!(
            parse(text),
            entries(&[
                "Always run the linters.",
                "Never push to main.\nAsk first.",
                "用中文写提交说明。"
            ])
        );
        assert_eq!(parse(""), Vec::<String>::new());
        assert_eq!(
            parse("\n\n# Only a heading\n\n<!--\nmulti\nline\n-->\n"),
            Vec::<String>::new()
        );
        // Text after a comment on the same line is kept; a year is not an ordered item
        // mid-paragraph.
        assert_eq!(
            parse("<!-- note --> kept text\nsince\n2024. still the same paragraph"),
            entries(&["kept text\nsince\n2024. still the same paragraph"])
        );
    }
}

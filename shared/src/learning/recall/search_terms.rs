//! Query text → bounded, quoted search terms.
//!
//! This is the only way foreground prompt text or explicit search text reaches a full-text
//! `MATCH`. Every term leaves here as data: FTS5 builders emit each one as a double-quoted string
//! (inner `"` doubled), so operators (`AND`, `OR`, `NOT`, `NEAR(…)`, `*`, `^`, `+`, `-`),
//! column selectors (`title:x`, `{title summary}:x`), parentheses and unmatched quotes cannot
//! become query grammar or fail the turn. Inside quotes FTS5 treats a punctuated identifier such
//! as `node:fs` as the phrase of its tokens, which is exactly the match we want.
//!
//! Parsing, in order:
//! 1. Only the first [`MAX_QUERY_CHARS`] characters are read. Full-width ASCII (`ｐｎｐｍ`, `：`)
//!    folds to ASCII. Invisible and reordering codepoints (zero-width joiners, bidi overrides,
//!    Tags, variation selectors — see
//!    [`crate::text::codepoints::is_invisible_or_reordering`]) are deleted, so `pn\u{200B}pm` is
//!    the word a person sees; control characters separate terms.
//! 2. Candidates split on whitespace, controls, brackets, double quotes, backticks, `,` `;` `|`
//!    and CJK punctuation. Other punctuation inside a candidate stays, so `foo.bar`,
//!    `snake_case`, `kebab-case`, `a/b/c.rs`, `v1.2.3`, `C++` and `node:fs` are one term each.
//! 3. Runs of CJK characters (Han, kana, Hangul) are split away from the surrounding text:
//!    `用pnpm安装` is `用`, `pnpm`, `安装`.
//! 4. Non-CJK pieces lose leading/trailing punctuation that is not part of an identifier
//!    (`(foo),` → `foo`; `.env`, `@scope`, `--flag`, `C++`, `C#`, `__init__` keep theirs). A
//!    piece without a letter or digit is dropped.
//! 5. Terms are lowercased, stopwords dropped (a small English and Chinese/Japanese list; FTS
//!    keywords such as `NOT` and `NEAR` are *not* stopwords — they are searched as words),
//!    duplicates dropped, each term truncated to [`MAX_TERM_CHARS`] characters, and at most
//!    [`MAX_TERMS`] terms kept, first come first served.
//!
//! CJK segmentation: a run of at most [`MAX_CJK_RUN`] (6) characters is one term. Chinese and
//! Japanese are written without spaces, so a longer run is usually a clause, not a word; it
//! becomes 3-character windows starting every 2 characters, the last one aligned to the run's
//! end (`我们的数据库迁移` → `我们的`, `的数据`, `据库迁`, `库迁移`). Every window is long enough
//! for the trigram index, any text sharing 4 or more consecutive characters with the run
//! contains at least one window, and the stride of 2 spends half the term budget overlapping
//! windows would. CJK terms shorter than 3 characters cannot be searched through the trigram
//! index; [`QueryTerms::short_cjk_terms`] covers them with a bounded substring scan (`LIKE`).
//!
//! Backends: the unicode61 index tokenizes a CJK run as one token, so CJK recall comes from the
//! trigram index and the `LIKE` fallback; Latin recall mostly from unicode61. In
//! [`MatchMode::All`] each builder requires every term *it can express*: a caller that wants
//! all-terms semantics across several indexes intersects their results.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::text::codepoints::is_invisible_or_reordering;

/// At most this many terms reach a query, so a long prompt cannot build an expensive one.
pub const MAX_TERMS: usize = 16;
/// Longer terms are truncated (on a character boundary).
pub const MAX_TERM_CHARS: usize = 64;
/// Only this many characters of the input text are read.
pub const MAX_QUERY_CHARS: usize = 2000;
/// CJK runs up to this length are one term; longer ones become trigram windows.
pub const MAX_CJK_RUN: usize = 6;

/// How terms combine: default recall matches any term and reranks; explicit `match: "all"`
/// requires every term.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum MatchMode {
    #[default]
    Any,
    All,
}

impl MatchMode {
    fn operator(self) -> &'static str {
        match self {
            MatchMode::Any => " OR ",
            MatchMode::All => " AND ",
        }
    }
}

/// One normalized (lowercased, trimmed, bounded) search term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    pub text: String,
    /// The term is a run (or window) of CJK characters.
    pub cjk: bool,
}

/// The bounded terms of one query, in input order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueryTerms {
    pub terms: Vec<Term>,
}

/// Parses query text into bounded terms (see the module docs for the rules). Never fails: text
/// with no searchable term yields an empty [`QueryTerms`].
pub fn parse(text: &str) -> QueryTerms {
    let mut builder = Builder::default();
    let mut candidate = String::new();
    for c in text.chars().take(MAX_QUERY_CHARS).map(fold_full_width) {
        if is_invisible_or_reordering(c) && !c.is_control() {
            continue;
        }
        if is_separator(c) {
            if !builder.candidate(&candidate) {
                return builder.finish();
            }
            candidate.clear();
        } else {
            candidate.push(c);
        }
    }
    builder.candidate(&candidate);
    builder.finish()
}

impl QueryTerms {
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// `MATCH` expression for an FTS5 table with the unicode61 tokenizer: every term a
    /// double-quoted string, joined by ` OR ` ([`MatchMode::Any`]) or ` AND `
    /// ([`MatchMode::All`]). `None` when no term applies.
    pub fn fts5_unicode(&self, mode: MatchMode) -> Option<String> {
        let exact = join(
            self.terms
                .iter()
                .map(|t| t.text.as_str())
                // A term without a letter or digit is an empty phrase to unicode61; `parse` never
                // makes one, but the fields are public.
                .filter(|t| t.chars().any(char::is_alphanumeric)),
            mode,
        )?;
        if mode == MatchMode::All {
            return Some(exact);
        }
        // Inflections: `"dependenc" *` also matches `dependencies`. The prefix is lower-case
        // ASCII letters only (see `search_prefix`), so it is still quoted data.
        let prefixes: Vec<String> = self
            .search_prefixes()
            .into_iter()
            .map(|prefix| format!(" OR \"{prefix}\" *"))
            .collect();
        Some(format!("{exact}{}", prefixes.concat()))
    }

    /// Search prefixes of the English terms whose inflections differ from them (automatic
    /// recall widens its match with them).
    pub fn search_prefixes(&self) -> Vec<String> {
        let mut prefixes: Vec<String> = Vec::new();
        for term in self.terms.iter().filter(|t| !t.cjk) {
            if let Some(prefix) = crate::text::stem::search_prefix(&term.text)
                && !prefixes.contains(&prefix)
            {
                prefixes.push(prefix);
            }
        }
        prefixes
    }

    /// The same for an FTS5 `tokenize='trigram'` table: only terms of at least 3 characters,
    /// since shorter ones match no row there.
    pub fn fts5_trigram(&self, mode: MatchMode) -> Option<String> {
        join(
            self.terms
                .iter()
                .map(|t| t.text.as_str())
                .filter(|t| t.chars().filter(|c| !c.is_control()).count() >= 3),
            mode,
        )
    }

    /// CJK terms too short for the trigram index (the texts behind
    /// [`QueryTerms::short_cjk_like_patterns`]), in input order.
    pub fn short_cjk_terms(&self) -> Vec<&str> {
        self.terms
            .iter()
            .filter(|t| t.cjk && !t.text.is_empty() && t.text.chars().count() < 3)
            .map(|t| t.text.as_str())
            .collect()
    }

    /// CJK terms too short for the trigram index, as `%term%` patterns for
    /// `LIKE ? ESCAPE '\'`, with `\`, `%` and `_` escaped by `\`. Bounded by [`MAX_TERMS`].
    pub fn short_cjk_like_patterns(&self) -> Vec<String> {
        self.short_cjk_terms()
            .into_iter()
            .map(|text| {
                let mut pattern = String::with_capacity(text.len() + 2);
                pattern.push('%');
                for c in text.chars() {
                    if matches!(c, '\\' | '%' | '_') {
                        pattern.push('\\');
                    }
                    pattern.push(c);
                }
                pattern.push('%');
                pattern
            })
            .collect()
    }

    /// Plain term texts, for backends that quote terms themselves (Postgres: one
    /// `plainto_tsquery` per term, bound as a parameter).
    pub fn texts(&self) -> Vec<&str> {
        self.terms.iter().map(|t| t.text.as_str()).collect()
    }
}

/// Joins quoted terms with the mode's operator.
fn join<'a>(terms: impl Iterator<Item = &'a str>, mode: MatchMode) -> Option<String> {
    let mut out = String::new();
    for term in terms.filter(|t| !t.is_empty()) {
        if !out.is_empty() {
            out.push_str(mode.operator());
        }
        out.push('"');
        for c in term.chars() {
            match c {
                '"' => out.push_str("\"\""),
                // A NUL could end the string early inside SQLite; controls never come from
                // `parse`, but the fields are public.
                c if c.is_control() => out.push(' '),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    (!out.is_empty()).then_some(out)
}

/// Accumulates terms under the caps.
#[derive(Default)]
struct Builder {
    terms: Vec<Term>,
    seen: HashSet<String>,
}

impl Builder {
    fn finish(self) -> QueryTerms {
        QueryTerms { terms: self.terms }
    }

    /// Splits one whitespace/bracket-delimited candidate into CJK and non-CJK pieces. Returns
    /// false once the term cap is reached.
    fn candidate(&mut self, candidate: &str) -> bool {
        for (cjk, piece) in script_runs(candidate) {
            let open = if cjk {
                self.cjk_run(piece)
            } else {
                self.latin(piece)
            };
            if !open {
                return false;
            }
        }
        true
    }

    fn latin(&mut self, piece: &str) -> bool {
        let Some(lower) = latin_word(piece) else {
            return true;
        };
        if is_stopword(&lower) {
            return true;
        }
        self.push(lower, false)
    }

    fn cjk_run(&mut self, run: &str) -> bool {
        let chars: Vec<char> = run.chars().collect();
        if chars.len() <= MAX_CJK_RUN {
            let term: String = chars.iter().collect::<String>().to_lowercase();
            if CJK_STOPWORDS.contains(&term.as_str()) {
                return true;
            }
            return self.push(term, true);
        }
        let last = chars.len() - 3;
        let starts = (0..last).step_by(2).chain(std::iter::once(last));
        for start in starts {
            let window: String = chars[start..start + 3].iter().collect();
            if !self.push(window.to_lowercase(), true) {
                return false;
            }
        }
        true
    }

    /// Adds a term unless it duplicates one; returns false once the cap is reached.
    fn push(&mut self, text: String, cjk: bool) -> bool {
        if self.terms.len() >= MAX_TERMS {
            return false;
        }
        let text: String = text.chars().take(MAX_TERM_CHARS).collect();
        if self.seen.insert(text.clone()) {
            self.terms.push(Term { text, cjk });
        }
        self.terms.len() < MAX_TERMS
    }
}

/// A non-CJK piece as a term: leading/trailing punctuation that is not part of an identifier
/// trimmed, lowercased; `None` without a letter or digit.
fn latin_word(piece: &str) -> Option<String> {
    let trimmed = piece
        .trim_start_matches(|c: char| !(c.is_alphanumeric() || KEEP_LEADING.contains(&c)))
        .trim_end_matches(|c: char| {
            !(c.is_alphanumeric() || is_combining_mark(c) || KEEP_TRAILING.contains(&c))
        });
    trimmed
        .chars()
        .any(char::is_alphanumeric)
        .then(|| trimmed.to_lowercase())
}

/// Whether a lowercased non-CJK term is an English stopword.
pub(crate) fn is_stopword(word: &str) -> bool {
    ENGLISH_STOPWORDS.contains(&word)
}

/// One piece of stored text as [`parse`] splits queries, for indexing the same words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    /// A lowercased word or identifier (stopwords included).
    Word(String),
    /// A run of CJK characters.
    Cjk(String),
}

/// The runs of `candidate` that are all CJK or all other characters, in order, each with
/// whether it is CJK: the one split both the query parser and the index builder make.
fn script_runs(candidate: &str) -> impl Iterator<Item = (bool, &str)> {
    let mut rest = candidate;
    std::iter::from_fn(move || {
        let cjk = is_cjk(rest.chars().next()?);
        let end = rest
            .char_indices()
            .find(|&(_, c)| is_cjk(c) != cjk)
            .map_or(rest.len(), |(at, _)| at);
        let (piece, tail) = rest.split_at(end);
        rest = tail;
        Some((cjk, piece))
    })
}

/// Every piece of `text`, in order, split exactly as [`parse`] splits a query but without its
/// caps (no length limit, no term limit, no deduplication) and with stopwords kept, so an index
/// built from stored text meets the terms of a query.
pub(crate) fn pieces(text: &str, mut visit: impl FnMut(Piece)) {
    let mut candidate = String::new();
    let flush = |candidate: &str, visit: &mut dyn FnMut(Piece)| {
        for (cjk, piece) in script_runs(candidate) {
            if cjk {
                visit(Piece::Cjk(piece.to_lowercase()));
            } else if let Some(word) = latin_word(piece) {
                visit(Piece::Word(word));
            }
        }
    };
    for c in text.chars().map(fold_full_width) {
        if is_invisible_or_reordering(c) && !c.is_control() {
            continue;
        }
        if is_separator(c) {
            flush(&candidate, &mut visit);
            candidate.clear();
        } else {
            candidate.push(c);
        }
    }
    flush(&candidate, &mut visit);
}

/// Punctuation that may begin an identifier: `.env`, `@scope/pkg`, `$HOME`, `~/.ssh`, `/usr`,
/// `--release`, `__init__`, `#123`.
const KEEP_LEADING: &[char] = &['.', '@', '$', '~', '/', '-', '_', '#'];
/// Punctuation that may end one: `C++`, `C#`, `__init__`.
const KEEP_TRAILING: &[char] = &['+', '#', '_'];

const ENGLISH_STOPWORDS: &[&str] = &[
    "a", "about", "after", "also", "am", "an", "and", "any", "are", "as", "at", "be", "been",
    "but", "by", "can", "could", "did", "do", "does", "for", "from", "had", "has", "have", "he",
    "her", "here", "him", "his", "how", "i", "if", "in", "into", "is", "it", "its", "just", "me",
    "my", "of", "on", "or", "our", "please", "she", "should", "so", "some", "than", "that", "the",
    "their", "them", "then", "there", "these", "they", "this", "those", "to", "us", "was", "we",
    "were", "what", "when", "where", "which", "who", "why", "will", "with", "would", "you", "your",
];

const CJK_STOPWORDS: &[&str] = &[
    // Chinese particles, pronouns and fillers.
    "的", "了", "是", "在", "和", "与", "及", "或", "我", "你", "他", "她", "它", "们", "这", "那",
    "就", "也", "都", "吗", "呢", "吧", "啊", "把", "被", "着", "个", "我们", "你们", "他们",
    "这个", "那个", "什么", "怎么", "如何", "一个", "可以", "请", "帮我",
    // Japanese particles.
    "の", "は", "を", "に", "が", "で", "と", "も", "へ", "や", "です", "ます",
];

/// Full-width ASCII forms (`ｐｎｐｍ`, `：`) and the ideographic space fold to ASCII, the
/// NFKC mapping for the only compatibility characters CJK input methods commonly produce.
fn fold_full_width(c: char) -> char {
    match c {
        '\u{FF01}'..='\u{FF5E}' => char::from_u32(c as u32 - 0xFEE0).unwrap_or(c),
        '\u{3000}' => ' ',
        c => c,
    }
}

fn is_separator(c: char) -> bool {
    c.is_whitespace()
        || c.is_control()
        || matches!(
            c,
            '"' | '`'
                | '('
                | ')'
                | '['
                | ']'
                | '{'
                | '}'
                | '<'
                | '>'
                | ','
                | ';'
                | '|'
                | '\u{201C}'
                | '\u{201D}'
                | '\u{201E}'
                | '\u{00AB}'
                | '\u{00BB}'
                | '\u{2039}'
                | '\u{203A}'
        )
        // CJK symbols and punctuation (、。「」【】…), vertical and small forms, halfwidth
        // CJK punctuation; the letters of these blocks (々, 〇) are not separators.
        || (matches!(c, '\u{3000}'..='\u{303F}'
            | '\u{FE10}'..='\u{FE1F}'
            | '\u{FE30}'..='\u{FE4F}'
            | '\u{FF5F}'..='\u{FF65}'
            | '\u{30FB}')
            && !c.is_alphanumeric())
}

/// Han ideographs, kana and Hangul: scripts written without spaces between words (Hangul is
/// spaced, but particles attach to words, so substring search serves it too).
fn is_cjk(c: char) -> bool {
    c.is_alphanumeric()
        && matches!(c,
            '\u{1100}'..='\u{11FF}'   // Hangul Jamo
            | '\u{3005}'..='\u{3007}' // 々 〆 〇
            | '\u{3021}'..='\u{3029}' // Hangzhou numerals
            | '\u{3040}'..='\u{30FF}' // Hiragana, Katakana
            | '\u{3130}'..='\u{318F}' // Hangul compatibility Jamo
            | '\u{31F0}'..='\u{31FF}' // Katakana phonetic extensions
            | '\u{3400}'..='\u{4DBF}' // CJK extension A
            | '\u{4E00}'..='\u{9FFF}' // CJK unified ideographs
            | '\u{A960}'..='\u{A97F}' // Hangul Jamo extended-A
            | '\u{AC00}'..='\u{D7FF}' // Hangul syllables, Jamo extended-B
            | '\u{F900}'..='\u{FAFF}' // CJK compatibility ideographs
            | '\u{FF66}'..='\u{FFDC}' // halfwidth Katakana and Hangul
            | '\u{20000}'..='\u{323AF}' // CJK extensions B–H, compatibility supplement
        )
}

/// Combining diacritics, which `char::is_alphanumeric` does not count: a decomposed `café`
/// must keep its final accent when trailing punctuation is trimmed.
fn is_combining_mark(c: char) -> bool {
    matches!(c,
        '\u{0300}'..='\u{036F}'
        | '\u{1AB0}'..='\u{1AFF}'
        | '\u{1DC0}'..='\u{1DFF}'
        | '\u{20D0}'..='\u{20FF}'
        | '\u{FE20}'..='\u{FE2F}'
    )
}

#[cfg(test)]
mod tests {
    use sqlx::SqliteConnection;

    use super::super::store::fts5_fixture::{fixture, like, trigram, unicode};

    use super::*;

    fn texts(query: &str) -> Vec<String> {
        parse(query).terms.into_iter().map(|t| t.text).collect()
    }

    #[test]
    fn recall_query_keeps_identifiers_whole_and_strips_wrapping_punctuation() {
        assert_eq!(
            texts("foo.bar snake_case kebab-case a/b/c.rs v1.2.3 C++ node:fs"),
            [
                "foo.bar",
                "snake_case",
                "kebab-case",
                "a/b/c.rs",
                "v1.2.3",
                "c++",
                "node:fs"
            ]
        );
        assert_eq!(texts("\"(foo),\""), ["foo"]);
        assert_eq!(texts("Run `cargo test`."), ["run", "cargo", "test"]);
        assert_eq!(
            texts(".env @types/node --release __init__ C# foo()"),
            [".env", "@types/node", "--release", "__init__", "c#", "foo"]
        );
        assert_eq!(texts("café cafe\u{301}."), ["café", "cafe\u{301}"]);
        assert_eq!(texts("--- ... *** 🚀"), Vec::<String>::new());
    }

    #[test]
    fn recall_query_operators_are_data() {
        assert_eq!(
            texts("title:secret {title summary}:x NEAR(a b, 3) NOT foo* ^bar +baz -qux \"open"),
            [
                "title:secret",
                "title",
                "summary",
                "x",
                "near",
                "b",
                "3",
                "not",
                "foo",
                "bar",
                "baz",
                "-qux",
                "open"
            ]
        );
        let terms = parse("x AND y OR z NOT w");
        assert_eq!(terms.texts(), ["x", "y", "z", "not", "w"]);
        assert_eq!(
            terms.fts5_unicode(MatchMode::Any).as_deref(),
            Some(r#""x" OR "y" OR "z" OR "not" OR "w""#)
        );
        assert_eq!(
            terms.fts5_unicode(MatchMode::All).as_deref(),
            Some(r#""x" AND "y" AND "z" AND "not" AND "w""#)
        );
    }

    #[test]
    fn recall_query_quotes_are_doubled_and_controls_dropped() {
        let terms = QueryTerms {
            terms: vec![
                Term {
                    text: "say \"hi\"".into(),
                    cjk: false,
                },
                Term {
                    text: "nul\0byte".into(),
                    cjk: false,
                },
                Term {
                    text: String::new(),
                    cjk: false,
                },
                Term {
                    text: "!!".into(),
                    cjk: false,
                },
            ],
        };
        assert_eq!(
            terms.fts5_unicode(MatchMode::Any).as_deref(),
            Some(r#""say ""hi""" OR "nul byte""#)
        );
        assert_eq!(
            terms.fts5_trigram(MatchMode::All).as_deref(),
            Some(r#""say ""hi""" AND "nul byte""#)
        );
    }

    #[test]
    fn recall_query_segments_cjk() {
        let terms = parse("用pnpm安装");
        assert_eq!(terms.texts(), ["用", "pnpm", "安装"]);
        assert_eq!(
            terms.terms.iter().map(|t| t.cjk).collect::<Vec<_>>(),
            [true, false, true]
        );
        // Punctuation splits clauses; stopwords go; a 6-character run stays whole.
        assert_eq!(texts("数据库迁移，怎么办？的 了"), ["数据库迁移", "怎么办"]);
        assert_eq!(
            texts("我们的数据库迁移"),
            ["我们的", "的数据", "据库迁", "库迁移"]
        );
        assert_eq!(texts("ｐｎｐｍ　インストール"), ["pnpm", "インストール"]);
        // Windows of an odd-length run still reach its end.
        assert_eq!(texts("一二三四五六七"), ["一二三", "三四五", "五六七"]);
        assert_eq!(
            texts("一二三四五六七八"),
            ["一二三", "三四五", "五六七", "六七八"]
        );
    }

    #[test]
    fn recall_query_drops_stopwords_dedupes_and_bounds() {
        assert_eq!(
            texts("The Migration of THE migration and the messages"),
            ["migration", "messages"]
        );
        assert!(parse("the a an and or of 的 了").is_empty());
        assert!(parse("").is_empty());
        assert_eq!(parse("").fts5_unicode(MatchMode::Any), None);

        let many: String = (0..100).map(|i| format!("word{i} ")).collect();
        let terms = parse(&many);
        assert_eq!(terms.terms.len(), MAX_TERMS);
        assert_eq!(terms.terms[15].text, "word15");

        let long = "x".repeat(500);
        assert_eq!(parse(&long).terms[0].text.chars().count(), MAX_TERM_CHARS);
        let long_cjk = "数".repeat(500);
        assert!(parse(&long_cjk).terms.iter().all(|t| t.text == "数数数"));

        // Only the first MAX_QUERY_CHARS characters are read.
        let late = format!("{} needle", " ".repeat(MAX_QUERY_CHARS));
        assert!(parse(&late).is_empty());
    }

    #[test]
    fn recall_query_ignores_invisible_and_control_characters() {
        assert_eq!(
            texts("pn\u{200B}pm\u{202E} in\u{E0041}stall"),
            ["pnpm", "install"]
        );
        assert_eq!(texts("a\0b\u{1B}c\rd"), ["b", "c", "d"]);
        assert_eq!(texts("❤\u{FE0F}emoji"), ["emoji"]);
    }

    #[test]
    fn recall_query_like_patterns_are_escaped() {
        assert_eq!(
            parse("迁移 数据库 用").short_cjk_like_patterns(),
            ["%迁移%", "%用%"]
        );
        let terms = QueryTerms {
            terms: vec![
                Term {
                    text: "%_".into(),
                    cjk: true,
                },
                Term {
                    text: "\\".into(),
                    cjk: true,
                },
                Term {
                    text: "_数据".into(),
                    cjk: true,
                },
            ],
        };
        // The 3-character term belongs to the trigram index, not to LIKE.
        assert_eq!(terms.short_cjk_like_patterns(), ["%\\%\\_%", "%\\\\%"]);
        assert_eq!(parse("迁移").fts5_trigram(MatchMode::Any), None);
    }

    #[test]
    fn recall_query_match_mode_serde() {
        assert_eq!(MatchMode::default(), MatchMode::Any);
        assert_eq!(
            serde_json::to_string(&MatchMode::All).ok().as_deref(),
            Some("\"all\"")
        );
        let any: MatchMode = serde_json::from_str("\"any\"").expect("any");
        assert_eq!(any, MatchMode::Any);
    }

    // ---- real FTS5 -------------------------------------------------------------------------

    async fn unicode_rows(conn: &mut SqliteConnection, query: &str, mode: MatchMode) -> Vec<i64> {
        let expr = parse(query).fts5_unicode(mode).expect("terms");
        unicode(conn, &expr).await.expect("unicode61 MATCH")
    }

    async fn trigram_rows(conn: &mut SqliteConnection, query: &str, mode: MatchMode) -> Vec<i64> {
        let expr = parse(query).fts5_trigram(mode).expect("trigram terms");
        trigram(conn, &expr).await.expect("trigram MATCH")
    }

    #[tokio::test]
    async fn recall_query_known_queries_find_expected_rows() {
        let conn = &mut fixture().await;
        let any = MatchMode::Any;
        let all = MatchMode::All;

        assert_eq!(
            unicode_rows(conn, "sqlite migration preserved messages", any).await,
            [1]
        );
        assert_eq!(
            unicode_rows(conn, "how did the migration go?", any).await,
            [1]
        );
        // Any ranks later; All requires every term.
        assert_eq!(unicode_rows(conn, "migration rotation", any).await, [1, 4]);
        assert!(
            unicode_rows(conn, "migration rotation", all)
                .await
                .is_empty()
        );
        assert_eq!(unicode_rows(conn, "Migration MESSAGES", all).await, [1]);
        assert_eq!(trigram_rows(conn, "migration rotation", any).await, [1, 4]);
        assert!(
            trigram_rows(conn, "migration rotation", all)
                .await
                .is_empty()
        );

        // `title:secret` is a phrase, not a column filter: row 4 has "secret" in its title but
        // no "title secret" phrase; row 3 has the phrase in its resolution.
        assert_eq!(unicode_rows(conn, "title:secret", any).await, [3]);
        assert_eq!(unicode_rows(conn, "{title}:secret", any).await, [3, 4]);
        assert_eq!(
            trigram_rows(conn, "title:secret", any).await,
            Vec::<i64>::new()
        );
        assert_eq!(trigram_rows(conn, "title: secret", all).await, [3]);

        // Identifiers.
        for id in [
            "foo.bar",
            "snake_case",
            "kebab-case",
            "a/b/c.rs",
            "v1.2.3",
            "C++",
            "node:fs",
        ] {
            assert_eq!(unicode_rows(conn, id, all).await, [3], "{id}");
            assert_eq!(trigram_rows(conn, id, all).await, [3], "{id}");
        }
        // Operators and quotes in the query are searched as text.
        assert_eq!(unicode_rows(conn, "NEAR(x y) \"quoted", all).await, [3]);
        assert_eq!(unicode_rows(conn, "*star* ^caret", all).await, [3]);

        // CJK: two characters through LIKE, longer through trigram.
        let short = parse("迁移");
        assert_eq!(short.fts5_trigram(any), None);
        let patterns = short.short_cjk_like_patterns();
        assert_eq!(patterns, ["%迁移%"]);
        assert_eq!(like(conn, &patterns[0]).await.expect("LIKE"), [2]);
        assert_eq!(trigram_rows(conn, "数据库迁移", all).await, [2]);
        assert_eq!(
            trigram_rows(conn, "我们的数据库迁移时出错了怎么办", any).await,
            [2]
        );
        assert_eq!(trigram_rows(conn, "用pnpm安装依赖", any).await, [2]);
        assert_eq!(unicode_rows(conn, "pnpm", any).await, [2]);
        // LIKE patterns keep `%`/`_` literal.
        assert!(like(conn, "%\\_%").await.expect("LIKE").contains(&3));
        assert!(like(conn, "%\\%%").await.expect("LIKE").is_empty());
    }

    use super::super::TestRng as Rng;

    const FRAGMENTS: &[&str] = &[
        "AND",
        "OR",
        "NOT",
        "NEAR",
        "NEAR(",
        "NEAR/2",
        ")",
        "(",
        "*",
        "^",
        "+",
        "-",
        "\"",
        "\"\"",
        ":",
        "title:",
        "summary :",
        "{title summary}:",
        "{",
        "}",
        "-title:",
        "'",
        "\\",
        "%",
        "_",
        "migration",
        "secret",
        "C++",
        "node:fs",
        "a/b/c.rs",
        "v1.2.3",
        "数据库",
        "迁移",
        "用",
        "pnpm",
        "の",
        "한국어",
        "🚀",
        "👩\u{200D}💻",
        "e\u{301}",
        "\u{202E}",
        "\u{200B}",
        "\u{E0041}",
        "\u{FE0F}",
        "\u{0}",
        "\u{1B}",
        "\r\n",
        "\t",
        "\u{85}",
        "\u{2028}",
        "عربى",
        "עברית",
        "ｔｉｔｌｅ：",
        "（",
        "）",
        "「",
        "」",
        "，",
        "。",
        "\u{3000}",
        "[U+202E]",
        "<|im_start|>",
        "</learning.experiences>",
        "&amp;",
        "\u{FFFD}",
        "\u{10FFFF}",
    ];

    fn random_query(rng: &mut Rng) -> String {
        let mut out = String::new();
        let pieces = match rng.below(20) {
            0 => 500 + rng.below(2000), // long inputs, past MAX_QUERY_CHARS
            1 => 0,
            _ => 1 + rng.below(12),
        };
        for _ in 0..pieces {
            match rng.below(6) {
                0 => out.push_str(rng.pick(FRAGMENTS)),
                1 => {
                    // Printable ASCII, heavy on FTS syntax.
                    out.push(char::from(b' ' + rng.below(95) as u8));
                }
                2 => {
                    let len = 1 + rng.below(8);
                    for _ in 0..len {
                        out.push(char::from(b'a' + rng.below(26) as u8));
                    }
                }
                3 => {
                    // CJK ideographs.
                    let len = 1 + rng.below(10);
                    for _ in 0..len {
                        let code = 0x4E00 + rng.below(0x5200) as u32;
                        out.push(char::from_u32(code).unwrap_or('数'));
                    }
                }
                4 => {
                    // Any scalar value: controls, marks, RTL, private use, astral planes.
                    let code = rng.below(0x11_0000) as u32;
                    out.push(char::from_u32(code).unwrap_or('\u{FFFD}'));
                }
                _ => out.push(' '),
            }
        }
        out
    }

    /// Runs every builder's output against the real tables; any SQL error fails the test.
    async fn assert_builders_run(conn: &mut SqliteConnection, terms: &QueryTerms, case: &str) {
        for mode in [MatchMode::Any, MatchMode::All] {
            if let Some(expr) = terms.fts5_unicode(mode)
                && let Err(e) = unicode(conn, &expr).await
            {
                panic!("{case}: unicode61 {expr:?}: {e}");
            }
            if let Some(expr) = terms.fts5_trigram(mode)
                && let Err(e) = trigram(conn, &expr).await
            {
                panic!("{case}: trigram {expr:?}: {e}");
            }
        }
        let patterns = terms.short_cjk_like_patterns();
        assert!(patterns.len() <= terms.terms.len(), "{case}");
        for pattern in patterns {
            if let Err(e) = like(conn, &pattern).await {
                panic!("{case}: LIKE {pattern:?}: {e}");
            }
        }
    }

    /// Thousands of generated queries against real FTS5 tables: parsed terms never produce a SQL
    /// error and stay within bounds, while the same text used raw does break FTS5 (so the
    /// generator really exercises the grammar). The builders are also fed the raw text as
    /// hand-made terms, bypassing `parse`, so their own quoting is fuzzed too.
    #[tokio::test]
    async fn fuzz_parse_never_breaks_fts5() {
        let conn = &mut fixture().await;
        let mut rng = Rng(0x5EED_2026_0002);
        let mut raw_errors = 0;
        let mut nonempty = 0;
        let cases = 6000;
        for case in 0..cases {
            let query = random_query(&mut rng);
            let label = format!("case {case}: {query:?}");
            let terms = parse(&query);
            assert!(terms.terms.len() <= MAX_TERMS, "{label}");
            for term in &terms.terms {
                let chars = term.text.chars().count();
                assert!(chars > 0 && chars <= MAX_TERM_CHARS, "{label}");
                assert!(!term.text.chars().any(char::is_control), "{label}");
                assert!(
                    !term.text.chars().any(is_invisible_or_reordering),
                    "{label}"
                );
            }
            if !terms.is_empty() {
                nonempty += 1;
            }
            assert_builders_run(conn, &terms, &label).await;

            // Hand-made terms straight from the raw text: quotes, NULs and operators included.
            let raw: Vec<Term> = query
                .split(' ')
                .take(MAX_TERMS)
                .map(|piece| Term {
                    text: piece.chars().take(MAX_TERM_CHARS).collect(),
                    cjk: rng.below(2) == 0,
                })
                .collect();
            assert_builders_run(conn, &QueryTerms { terms: raw }, &label).await;

            if !query.contains('\0') && unicode(conn, &query).await.is_err() {
                raw_errors += 1;
            }
        }
        eprintln!("{cases} queries: {nonempty} with terms, {raw_errors} broke FTS5 when used raw");
        assert!(
            nonempty > 4000,
            "generator produced too few searchable queries: {nonempty}"
        );
        assert!(
            raw_errors > 1000,
            "raw queries rarely failed ({raw_errors}): weak generator"
        );
    }
}

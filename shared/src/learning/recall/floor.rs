//! The relevance floor of automatic recall: an experience rides along with a prompt only when
//! it shares something meaningful with it, so one generic item is not injected into every
//! unrelated prompt of a project.
//!
//! Full-text ranking is relative (the best match of a query scores 1 whatever it shares), so the
//! floor is absolute and counted in words. Each distinct prompt term scores:
//! - 1 when the experience's own text (title, summary, resolution) or its retrieval keywords
//!   (the situation the lesson applies to) contain it; keywords are chosen for retrieval, so
//!   they count like the lesson's words,
//! - nothing for generic words that every coding prompt has ("add", "fix", "file", 问题, 修改)
//!   and for stop words,
//!
//! English words are compared by stem ("tests" meets "test"); identifiers (with digits or
//! `._-/:`) count fully wherever they match. Chinese text has no spaces, so beside the query's
//! CJK terms, the prompt's character bigrams count: two shared bigrams are worth one word. An
//! experience needs a score of at least [`FLOOR`].

use std::collections::HashSet;

use super::search_terms;
use crate::text::stem::stem;

/// The score an experience needs to be recalled automatically.
pub const FLOOR: f64 = 1.0;
const KEYWORD_ONLY: f64 = 1.0;
const BIGRAM: f64 = 0.5;
/// Bigrams a prompt contributes to the candidate search.
pub const MAX_BIGRAMS: usize = 12;

/// Generic words of coding prompts: they may rank, but never carry a match alone.
const GENERIC_WORDS: &[&str] = &[
    "add", "use", "make", "fix", "change", "update", "create", "remove", "delete", "run", "get",
    "set", "new", "file", "code", "help", "want", "need", "like", "now", "still", "issue",
    "problem", "error", "work", "thing", "way", "one", "all", "look", "check", "write", "show",
    "try", "again", "project", "app", "function", "method", "value", "data", "line", "bug", "also",
    "don't", "doesn't", "isn't", "can't", "instead", "not", "never", "always", "only", "more",
    "less", "some", "same", "other", "thank", "thanks", "ok", "okay", "yes", "let", "let's", "go",
    "do", "done", "sure", "good", "right", "wrong", "just", "there", "here", "missing", "put",
    "take", "give", "keep", "call", "start", "stop", "well", "first", "last", "next", "before",
    "after", "every", "each", "any", "much", "many", "lot", "bit", "part",
];
const GENERIC_CJK: &[&str] = &[
    "一下",
    "帮我",
    "看看",
    "需要",
    "可以",
    "问题",
    "修改",
    "添加",
    "文件",
    "代码",
    "这里",
    "那里",
    "现在",
    "一个",
    "功能",
    "怎么",
    "什么",
    "为什么",
    "不要",
    "应该",
    "一定",
    "以后",
    "每次",
];

/// Chinese particles and pronouns: a bigram with one of them is grammar, not a word.
const PARTICLES: &str = "的了是在和与及或我你他她它们这那就也都吗呢吧啊把被着个给请要有";

/// The prompt side of the floor, computed once per prompt.
#[derive(Debug, Clone, Default)]
pub struct Floor {
    /// Stemmed English words and whole identifiers of the prompt (generic words excluded).
    words: Vec<Word>,
    /// CJK query terms of the prompt.
    cjk_terms: Vec<String>,
    /// CJK character bigrams of the prompt.
    bigrams: Vec<String>,
    /// The first two bytes of every part in `words`: a stem keeps its word's first two bytes,
    /// so a text word starting otherwise cannot meet any part and is not stemmed.
    prefixes: HashSet<[u8; 2]>,
}

#[derive(Debug, Clone)]
struct Word {
    /// The stems of its parts (`test:unit` → `test`, `unit`).
    parts: Vec<String>,
    identifier: bool,
}

impl Floor {
    pub fn of(prompt: &str) -> Floor {
        let mut floor = Floor::default();
        for term in search_terms::parse(prompt).terms {
            if term.cjk {
                if !GENERIC_CJK.contains(&term.text.as_str()) {
                    floor.cjk_terms.push(term.text);
                }
                continue;
            }
            if GENERIC_WORDS.contains(&term.text.as_str()) {
                continue;
            }
            let identifier = term
                .text
                .chars()
                .any(|c| c.is_ascii_digit() || "._-/:@#".contains(c));
            let parts: Vec<String> = words_of(&term.text).into_iter().collect();
            if !parts.is_empty() {
                floor.words.push(Word { parts, identifier });
            }
        }
        floor.prefixes = floor
            .words
            .iter()
            .flat_map(|word| &word.parts)
            .filter_map(|part| part.as_bytes().first_chunk::<2>().copied())
            .collect();
        let mut seen = HashSet::new();
        for run in cjk_runs(prompt) {
            let chars: Vec<char> = run.chars().collect();
            for pair in chars.windows(2) {
                let bigram: String = pair.iter().collect();
                let particle = pair.iter().any(|c| PARTICLES.contains(*c));
                if !particle
                    && !GENERIC_CJK.contains(&bigram.as_str())
                    && seen.insert(bigram.clone())
                {
                    floor.bigrams.push(bigram);
                }
            }
        }
        floor
    }

    /// The prompt's CJK character bigrams (generic ones left out), at most [`MAX_BIGRAMS`].
    pub fn bigrams(&self) -> &[String] {
        &self.bigrams[..self.bigrams.len().min(MAX_BIGRAMS)]
    }

    /// The score of an experience whose own text is `text` and retrieval keywords `keywords`.
    pub fn score(&self, text: &str, keywords: &str) -> f64 {
        let own_words = self.words_in(text);
        let keyword_words = self.words_in(keywords);
        let mut score = 0.0;
        for word in &self.words {
            let within = |set: &HashSet<String>| word.parts.iter().all(|p| set.contains(p));
            if within(&own_words) {
                score += 1.0;
            } else if within(&keyword_words) {
                score += if word.identifier { 1.0 } else { KEYWORD_ONLY };
            }
        }
        if self.cjk_terms.is_empty() && self.bigrams.is_empty() {
            return score;
        }
        let (own_lower, keywords_lower) = (text.to_lowercase(), keywords.to_lowercase());
        for term in &self.cjk_terms {
            if own_lower.contains(term.as_str()) {
                score += 1.0;
            } else if keywords_lower.contains(term.as_str()) {
                score += KEYWORD_ONLY;
            }
        }
        let shared = self
            .bigrams
            .iter()
            .filter(|bigram| {
                own_lower.contains(bigram.as_str()) || keywords_lower.contains(bigram.as_str())
            })
            .count();
        score + BIGRAM * shared as f64
    }

    /// The stemmed words of `text` that can be parts of the prompt's words: [`words_of`]
    /// without the words no part starts like (the score reads only the prompt's parts) and
    /// without generic words.
    fn words_in(&self, text: &str) -> HashSet<String> {
        text.split(|c: char| !c.is_alphanumeric() || !c.is_ascii())
            .filter(|w| w.len() >= 2)
            // The prefix test first: it is one hash lookup and leaves out most words of a
            // lesson, so the generic-word scan below runs for few of them (`context` scores
            // every candidate's text this way).
            .filter(|w| {
                let [a, b] = [w.as_bytes()[0], w.as_bytes()[1]];
                self.prefixes
                    .contains(&[a.to_ascii_lowercase(), b.to_ascii_lowercase()])
            })
            // A generic word of the lesson never carries a match either: the prompt's generic
            // words are already left out, so it could only meet a word whose stem collides
            // with it ("note" and "not" share the stem `not`).
            .filter(|w| !GENERIC_WORDS.iter().any(|g| g.eq_ignore_ascii_case(w)))
            .map(|w| stem(&w.to_lowercase()))
            .collect()
    }

    /// Whether an experience passes the floor.
    pub fn admits(&self, text: &str, keywords: &str) -> bool {
        self.score(text, keywords) >= FLOOR
    }
}

/// Stemmed lower-case ASCII words of `text` (split on everything that is not a letter or digit,
/// as the full-text index splits them).
fn words_of(text: &str) -> HashSet<String> {
    text.split(|c: char| !c.is_alphanumeric() || !c.is_ascii())
        .filter(|w| w.len() >= 2)
        .map(|w| stem(&w.to_lowercase()))
        .collect()
}

/// Runs of CJK characters in `text`.
fn cjk_runs(text: &str) -> Vec<String> {
    let mut runs = Vec::new();
    let mut current = String::new();
    for c in text.chars() {
        if matches!(c as u32, 0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xF900..=0xFAFF) {
            current.push(c);
        } else if !current.is_empty() {
            runs.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        runs.push(current);
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_whose_stem_is_a_generic_word_meets_only_its_own_inflections() {
        let floor = Floor::of("the note editor loses the cursor on paste");
        assert!(!floor.admits("Use fly secrets, not a .env file.", "fly\nsecrets"));
        assert!(floor.admits("Keep the notes list sorted by title.", ""));
        assert!(floor.admits("Keep the list sorted.", "note"));
    }

    #[test]
    fn a_stem_keeps_the_first_two_bytes_of_its_word() {
        // What `words_in`'s prefix filter relies on, over every word shape the stemmer edits.
        for word in [
            "flies",
            "classes",
            "uses",
            "using",
            "used",
            "committing",
            "commits",
            "runner",
            "tested",
            "stopped",
            "make",
            "ie",
            "ies",
            "ed",
            "eds",
            "sing",
            "sings",
            "xxing",
            "bees",
            "added",
            "ees",
            "ss",
            "is",
            "us",
            "ing",
            "bed",
            "needed",
        ] {
            let stemmed = stem(word);
            assert!(stemmed.len() >= 2, "{word} -> {stemmed}");
            assert_eq!(
                &stemmed.as_bytes()[..2],
                &word.as_bytes()[..2],
                "{word} -> {stemmed}"
            );
        }
    }

    #[test]
    fn the_prefix_filter_changes_no_score() {
        let texts = [
            ("Use uv, not pip, because the lockfile is uv.lock.", ""),
            ("Run the tests with cargo nextest.", "testing\nnextest"),
            ("日期统一用 dayjs 格式化,不要用 moment。", "dayjs"),
            (
                "Install packages with pnpm; CI uses pnpm too.",
                "pnpm\ninstall",
            ),
            (
                "Flies and classes: the runner stopped committing.",
                "commits",
            ),
        ];
        for prompt in [
            "install httpx with pip",
            "run the tests again",
            "用 dayjs 显示时间",
            "why do the installed packages fail? uses pnpm",
            "the runners stop, commit again, flies",
        ] {
            let floor = Floor::of(prompt);
            for (text, keywords) in texts {
                let reference = {
                    let mut unfiltered = floor.clone();
                    unfiltered.prefixes = floor
                        .words
                        .iter()
                        .flat_map(|w| &w.parts)
                        .chain(words_of(text).iter())
                        .chain(words_of(keywords).iter())
                        .filter_map(|p| p.as_bytes().first_chunk::<2>().copied())
                        .collect();
                    unfiltered.score(text, keywords)
                };
                assert_eq!(floor.score(text, keywords), reference, "{prompt} / {text}");
            }
        }
    }

    #[test]
    fn one_specific_word_of_the_lesson_is_enough_one_generic_word_is_not() {
        let lesson = "Use uv, not pip, because the lockfile is uv.lock.";
        assert!(Floor::of("install httpx with pip").admits(lesson, ""));
        assert!(
            !Floor::of("fix the missing file")
                .admits("Run make check before you say a file is done.", "")
        );
        assert!(Floor::of("run the tests").admits("Run the tests with cargo nextest.", ""));
    }

    #[test]
    fn keywords_count_like_the_lesson_and_identifiers_fully() {
        let lesson = "Use yarn instead of npm.";
        assert!(Floor::of("install the dashboard deps").admits(lesson, "dashboard\ninstall"));
        assert!(!Floor::of("fix the crash at night").admits(lesson, "dashboard\ninstall"));
        assert!(Floor::of("rerun scripts/ingest.py").admits("Use python3.", "scripts/ingest.py"));
    }

    #[test]
    fn chinese_prompts_meet_chinese_lessons_by_terms_and_bigrams() {
        let lesson = "日期统一用 dayjs 格式化,格式是 YYYY-MM-DD HH:mm,不要用 moment。";
        assert!(Floor::of("订单列表的日期格式化一下").admits(lesson, ""));
        assert!(Floor::of("用 dayjs 显示时间").admits(lesson, ""));
        assert!(!Floor::of("帮我看看这个问题").admits(lesson, ""));
    }
}

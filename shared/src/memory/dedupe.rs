//! Whether two Memory entries state the same rule in other words.
//!
//! Resident Memory is small and rides in every prompt, so one rule written twice ("Use pnpm, not
//! npm." and "use pnpm instead of npm") costs twice and crowds out a third rule. [`same_rule`]
//! decides whether two entries are one rule; the consolidation at the cap merges such pairs, and
//! maintenance planning can turn a repeated rule into support for the existing entry instead of
//! a new one.
//!
//! It is deliberately conservative: merging two different rules loses one of them, keeping a
//! duplicate only costs characters. Two texts are the same rule when, after normalisation, they
//! say the same content words with the same polarity:
//!
//! 1. Normalise: NFKC (full-width letters and punctuation become ASCII), curly quotes become
//!    straight ones, lowercase.
//! 2. Split into English words and runs of CJK characters. Clause punctuation (`.;:!?`, `。；：！？`,
//!    a line break) ends a clause; a comma ends one only when a new instruction follows it
//!    ("Don't use npm, use pnpm"), so a list stays together ("Don't use npm, yarn or bun").
//! 3. Polarity: a negation or contrast marker ("not", "never", "don't", "avoid", "stop",
//!    "instead of", "rather than", "over"; 不要, 别, 不用, 而不是, 禁止, 避免 …) makes the rest of
//!    its clause the rejected side; "but", 而是, 但是 and a switch such as 改用 return to the
//!    preferred side. "Use pnpm, not npm" and "use pnpm instead of npm" both prefer `pnpm` and
//!    reject `npm`; "Use pnpm." and "Never use pnpm." differ.
//! 4. Drop what does not change the rule: stop words in English and Chinese (articles,
//!    particles, "always", 以后, 都, 一定 …) and light verbs that only introduce the object
//!    ("use", "prefer", 用, 使用). English words are reduced to a crude stem (`committing`,
//!    `commits` and `commit` are one word); numbers and identifiers stay exact.
//! 5. Compare: the preferred and rejected English words must be equal sets; CJK text is
//!    compared by characters (equal sets on each side) and by character bigrams (at least half
//!    shared), so word order that changes the meaning (先测试后提交 / 先提交后测试) still differs.

use std::collections::BTreeSet;

use unicode_normalization::UnicodeNormalization;

use crate::text::stem::stem;

/// Whether `a` and `b` state the same rule in other words (see the module documentation).
pub fn same_rule(a: &str, b: &str) -> bool {
    RuleSignature::of(a).same_rule_as(&RuleSignature::of(b))
}

/// The text as compared: NFKC, straight quotes, lowercase, single spaces, without trailing
/// sentence punctuation.
pub fn normalize(text: &str) -> String {
    let folded = fold(text);
    folded
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .trim_end_matches([
            '.', '!', '?', ';', ',', ':', '。', '！', '？', '；', '，', '：',
        ])
        .trim()
        .to_owned()
}

/// What [`same_rule`] compares, computed once per text so a document's entries can be compared
/// pairwise without normalising each one again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleSignature {
    normalized: String,
    /// English words (stems), numbers and identifiers, per side.
    words: [BTreeSet<String>; 2],
    /// CJK content characters, per side.
    chars: [BTreeSet<char>; 2],
    /// Adjacent CJK content characters, tagged with their side.
    bigrams: BTreeSet<(Side, char, char)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Side {
    Preferred = 0,
    Rejected = 1,
}

impl RuleSignature {
    pub fn of(text: &str) -> RuleSignature {
        let mut builder = Builder::default();
        builder.signature.normalized = normalize(text);
        builder.read(&fold(text));
        builder.signature
    }

    /// True when nothing in the text carries a rule (only stop words, markers or punctuation).
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(BTreeSet::is_empty) && self.chars.iter().all(BTreeSet::is_empty)
    }

    pub fn same_rule_as(&self, other: &RuleSignature) -> bool {
        if self.normalized.is_empty() || other.normalized.is_empty() {
            return false;
        }
        if self.normalized == other.normalized {
            return true;
        }
        if self.is_empty() || other.is_empty() {
            return false;
        }
        if self.words != other.words || self.chars != other.chars {
            return false;
        }
        if self.bigrams.is_empty() && other.bigrams.is_empty() {
            return true;
        }
        let shared = self.bigrams.intersection(&other.bigrams).count();
        let all = self.bigrams.union(&other.bigrams).count();
        shared * 2 >= all
    }
}

/// NFKC, straight quotes and dashes, lowercase.
fn fold(text: &str) -> String {
    text.nfkc()
        .map(|c| match c {
            '\u{2018}' | '\u{2019}' | '\u{201A}' | '\u{201B}' | '\u{2032}' | '\u{FF07}' => '\'',
            '\u{201C}' | '\u{201D}' | '\u{201E}' | '\u{201F}' | '\u{2033}' => '"',
            '\u{2010}'..='\u{2015}' | '\u{2212}' => '-',
            other => other,
        })
        .flat_map(char::to_lowercase)
        .collect()
}

fn is_cjk(c: char) -> bool {
    matches!(c,
        '\u{3040}'..='\u{30FF}'   // kana
        | '\u{3400}'..='\u{4DBF}' // Han extension A
        | '\u{4E00}'..='\u{9FFF}' // Han
        | '\u{AC00}'..='\u{D7AF}' // Hangul
        | '\u{F900}'..='\u{FAFF}' // Han compatibility
        | '\u{20000}'..='\u{2FA1F}')
}

/// Punctuation that ends a clause outright.
fn ends_clause(c: char) -> bool {
    matches!(
        c,
        '.' | ';' | ':' | '!' | '?' | '\n' | '。' | '；' | '：' | '！' | '？' | '…'
    )
}

/// English words that carry no rule of their own.
const ENGLISH_STOPWORDS: &[&str] = &[
    "a",
    "an",
    "the",
    "to",
    "of",
    "for",
    "in",
    "on",
    "at",
    "by",
    "with",
    "and",
    "or",
    "is",
    "are",
    "was",
    "were",
    "be",
    "been",
    "being",
    "am",
    "this",
    "that",
    "these",
    "those",
    "it",
    "its",
    "we",
    "you",
    "your",
    "i",
    "me",
    "my",
    "our",
    "us",
    "please",
    "always",
    "every",
    "each",
    "all",
    "any",
    "here",
    "there",
    "now",
    "from",
    "just",
    "also",
    "only",
    "really",
    "should",
    "must",
    "need",
    "needs",
    "make",
    "sure",
    "do",
    "does",
    "did",
    "so",
    "then",
    "when",
    "whenever",
    "than",
    "as",
    "into",
    "onto",
    "let's",
    "lets",
    "ok",
    "okay",
    "remember",
    "going",
    "forward",
    "henceforth",
    "longer",
    "anymore",
    "again",
    "will",
    "would",
    "can",
    "could",
    "may",
    "might",
    "shall",
    "yes",
    "actually",
];

/// Words that only introduce the object ("use pnpm", "prefer tabs"), compared by stem.
const LIGHT_VERB_STEMS: &[&str] = &["us", "prefer", "utiliz", "employ", "choos", "pick"];

/// Words that make the rest of their clause the rejected side.
const ENGLISH_NEGATIONS: &[&str] = &[
    "not", "never", "no", "dont", "avoid", "stop", "without", "nor", "cannot", "instead", "rather",
    "over", "neither",
];

/// Words after a comma that start a new instruction (ending a rejected clause).
const ENGLISH_CLAUSE_STARTS: &[&str] = &["use", "prefer", "always", "please", "but", "instead"];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Cjk {
    /// The rest of the clause is rejected.
    Negation,
    /// Back to the preferred side (而是, 但是, 改用).
    Turn,
    /// Carries no rule (particles, emphasis, light verbs).
    Stop,
    /// A word that contains a marker or a stop character but is content (不同, 用户).
    Keep,
}

/// CJK words, matched longest first. A word here wins over any shorter word it contains.
const CJK_WORDS: &[(&str, Cjk)] = &[
    ("而不是", Cjk::Negation),
    ("千万别", Cjk::Negation),
    ("千万不要", Cjk::Negation),
    ("不要", Cjk::Negation),
    ("不用", Cjk::Negation),
    ("不能", Cjk::Negation),
    ("不得", Cjk::Negation),
    ("不准", Cjk::Negation),
    ("不许", Cjk::Negation),
    ("不可", Cjk::Negation),
    ("不必", Cjk::Negation),
    ("不是", Cjk::Negation),
    ("无需", Cjk::Negation),
    ("而非", Cjk::Negation),
    ("并非", Cjk::Negation),
    ("禁止", Cjk::Negation),
    ("避免", Cjk::Negation),
    ("切勿", Cjk::Negation),
    ("别再", Cjk::Negation),
    ("没有", Cjk::Negation),
    ("别", Cjk::Negation),
    ("勿", Cjk::Negation),
    ("没", Cjk::Negation),
    ("不", Cjk::Negation),
    ("而是", Cjk::Turn),
    ("但是", Cjk::Turn),
    ("可是", Cjk::Turn),
    ("改用", Cjk::Turn),
    ("换用", Cjk::Turn),
    ("改成", Cjk::Turn),
    ("换成", Cjk::Turn),
    ("改为", Cjk::Turn),
    ("但", Cjk::Turn),
    ("以后", Cjk::Stop),
    ("今后", Cjk::Stop),
    ("往后", Cjk::Stop),
    ("每次", Cjk::Stop),
    ("总是", Cjk::Stop),
    ("始终", Cjk::Stop),
    ("一直", Cjk::Stop),
    ("一定", Cjk::Stop),
    ("务必", Cjk::Stop),
    ("必须", Cjk::Stop),
    ("应该", Cjk::Stop),
    ("应当", Cjk::Stop),
    ("需要", Cjk::Stop),
    ("记住", Cjk::Stop),
    ("记得", Cjk::Stop),
    ("统一", Cjk::Stop),
    ("我们", Cjk::Stop),
    ("你们", Cjk::Stop),
    ("这个", Cjk::Stop),
    ("那个", Cjk::Stop),
    ("这里", Cjk::Stop),
    ("时候", Cjk::Stop),
    ("使用", Cjk::Stop),
    ("采用", Cjk::Stop),
    ("请", Cjk::Stop),
    ("的", Cjk::Stop),
    ("了", Cjk::Stop),
    ("都", Cjk::Stop),
    ("也", Cjk::Stop),
    ("就", Cjk::Stop),
    ("把", Cjk::Stop),
    ("被", Cjk::Stop),
    ("吧", Cjk::Stop),
    ("呢", Cjk::Stop),
    ("啊", Cjk::Stop),
    ("吗", Cjk::Stop),
    ("呀", Cjk::Stop),
    ("嘛", Cjk::Stop),
    ("要", Cjk::Stop),
    ("你", Cjk::Stop),
    ("您", Cjk::Stop),
    ("我", Cjk::Stop),
    ("在", Cjk::Stop),
    ("之", Cjk::Stop),
    ("和", Cjk::Stop),
    ("与", Cjk::Stop),
    ("及", Cjk::Stop),
    ("并", Cjk::Stop),
    ("用", Cjk::Stop),
    ("用户", Cjk::Keep),
    ("作用", Cjk::Keep),
    ("费用", Cjk::Keep),
    ("要求", Cjk::Keep),
    ("重要", Cjk::Keep),
    ("主要", Cjk::Keep),
    ("不同", Cjk::Keep),
    ("不错", Cjk::Keep),
    ("不断", Cjk::Keep),
    ("不足", Cjk::Keep),
    ("不仅", Cjk::Keep),
    ("不管", Cjk::Keep),
    ("不过", Cjk::Keep),
    ("记录", Cjk::Keep),
    ("和谐", Cjk::Keep),
    ("现在", Cjk::Keep),
    ("存在", Cjk::Keep),
    ("正在", Cjk::Keep),
    ("目的", Cjk::Keep),
    ("了解", Cjk::Keep),
    ("都市", Cjk::Keep),
    ("也许", Cjk::Keep),
    ("成就", Cjk::Keep),
    ("把握", Cjk::Keep),
];

/// The longest CJK word at the start of `text`, with its length in characters.
fn cjk_word(text: &[char]) -> Option<(Cjk, usize)> {
    CJK_WORDS
        .iter()
        .filter_map(|(word, kind)| {
            let length = word.chars().count();
            (text.len() >= length && text[..length].iter().copied().eq(word.chars()))
                .then_some((*kind, length))
        })
        .max_by_key(|(_, length)| *length)
}

/// CJK words after a comma that start a new instruction.
fn cjk_starts_instruction(text: &[char]) -> bool {
    match cjk_word(text) {
        Some((Cjk::Negation | Cjk::Turn, _)) => true,
        Some((Cjk::Stop, length)) => {
            let word: String = text[..length].iter().collect();
            matches!(
                word.as_str(),
                "用" | "使用"
                    | "采用"
                    | "以后"
                    | "今后"
                    | "统一"
                    | "总是"
                    | "一定"
                    | "请"
                    | "记住"
            )
        }
        _ => false,
    }
}

#[derive(Default)]
struct Builder {
    signature: RuleSignature,
    side: Option<Side>,
    /// The previous CJK content character on the current side, for bigrams.
    previous: Option<char>,
}

impl Builder {
    fn side(&self) -> Side {
        self.side.unwrap_or(Side::Preferred)
    }

    fn end_clause(&mut self) {
        self.side = None;
        self.previous = None;
    }

    fn switch(&mut self, side: Side) {
        self.side = Some(side);
        self.previous = None;
    }

    fn read(&mut self, text: &str) {
        let chars: Vec<char> = text.chars().collect();
        let mut index = 0;
        while index < chars.len() {
            let c = chars[index];
            if is_cjk(c) {
                index = self.read_cjk(&chars, index);
            } else if c.is_alphanumeric() {
                let start = index;
                while index < chars.len()
                    && (chars[index].is_alphanumeric() && !is_cjk(chars[index])
                        || chars[index] == '\''
                            && chars.get(index + 1).is_some_and(|n| n.is_alphanumeric()))
                {
                    index += 1;
                }
                let word: String = chars[start..index].iter().collect();
                self.word(&word);
            } else {
                if ends_clause(c) {
                    // `v1.2` and `package.json` are one identifier, not two clauses.
                    let inside_word = c == '.'
                        && index > 0
                        && chars[index - 1].is_alphanumeric()
                        && chars.get(index + 1).is_some_and(|n| n.is_alphanumeric());
                    if !inside_word {
                        self.end_clause();
                    }
                } else if matches!(c, ',' | '，') {
                    self.comma(&chars[index + 1..]);
                } else {
                    self.previous = None;
                }
                index += 1;
            }
        }
    }

    /// A comma ends a rejected clause only when a new instruction follows.
    fn comma(&mut self, rest: &[char]) {
        self.previous = None;
        let rest: Vec<char> = rest
            .iter()
            .copied()
            .skip_while(|c| c.is_whitespace())
            .collect();
        let starts = if rest.first().is_some_and(|c| is_cjk(*c)) {
            cjk_starts_instruction(&rest)
        } else {
            let word: String = rest
                .iter()
                .take_while(|c| c.is_alphanumeric() || **c == '\'')
                .collect();
            ENGLISH_CLAUSE_STARTS.contains(&word.as_str())
                || ENGLISH_NEGATIONS.contains(&word.as_str())
                || word.contains("n't")
        };
        if starts {
            self.end_clause();
        }
    }

    fn word(&mut self, word: &str) {
        self.previous = None;
        let word = word.strip_suffix("'s").unwrap_or(word);
        if word == "but" {
            self.switch(Side::Preferred);
            return;
        }
        if ENGLISH_NEGATIONS.contains(&word) || word.contains("n't") {
            self.switch(Side::Rejected);
            return;
        }
        if ENGLISH_STOPWORDS.contains(&word) {
            return;
        }
        let stem = stem(word);
        if LIGHT_VERB_STEMS.contains(&stem.as_str()) {
            return;
        }
        let side = self.side() as usize;
        self.signature.words[side].insert(stem);
    }

    /// Reads CJK characters from `start`; returns the index after them.
    fn read_cjk(&mut self, chars: &[char], start: usize) -> usize {
        let mut index = start;
        while index < chars.len() && is_cjk(chars[index]) {
            match cjk_word(&chars[index..]) {
                Some((Cjk::Negation, length)) => {
                    self.switch(Side::Rejected);
                    index += length;
                }
                Some((Cjk::Turn, length)) => {
                    self.switch(Side::Preferred);
                    index += length;
                }
                // Particles are skipped without breaking the run: 提交的代码 reads as 提交代码.
                Some((Cjk::Stop, length)) => index += length,
                Some((Cjk::Keep, length)) => {
                    for offset in 0..length {
                        self.cjk_char(chars[index + offset]);
                    }
                    index += length;
                }
                None => {
                    self.cjk_char(chars[index]);
                    index += 1;
                }
            }
        }
        self.previous = None;
        index
    }

    fn cjk_char(&mut self, c: char) {
        let side = self.side();
        self.signature.chars[side as usize].insert(c);
        if let Some(previous) = self.previous {
            self.signature.bigrams.insert((side, previous, c));
        }
        self.previous = Some(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pairs a person would call the same rule.
    const SAME: &[(&str, &str)] = &[
        ("Use pnpm, not npm.", "use pnpm instead of npm"),
        ("Use pnpm, not npm.", "Never use npm; use pnpm."),
        ("Use pnpm, not npm.", "Don't use npm, use pnpm"),
        ("Use pnpm, not npm.", "Instead of npm, use pnpm."),
        ("Use pnpm, not npm.", "ＵＳＥ ＰＮＰＭ，ＮＯＴ ＮＰＭ！"),
        ("Use pnpm rather than npm", "use pnpm, not npm"),
        (
            "Always run cargo fmt before committing.",
            "Run `cargo fmt` before every commit",
        ),
        ("Don’t push to main.", "Do not push to main"),
        ("Don’t push to main.", "Never push to main!"),
        ("Stop using npm.", "Never use npm."),
        ("Avoid npm", "Don't use npm."),
        ("Prefer tabs over spaces.", "Use tabs, not spaces."),
        ("Run tests with nextest", "Use nextest to run tests."),
        (
            "From now on, always answer in English.",
            "Answer in English",
        ),
        ("  Use   PNPM.  ", "use pnpm"),
        ("以后都用中文回答。", "用中文回答"),
        ("用 pnpm，不要用 npm", "使用pnpm而不是npm"),
        ("用pnpm，别用npm。", "统一用 pnpm，不用 npm"),
        ("不要直接推送到ｍａｉｎ分支！", "别直接推送到 main 分支"),
        ("提交前运行 cargo fmt", "提交之前要运行cargo fmt"),
        ("记住：每次提交前都要跑测试", "提交前跑测试"),
        ("不要用npm，改用pnpm", "用pnpm，不要用npm"),
        ("“不要”修改生成的文件", "不要修改生成的文件。"),
    ];

    /// Pairs that differ in what they ask for.
    const DIFFERENT: &[(&str, &str)] = &[
        ("Use pnpm.", "Never use pnpm."),
        ("Use pnpm.", "Don't use pnpm"),
        (
            "Run cargo fmt before committing",
            "Run clippy before committing",
        ),
        ("Use pnpm, not npm.", "Use npm, not pnpm."),
        ("Use pnpm.", "Use pnpm in CI."),
        ("Use pnpm.", "Use yarn."),
        (
            "Keep lines under 100 characters.",
            "Keep lines under 120 characters.",
        ),
        ("Run tests before pushing", "Run tests after pushing"),
        ("Don't use npm, yarn or bun.", "Use yarn, not npm."),
        (
            "Install packages with pnpm",
            "Use pnpm for lockfile updates",
        ),
        ("用中文回答", "不要用中文回答"),
        ("以后都用中文回答", "以后都用英文回答"),
        ("先测试后提交", "先提交后测试"),
        ("用 pnpm", "用 yarn"),
        ("不要在 main 分支上直接提交", "在 main 分支上直接提交"),
        ("提交前运行 cargo fmt", "提交前运行 cargo clippy"),
        ("代码注释用英文", "代码注释用中文"),
        ("Use pnpm.", "用 pnpm 跑测试"),
        ("OK.", "Yes."),
    ];

    #[test]
    fn the_same_rule_in_other_words_is_one_rule() {
        for (a, b) in SAME {
            assert!(same_rule(a, b), "{a:?} and {b:?} should be the same rule");
            assert!(same_rule(b, a), "{b:?} and {a:?} should be the same rule");
        }
    }

    #[test]
    fn different_rules_stay_apart_and_negation_matters() {
        for (a, b) in DIFFERENT {
            assert!(!same_rule(a, b), "{a:?} and {b:?} should differ");
            assert!(!same_rule(b, a), "{b:?} and {a:?} should differ");
        }
    }

    #[test]
    fn a_rule_is_the_same_as_itself_and_empty_text_is_no_rule() {
        for (a, _) in SAME.iter().chain(DIFFERENT) {
            assert!(same_rule(a, a), "{a:?}");
        }
        assert!(!same_rule("", ""));
        assert!(!same_rule("   ", "。"));
    }

    #[test]
    fn normalisation_folds_width_quotes_case_and_spacing() {
        assert_eq!(normalize("  ＵＳＥ   “pnpm”！ "), "use \"pnpm\"");
        assert_eq!(normalize("Don’t push."), "don't push");
        assert_eq!(normalize("用 pnpm。"), "用 pnpm");
    }

    #[test]
    fn stems_meet_across_inflections_and_identifiers_stay_exact() {
        for (a, b) in [
            ("use", "using"),
            ("uses", "used"),
            ("committing", "commit"),
            ("commits", "commit"),
            ("running", "run"),
            ("libraries", "library"),
            ("classes", "class"),
            ("tests", "testing"),
        ] {
            assert_eq!(stem(a), stem(b), "{a} / {b}");
        }
        assert_eq!(stem("v1_2s"), "v1_2s");
        assert_ne!(stem("pnpm"), stem("npm"));
    }
}

//! The signal lexicon: cheap, deterministic detection of the user feedback actions worth
//! learning from, in English and Chinese. Rules decide *whether* a passage carries signal; they
//! never interpret it.
//!
//! Strong: explicit correction, redo/rejection, stated preference. Medium: confusion, changed
//! intent. Weak: praise, used only as a confidence signal. Matching takes the strongest level
//! that hits.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Strength {
    Weak,
    Medium,
    Strong,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SignalKind {
    Correction,
    Rejection,
    Preference,
    Confusion,
    IntentChange,
    Praise,
}

impl SignalKind {
    pub fn strength(self) -> Strength {
        match self {
            SignalKind::Correction | SignalKind::Rejection | SignalKind::Preference => {
                Strength::Strong
            }
            SignalKind::Confusion | SignalKind::IntentChange => Strength::Medium,
            SignalKind::Praise => Strength::Weak,
        }
    }
}

/// One lexicon hit: the kind and the exact phrase as it appears in the text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Signal {
    pub kind: SignalKind,
    pub phrase: String,
    /// Byte offset of the phrase in the text.
    pub at: usize,
}

/// English phrases match on word boundaries, case-insensitively.
const ENGLISH: &[(SignalKind, &[&str])] = &[
    (
        SignalKind::Correction,
        &[
            "that's wrong",
            "that is wrong",
            "this is wrong",
            "that's not right",
            "that is not right",
            "not what i asked",
            "not what i meant",
            "not what i wanted",
            "you should have",
            "it should be",
            "should be using",
            "should use",
            "use instead",
            "instead of",
            "doesn't work",
            "does not work",
            "didn't work",
            "did not work",
            "still broken",
            "still fails",
            "is incorrect",
            "that's incorrect",
            "wrong file",
            "wrong command",
            "no, use",
            "no, don't",
            "no, do not",
            "don't use",
            "do not use",
            "never use",
            "stop using",
        ],
    ),
    (
        SignalKind::Rejection,
        &[
            "try again",
            "redo",
            "rewrite it",
            "rewrite this",
            "start over",
            "undo that",
            "undo this",
            "revert that",
            "revert this",
            "scrap that",
            "throw that away",
            "different approach",
            "another approach",
        ],
    ),
    (
        SignalKind::Preference,
        &[
            "remember that",
            "remember to",
            "please remember",
            "always use",
            "always run",
            "always",
            "from now on",
            "going forward",
            "in the future",
            "i prefer",
            "we prefer",
            "i'd rather",
            "i would rather",
            "by default use",
            "make sure to always",
        ],
    ),
    (
        SignalKind::Confusion,
        &[
            "i don't understand",
            "i do not understand",
            "what do you mean",
            "why did you",
            "why would you",
            "that makes no sense",
            "i'm confused",
            "i am confused",
        ],
    ),
    (
        SignalKind::IntentChange,
        &[
            "changed my mind",
            "actually, let's",
            "actually let's",
            "on second thought",
            "scratch that",
        ],
    ),
    (
        SignalKind::Praise,
        &[
            "perfect",
            "exactly right",
            "that's it",
            "looks good",
            "lgtm",
            "great job",
            "nice work",
            "well done",
            "thanks",
            "thank you",
        ],
    ),
];

/// Chinese phrases match as substrings.
const CHINESE: &[(SignalKind, &[&str])] = &[
    (
        SignalKind::Correction,
        &[
            "不对",
            "错了",
            "应该是",
            "不是这样",
            "不要用",
            "别用",
            "不应该",
            "搞错",
        ],
    ),
    (
        SignalKind::Rejection,
        &[
            "重写",
            "重做",
            "算了",
            "换方法",
            "换一个",
            "换个方法",
            "撤销",
            "回滚",
        ],
    ),
    (
        SignalKind::Preference,
        &[
            "我偏好",
            "我更喜欢",
            "记住",
            "以后都",
            "以后要",
            "总是",
            "永远不要",
            "务必",
        ],
    ),
    (
        SignalKind::Confusion,
        &["没明白", "不明白", "为什么这样", "看不懂"],
    ),
    (
        SignalKind::IntentChange,
        &["想法变了", "改主意", "其实我想"],
    ),
    (
        SignalKind::Praise,
        &["对了", "很好", "就是这样", "完美", "谢谢"],
    ),
];

/// All lexicon hits in `text`, strongest first, then by position.
pub fn detect(text: &str) -> Vec<Signal> {
    let lower = text.to_lowercase();
    let mut hits = Vec::new();
    // Offsets found in the lowercased text are valid in the original only when every character
    // keeps its byte length (some, like `İ` or the Kelvin sign, do not, even when the total
    // length happens to match).
    let aligned = text
        .chars()
        .all(|c| c.to_lowercase().map(char::len_utf8).sum::<usize>() == c.len_utf8());
    if aligned {
        for (kind, phrases) in ENGLISH {
            for phrase in *phrases {
                for (at, _) in lower.match_indices(phrase) {
                    if word_boundary(&lower, at, phrase.len()) {
                        hits.push(Signal {
                            kind: *kind,
                            phrase: text[at..at + phrase.len()].to_owned(),
                            at,
                        });
                    }
                }
            }
        }
    } else {
        // Lower-casing changed byte lengths (rare scripts); fall back to case-sensitive search
        // so offsets stay valid in the original text.
        for (kind, phrases) in ENGLISH {
            for phrase in *phrases {
                for (at, found) in text.match_indices(phrase) {
                    if word_boundary(text, at, phrase.len()) {
                        hits.push(Signal {
                            kind: *kind,
                            phrase: found.to_owned(),
                            at,
                        });
                    }
                }
            }
        }
    }
    for (kind, phrases) in CHINESE {
        for phrase in *phrases {
            for (at, found) in text.match_indices(phrase) {
                hits.push(Signal {
                    kind: *kind,
                    phrase: found.to_owned(),
                    at,
                });
            }
        }
    }
    hits.sort_by(|a, b| {
        b.kind
            .strength()
            .cmp(&a.kind.strength())
            .then(a.at.cmp(&b.at))
    });
    hits
}

/// The strongest signal in `text`, if any.
pub fn strongest(text: &str) -> Option<Signal> {
    detect(text).into_iter().next()
}

/// True when `text` carries an explicit correction, rejection or stated preference.
pub fn is_explicit_correction(text: &str) -> bool {
    strongest(text).is_some_and(|signal| signal.kind.strength() == Strength::Strong)
}

fn word_boundary(text: &str, at: usize, len: usize) -> bool {
    let before = text[..at].chars().next_back();
    let after = text[at + len..].chars().next();
    let is_word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    !is_word(before) && !is_word(after)
}

/// Host-generated user-role texts that are not human input (Claude Code writes them as `user`
/// records, Codex as the first `user` items of a rollout): interrupts, slash-command wrappers,
/// local command output, notifications, compaction summaries, injected environment context.
/// They are never corrections and never learning sources.
pub fn is_host_generated(text: &str) -> bool {
    let trimmed = text.trim_start();
    const PREFIXES: [&str; 13] = [
        "<command-name>",
        "<local-command-caveat>",
        "<command-message>",
        "<local-command-stdout>",
        "<local-command-stderr>",
        "<task-notification>",
        "<ide_opened_file>",
        "<system-reminder>",
        "<environment_context>",
        "<user_instructions>",
        "[Request interrupted",
        "Caveat: The messages below were generated",
        "This session is being continued from a previous conversation",
    ];
    PREFIXES.iter().any(|prefix| trimmed.starts_with(prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strong_signals_in_english_and_chinese() {
        for text in [
            "No, don't use npm here; use pnpm.",
            "That's wrong, it should be the v2 endpoint",
            "From now on run the tests with nextest",
            "Please try again with a smaller diff",
            "不对，应该是用 pnpm",
            "以后都用 pnpm 安装依赖",
            "记住：提交前先运行 cargo fmt",
            "算了，换方法吧",
        ] {
            assert!(is_explicit_correction(text), "{text}");
        }
    }

    #[test]
    fn weak_and_medium_signals_are_not_corrections() {
        assert!(!is_explicit_correction("Thanks, looks good"));
        assert!(!is_explicit_correction("很好，就是这样"));
        assert_eq!(
            strongest("Why did you delete it?").unwrap().kind,
            SignalKind::Confusion
        );
        assert_eq!(strongest("谢谢").unwrap().kind, SignalKind::Praise);
    }

    #[test]
    fn english_matches_respect_word_boundaries() {
        assert!(strongest("I know the alwaysOn flag").is_none());
        assert!(strongest("the redone layout").is_none());
        assert!(strongest("Please redo it").is_some());
    }

    #[test]
    fn strongest_level_wins_and_phrase_is_exact() {
        let signal = strongest("Thanks! But that's wrong: use the staging DB").unwrap();
        assert_eq!(signal.kind, SignalKind::Correction);
        assert_eq!(signal.phrase, "that's wrong");
        let text = "Great. ALWAYS USE tabs";
        let signal = strongest(text).unwrap();
        assert_eq!(
            &text[signal.at..signal.at + signal.phrase.len()],
            signal.phrase
        );
    }

    #[test]
    fn case_folding_that_changes_byte_lengths_never_panics() {
        for text in [
            "İİ that's wrong.\u{212A}",
            "\u{212A}elvin: that's wrong",
            "ǅ that's wrong İ",
        ] {
            let signals = detect(text);
            for signal in signals {
                assert_eq!(
                    &text[signal.at..signal.at + signal.phrase.len()],
                    signal.phrase
                );
            }
        }
    }

    #[test]
    fn host_generated_texts_are_recognized() {
        assert!(is_host_generated(
            "[Request interrupted by user for tool use]"
        ));
        assert!(is_host_generated("<command-name>/clear</command-name>"));
        assert!(is_host_generated(
            "  <environment_context>cwd</environment_context>"
        ));
        assert!(!is_host_generated("please fix the build"));
    }
}

//! Text folding with a way back: matching happens on a normalised copy (NFKC, so full-width
//! letters and punctuation become ASCII; curly quotes and dashes become straight ones; lower
//! case), while every excerpt the extractor cites is cut from the original text. [`Folded`]
//! keeps, for each byte of the folded copy, the range of the original character it came from.

use std::ops::Range;

use unicode_normalization::UnicodeNormalization;

/// A folded copy of a text and the map back to the original.
#[derive(Debug, Clone)]
pub struct Folded {
    /// NFKC, quotes and dashes straightened, lower-cased.
    pub text: String,
    /// For each byte of `text`: the original byte range of the character it came from.
    origin: Vec<Range<usize>>,
}

impl Folded {
    pub fn new(original: &str) -> Folded {
        let mut text = String::with_capacity(original.len());
        let mut origin = Vec::with_capacity(original.len());
        for (at, c) in original.char_indices() {
            let source = at..at + c.len_utf8();
            for folded in fold_char(c) {
                for lower in folded.to_lowercase() {
                    text.push(lower);
                    origin.extend(std::iter::repeat_n(source.clone(), lower.len_utf8()));
                }
            }
        }
        Folded { text, origin }
    }

    /// The original byte range behind `range` of the folded text (empty ranges map to an empty
    /// range at the corresponding position).
    pub fn original(&self, range: Range<usize>) -> Range<usize> {
        if range.start >= range.end || range.start >= self.origin.len() {
            let at = self
                .origin
                .get(range.start)
                .map_or_else(|| self.origin.last().map_or(0, |r| r.end), |r| r.start);
            return at..at;
        }
        let end = range.end.min(self.origin.len());
        self.origin[range.start].start..self.origin[end - 1].end
    }
}

/// The characters `c` folds to before lower-casing: straight quotes and dashes, then NFKC (which
/// turns full-width `ｐｎｐｍ`, `，`, `？` into `pnpm`, `,`, `?`).
fn fold_char(c: char) -> impl Iterator<Item = char> {
    let straight = match c {
        '\u{2018}' | '\u{2019}' | '\u{201A}' | '\u{201B}' | '\u{2032}' | '\u{FF07}' => Some('\''),
        '\u{201C}' | '\u{201D}' | '\u{201E}' | '\u{201F}' | '\u{2033}' | '\u{FF02}' => Some('"'),
        '\u{300C}' | '\u{300D}' | '\u{300E}' | '\u{300F}' => Some('"'),
        '\u{2013}' | '\u{2014}' | '\u{2015}' | '\u{2212}' => Some('-'),
        '\u{3000}' => Some(' '),
        _ => None,
    };
    let single = straight.map(|s| s.to_string());
    let folded = single.unwrap_or_else(|| c.to_string().nfkc().collect());
    folded.chars().collect::<Vec<_>>().into_iter()
}

/// `text` with the folding a person reads as the same text (NFKC, straight quotes and dashes)
/// but its case kept: how a stored lesson is written.
pub fn display(text: &str) -> String {
    text.chars().flat_map(fold_char).collect()
}

/// Whether `c` is a Han, kana or Hangul character.
pub fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x3040..=0x30FF | 0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xAC00..=0xD7AF | 0xF900..=0xFAFF)
}

/// Sentence terminators after folding (full-width `！？` are ASCII by then; `。` stays). A `;`
/// joins clauses of one sentence ("don't use npm here; use pnpm").
fn is_terminator(c: char) -> bool {
    matches!(c, '.' | '!' | '?' | '。')
}

/// Trimmed, non-empty sentence ranges of `text` within `range`. A line always ends a sentence;
/// `。` always does; `!`, `?` and `.` do before whitespace, a CJK character or the end, so
/// `src/main.rs`, `v1.2` and `example.com` stay whole.
pub fn sentences(text: &str, range: Range<usize>) -> Vec<Range<usize>> {
    let mut spans = Vec::new();
    let base = range.start;
    let slice = &text[range];
    let mut start = 0;
    let mut chars = slice.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c == '\n' {
            spans.extend(trim(slice, start..i));
            start = i + 1;
            continue;
        }
        if !is_terminator(c) {
            continue;
        }
        let mut end = i + c.len_utf8();
        while let Some(&(j, d)) = chars.peek() {
            if !(is_terminator(d) || matches!(d, '"' | '\'' | ')' | ']')) {
                break;
            }
            end = j + d.len_utf8();
            chars.next();
        }
        let after = chars.peek().map(|&(_, d)| d);
        let ends = match c {
            '。' => true,
            _ => after.is_none_or(|d| d.is_whitespace() || is_cjk(d)),
        };
        if ends {
            spans.extend(trim(slice, start..end));
            start = end;
        }
    }
    spans.extend(trim(slice, start..slice.len()));
    spans
        .into_iter()
        .map(|r| r.start + base..r.end + base)
        .collect()
}

/// `range` of `text` without surrounding whitespace, or `None` when nothing is left.
pub fn trim(text: &str, range: Range<usize>) -> Option<Range<usize>> {
    let slice = text.get(range.clone())?;
    let start = range.start + (slice.len() - slice.trim_start().len());
    let end = range.end - (slice.len() - slice.trim_end().len());
    (start < end).then_some(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folding_maps_back_to_the_original() {
        let original = "That\u{2019}s wrong \u{2014} it\u{2019}s ＰＮＰＭ，ok？";
        let folded = Folded::new(original);
        assert_eq!(folded.text, "that's wrong - it's pnpm,ok?");
        let at = folded.text.find("pnpm").unwrap();
        let back = folded.original(at..at + 4);
        assert_eq!(&original[back], "ＰＮＰＭ");
        let at = folded.text.find("that's").unwrap();
        assert_eq!(&original[folded.original(at..at + 6)], "That\u{2019}s");
    }

    #[test]
    fn lower_casing_that_changes_lengths_keeps_the_map() {
        for original in [
            "İİ that's wrong.\u{212A}",
            "\u{212A}elvin: never use npm",
            "ǅ 不要",
        ] {
            let folded = Folded::new(original);
            for (at, _) in folded.text.char_indices() {
                let range = folded.original(at..at + 1);
                assert!(original.get(range).is_some(), "{original}");
            }
        }
    }

    #[test]
    fn display_keeps_case() {
        assert_eq!(display("Use ＰＮＰＭ，not “npm”"), "Use PNPM,not \"npm\"");
    }

    #[test]
    fn sentences_split_in_both_languages() {
        let text = Folded::new(
            "Use src/main.rs (v1.2) instead. Really?! 好的。不要用npm！以后都这样\nnext",
        )
        .text;
        let spans: Vec<&str> = sentences(&text, 0..text.len())
            .into_iter()
            .map(|r| &text[r])
            .collect();
        assert_eq!(
            spans,
            [
                "use src/main.rs (v1.2) instead.",
                "really?!",
                "好的。",
                "不要用npm!",
                "以后都这样",
                "next"
            ]
        );
    }
}

//! Token counting for prompt budgets. A section's reported cost is measured on the rendered
//! section, after escaping and marker expansion, so it is never lower than what the prompt
//! actually spends.
//!
//! The count is that of a real byte-level BPE, OpenAI's `cl100k_base`, whose merge table ships
//! inside the `tiktoken-rs` crate: loading it needs no network and no files at run time. No
//! single tokenizer matches every provider; `cl100k_base` is chosen over the newer `o200k_base`
//! because its larger counts on non-English text (CJK in particular) keep the budget on the
//! conservative side for providers whose own tokenizers are less efficient.
//!
//! `tiktoken-rs` splits text with its pre-tokenizer pattern on `fancy-regex`, whose backtracking
//! VM reads well under 1 MB/s; a `/context` call counts its sections several times over, so
//! that alone cost tens of milliseconds per call. [`count`] therefore runs the same algorithm
//! on a faster path: the pattern's regular alternatives on the `regex` crate's automata, its one
//! lookahead (`\s+(?!\S)`) resolved by hand, and byte-pair merging over the same rank table
//! (read out of `tiktoken-rs` once per process). It gives `CoreBPE::encode_ordinary(text).len()`
//! exactly; the tests compare the two on tens of thousands of generated strings, and debug builds
//! compare them on every call.

use std::collections::{BinaryHeap, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{LazyLock, Mutex};

use regex::Regex;

/// The BPE encoding [`count`] uses, for diagnostics and receipts.
pub const ENCODING: &str = "cl100k_base";

/// `cl100k_base`'s pre-tokenizer, as `tiktoken-rs` spells it:
///
/// ```text
/// '(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+|
/// ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s
/// ```
///
/// and here without its possessive quantifiers (no alternative can backtrack into them with a
/// different outcome: each is followed by nothing, or by a class its run cannot contain) and
/// with `\s+(?!\S)|\s` folded into `\s+`, which [`Fast::count`] shortens by its last character
/// when the lookahead would have.
///
/// Anchored (`^`) and applied to the rest of the text, so the automaton knows where each match
/// starts and never searches backwards for it.
const SPLIT: &str = r"^(?:'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s+$|\s*[\r\n]|\s+)";

type Rank = u32;

/// FxHash-style hasher for the fixed rank table (keys are the tokenizer's own byte strings).
#[derive(Default)]
struct RankHasher(u64);

impl Hasher for RankHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
        }
        for &byte in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ u64::from(byte)).wrapping_mul(K);
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.write(&(n as u64).to_le_bytes());
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type Ranks = HashMap<Box<[u8]>, Rank, BuildHasherDefault<RankHasher>>;

struct Fast {
    split: Regex,
    ranks: Ranks,
}

/// Built once per process: reading the ~100k ranks out of `tiktoken-rs` takes tens of
/// milliseconds and the result is immutable, so every caller shares it.
static FAST: LazyLock<Option<Fast>> = LazyLock::new(|| match Fast::load() {
    Ok(fast) => Some(fast),
    Err(error) => {
        // The data is compiled into the binary, so this only happens if the crate is broken.
        // Counting still works through the upper bound below rather than failing every turn.
        tracing::error!(%error, "cl100k_base tokenizer failed to load; counting UTF-8 bytes");
        None
    }
});

impl Fast {
    fn load() -> anyhow::Result<Fast> {
        let bpe = tiktoken_rs::cl100k_base()?;
        let special: HashSet<&[u8]> = bpe
            .special_tokens()
            .into_iter()
            .map(str::as_bytes)
            .collect();
        let mut ranks = Ranks::default();
        // cl100k_base's ordinary ranks are 0..100256 and its special tokens sit just above;
        // decoding every rank up to well past them and dropping the specials reads the whole
        // table without depending on its exact size.
        for rank in 0..(1 << 18) {
            if let Ok(bytes) = bpe.decode_bytes(&[rank])
                && !special.contains(bytes.as_slice())
            {
                ranks.insert(bytes.into_boxed_slice(), rank);
            }
        }
        anyhow::ensure!(
            (0..=255u8).all(|b| ranks.contains_key([b].as_slice())),
            "the rank table lacks single bytes"
        );
        Ok(Fast {
            split: Regex::new(SPLIT)?,
            ranks,
        })
    }

    fn count(&self, text: &str) -> usize {
        let mut tokens = 0;
        let mut at = 0;
        while at < text.len() {
            let rest = &text[at..];
            let Some(found) = self.split.find(rest) else {
                // Every character starts a match of one alternative or another.
                return tokens + self.piece(rest.as_bytes());
            };
            let mut end = at + found.end();
            let piece = found.as_str();
            // `\s+(?!\S)`: a run of whitespace without a line break that stops before
            // non-whitespace leaves its last character to the next piece (`\s` when the run is
            // one character long).
            if end < text.len()
                && piece.chars().all(char::is_whitespace)
                && !piece.ends_with(['\r', '\n'])
            {
                let last = piece.chars().next_back().map_or(0, char::len_utf8);
                if piece.len() > last {
                    end -= last;
                }
            }
            tokens += self.piece(&text.as_bytes()[at..end]);
            at = end;
        }
        tokens
    }

    /// Tokens of one pre-tokenized piece: one if it is in the table, else the number of parts
    /// byte-pair merging leaves (lowest rank first, leftmost on ties — the order of
    /// `tiktoken`'s `_byte_pair_merge_large`, which it uses interchangeably with its quadratic
    /// version).
    fn piece(&self, piece: &[u8]) -> usize {
        if piece.len() <= 1 || self.ranks.contains_key(piece) {
            return piece.len().min(1);
        }
        if piece.len() <= SHORT_PIECE {
            return self.short_piece(piece);
        }
        let rank = |range: std::ops::Range<usize>| self.ranks.get(&piece[range]).copied();
        // Part starting at `i`: its end, the end of the part after it, and the rank of their
        // merge (`None`: not a token, or stale).
        struct Part {
            prev: usize,
            end: usize,
            next_end: usize,
            next_rank: Option<Rank>,
        }
        let n = piece.len();
        // Min-heap on (rank, start).
        let mut heap = BinaryHeap::with_capacity(n);
        let mut parts: Vec<Part> = (0..n)
            .map(|i| {
                let next_rank = if i + 1 < n { rank(i..i + 2) } else { None };
                if let Some(r) = next_rank {
                    heap.push(std::cmp::Reverse((r, i)));
                }
                Part {
                    prev: i.wrapping_sub(1),
                    end: i + 1,
                    next_end: i + 2,
                    next_rank,
                }
            })
            .collect();
        let mut count = n;
        while let Some(std::cmp::Reverse((r, left))) = heap.pop() {
            if parts[left].next_rank != Some(r) {
                continue;
            }
            let right = parts[left].end;
            let right_end = parts[left].next_end;
            let right_next_end = parts[right].next_end;
            parts[left].end = right_end;
            count -= 1;
            // The merge of the new part with its right neighbour.
            parts[left].next_end = right_next_end;
            parts[left].next_rank = None;
            if right_next_end <= n
                && let Some(r) = rank(left..right_next_end)
            {
                heap.push(std::cmp::Reverse((r, left)));
                parts[left].next_rank = Some(r);
            }
            if right_end < n {
                parts[right_end].prev = left;
            }
            // The merge of its left neighbour with it.
            if left > 0 {
                let prev = parts[left].prev;
                parts[prev].next_end = right_end;
                parts[prev].next_rank = None;
                if let Some(r) = rank(prev..right_end) {
                    heap.push(std::cmp::Reverse((r, prev)));
                    parts[prev].next_rank = Some(r);
                }
            }
            parts[right].next_rank = None;
        }
        count
    }
}

/// Pieces up to this many bytes are merged on the stack (`tiktoken`'s quadratic version).
const SHORT_PIECE: usize = 64;

impl Fast {
    /// [`Fast::piece`] for a piece of 2..=`SHORT_PIECE` bytes: `tiktoken`'s `_byte_pair_merge`,
    /// counting only, without allocating.
    fn short_piece(&self, piece: &[u8]) -> usize {
        let rank = |start: usize, end: usize| {
            self.ranks
                .get(&piece[start..end])
                .copied()
                .unwrap_or(Rank::MAX)
        };
        let n = piece.len();
        // (start, rank of the merge of this part with the next one)
        let mut parts = [(0usize, Rank::MAX); SHORT_PIECE + 1];
        for (i, part) in parts.iter_mut().enumerate().take(n - 1) {
            *part = (i, rank(i, i + 2));
        }
        parts[n - 1] = (n - 1, Rank::MAX);
        parts[n] = (n, Rank::MAX);
        let mut len = n + 1;
        loop {
            let mut min = (Rank::MAX, 0);
            for (i, &(_, r)) in parts[..len - 1].iter().enumerate() {
                if r < min.0 {
                    min = (r, i);
                }
            }
            if min.0 == Rank::MAX {
                break;
            }
            let i = min.1;
            // Ranks of the merges around the new part, read before `parts[i + 1]` goes.
            let merged = |parts: &[(usize, Rank)], j: usize| {
                if j + 3 < len {
                    rank(parts[j].0, parts[j + 3].0)
                } else {
                    Rank::MAX
                }
            };
            if i > 0 {
                parts[i - 1].1 = merged(&parts, i - 1);
            }
            parts[i].1 = merged(&parts, i);
            parts.copy_within(i + 2..len, i + 1);
            len -= 1;
        }
        len - 1
    }
}

/// Texts counted recently, keyed by the whole text (a hit is exact): `context` counts the same
/// Memory sections and the items of often recalled experiences call after call.
static RECENT: LazyLock<Mutex<HashMap<String, usize>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));
/// Entries kept before the memo starts over.
const RECENT_ENTRIES: usize = 4096;
/// Longer texts are counted without being kept.
const RECENT_MAX_BYTES: usize = 16 * 1024;

/// Number of `cl100k_base` tokens in `text` (ordinary text: special-token spellings such as
/// `<|endoftext|>` count as the plain characters they are).
pub fn count(text: &str) -> usize {
    let memo = text.len() <= RECENT_MAX_BYTES;
    if memo && let Some(&n) = RECENT.lock().unwrap_or_else(|e| e.into_inner()).get(text) {
        return n;
    }
    let n = count_uncached(text);
    if memo {
        let mut recent = RECENT.lock().unwrap_or_else(|e| e.into_inner());
        if recent.len() >= RECENT_ENTRIES {
            recent.clear();
        }
        recent.insert(text.to_owned(), n);
    }
    n
}

fn count_uncached(text: &str) -> usize {
    let Some(fast) = FAST.as_ref() else {
        return upper_bound(text);
    };
    // A budget check must never take the turn down with it, so a panic degrades to the byte
    // bound, which is never an undercount.
    let counted = catch_unwind(AssertUnwindSafe(|| fast.count(text)));
    #[cfg(debug_assertions)]
    if let Ok(n) = counted {
        debug_assert_eq!(n, reference(text), "fast count differs on {text:?}");
    }
    counted.unwrap_or_else(|_| upper_bound(text))
}

/// A floor under [`count`] for the cost of one pass over the bytes, so a caller can rule text
/// out of a budget without counting it.
///
/// Every maximal run of ASCII letters, and every three (or fewer) digits of a maximal run of ASCII
/// digits, is at least one pre-tokenizer piece of its own — letters only ever share a piece with
/// one leading non-letter or an apostrophe, digits are split into threes and share a piece with
/// nothing else — and every piece is at least one token. A run next to a non-ASCII character is
/// not counted, since that character may extend it.
pub fn lower_bound(text: &str) -> usize {
    let bytes = text.as_bytes();
    let mut floor = 0;
    let mut i = 0;
    while i < bytes.len() {
        let letters = bytes[i].is_ascii_alphabetic();
        if !letters && !bytes[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len()
            && (if letters {
                bytes[i].is_ascii_alphabetic()
            } else {
                bytes[i].is_ascii_digit()
            })
        {
            i += 1;
        }
        let bounded = (start == 0 || bytes[start - 1].is_ascii())
            && (i == bytes.len() || bytes[i].is_ascii());
        if bounded {
            floor += if letters { 1 } else { (i - start).div_ceil(3) };
        }
    }
    floor
}

/// `tiktoken-rs`'s own count, which [`count`] reproduces (debug builds check every call).
#[cfg(any(test, debug_assertions))]
fn reference(text: &str) -> usize {
    static BPE: LazyLock<tiktoken_rs::CoreBPE> =
        LazyLock::new(|| tiktoken_rs::cl100k_base().expect("cl100k_base loads"));
    BPE.encode_ordinary(text).len()
}

/// A byte-level BPE token always covers at least one byte, so the UTF-8 length bounds the count
/// from above.
fn upper_bound(text: &str) -> usize {
    text.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recall_tokens_load_offline_and_count_known_strings() {
        assert_eq!(count(""), 0);
        assert_eq!(count("hello world"), 2);
        // Byte-level BPE: never more tokens than bytes, and CJK costs more than one per word.
        let cjk = "数据库迁移时丢失消息";
        let n = count(cjk);
        assert!(n >= 5 && n <= cjk.len(), "{n}");
        let long = "fn main() { println!(\"hello\"); }\n".repeat(200);
        let n = count(&long);
        assert!(n > 1000 && n < long.len(), "{n}");
    }

    #[test]
    fn recall_tokens_are_deterministic_and_special_tokens_are_plain_text() {
        let text = "<|endoftext|><|im_start|>system";
        assert_eq!(count(text), count(text));
        // As ordinary text the special-token spelling is several tokens, not one.
        assert!(count("<|endoftext|>") > 1);
    }

    #[test]
    fn recall_tokens_upper_bound_is_never_below_the_count() {
        for text in [
            "hello world",
            "数据库",
            "[U+202E] &amp; &lt;x&gt;",
            "  \n\t",
        ] {
            assert!(upper_bound(text) >= count(text), "{text:?}");
        }
    }

    fn fast() -> &'static Fast {
        FAST.as_ref().expect("tokenizer loads")
    }

    fn assert_same(text: &str) {
        let n = reference(text);
        assert_eq!(fast().count(text), n, "{text:?}");
        assert!(lower_bound(text) <= n, "{text:?}");
    }

    #[test]
    fn recall_tokens_fast_count_matches_tiktoken_on_known_strings() {
        for text in [
            "",
            " ",
            "  ",
            "\n",
            "a",
            "hello world",
            "hello  world",
            "hello   world  ",
            "hello \n world",
            "x \n\n  y",
            "tab\t\tseparated\tvalues\t",
            "a \u{a0}b",
            "\u{3000}\u{3000}全角",
            "line\r\nbreaks\r\n\r\n",
            "trailing spaces   ",
            "   leading",
            "I'm sure it's what they'd've LL'd 'S 'ſ 'Ll 'VE",
            "12345678901 3.14159 ٣٤٥ ½ Ⅻ 1st",
            "don't   'quote'  \"double\"",
            "e\u{301}te\u{301} combining \u{301}\u{301}",
            "emoji 🚀👩\u{200D}💻 mixed",
            "数据库迁移时丢失消息，需要先备份。运行 pnpm install --frozen-lockfile",
            "한국어 텍스트와 日本語のテキスト",
            "<experience id=\"exp_1\" sha256=\"3f9a0c\">\ntitle: x\n</experience>\n",
            "[U+202E] &amp; &lt;x&gt; &#91;U+ forged",
            "<|endoftext|><|im_start|>system\n",
            "fn main() {\n    println!(\"hello\");\n}\n",
            "    indented\n        more\n\t\tmixed \t \n",
        ] {
            assert_same(text);
        }
        // Long pieces take tiktoken's other merge algorithm.
        assert_same(&"a".repeat(500));
        assert_same(&"数".repeat(300));
        assert_same(&"!?".repeat(200));
        assert_same(&"\u{301}".repeat(150));
        assert_same(&" ".repeat(300));
        assert_same(&format!("{}x", " ".repeat(300)));
        assert_same(&"0123456789abcdef".repeat(40));
        assert_same(&"supercalifragilistic".repeat(20));
    }

    use super::super::TestRng as Rng;

    const FRAGMENTS: &[&str] = &[
        " ",
        "  ",
        "   ",
        "\t",
        "\n",
        "\r\n",
        "\r",
        " \n",
        "\n\n",
        "\u{a0}",
        "\u{3000}",
        "\u{2028}",
        "\u{85}",
        "\u{b}",
        "\u{c}",
        "'",
        "'s",
        "'S",
        "'ſ",
        "'t",
        "'ll",
        "'LL",
        "'ve",
        "'re",
        "'d",
        "'m",
        "'x",
        "the",
        "The",
        "hello",
        "world",
        "don",
        "12",
        "3456",
        "٣",
        "½",
        "Ⅻ",
        ".",
        ",",
        "!",
        "?",
        "...",
        "<",
        ">",
        "</",
        "/>",
        "&amp;",
        "&#91;",
        "[U+202E]",
        "\"",
        "`",
        "(",
        ")",
        "{",
        "}",
        "_",
        "-",
        "--",
        "::",
        "é",
        "e\u{301}",
        "\u{301}",
        "ß",
        "İ",
        "K",
        "数据库",
        "迁移",
        "，",
        "。",
        "日本語",
        "한국어",
        "عربى",
        "עברית",
        "🚀",
        "👩\u{200D}💻",
        "\u{200B}",
        "\u{FE0F}",
        "\u{E0041}",
        "<|endoftext|>",
        "exp_01a229c1302d",
        "3f9a0c7e",
        "node:fs",
        "a/b/c.rs",
    ];

    fn random_text(rng: &mut Rng) -> String {
        let mut out = String::new();
        let pieces = match rng.below(30) {
            0 => 100 + rng.below(400),
            _ => rng.below(24),
        };
        for _ in 0..pieces {
            match rng.below(7) {
                0..=2 => out.push_str(FRAGMENTS[rng.below(FRAGMENTS.len())]),
                3 => out.push(char::from(b' ' + rng.below(95) as u8)),
                4 => {
                    for _ in 0..1 + rng.below(12) {
                        out.push(char::from(b'a' + rng.below(26) as u8));
                    }
                }
                5 => {
                    // Any scalar value: controls, marks, other scripts, astral planes.
                    let code = rng.below(0x11_0000) as u32;
                    out.push(char::from_u32(code).unwrap_or('\u{FFFD}'));
                }
                _ => {
                    // A long run of one kind: letters, CJK, digits, punctuation or spaces.
                    let run = ["x", "数", "7", "=", " ", "\u{301}", "ab"][rng.below(7)];
                    out.push_str(&run.repeat(1 + rng.below(120)));
                }
            }
        }
        out
    }

    #[test]
    fn recall_tokens_fast_count_matches_tiktoken_on_generated_text() {
        let mut rng = Rng(0x70CE_2026_0004);
        for case in 0..20_000 {
            let text = random_text(&mut rng);
            let n = reference(&text);
            assert_eq!(fast().count(&text), n, "case {case}: {text:?}");
            assert!(lower_bound(&text) <= n, "case {case}: {text:?}");
        }
    }
}

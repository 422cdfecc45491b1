//! Token counting for prompt budgets (spec 002: "The reported token cost is measured on the
//! rendered section, after escaping and marker expansion, so it is never lower than what the
//! prompt actually spends").
//!
//! The count comes from a real byte-level BPE, OpenAI's `cl100k_base`, whose merge table ships
//! inside the `tiktoken-rs` crate: loading it needs no network and no files at run time. No
//! single tokenizer matches every provider; `cl100k_base` is chosen over the newer `o200k_base`
//! because its larger counts on non-English text (CJK in particular) keep the budget on the
//! conservative side for providers whose own tokenizers are less efficient.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::LazyLock;

use tiktoken_rs::CoreBPE;

/// The BPE encoding [`count`] uses, for diagnostics and receipts.
pub const ENCODING: &str = "cl100k_base";

/// Parsed once per process: building the ~100k-entry merge table takes tens of milliseconds and
/// the result is immutable, so every caller shares it.
static BPE: LazyLock<Option<CoreBPE>> = LazyLock::new(|| match tiktoken_rs::cl100k_base() {
    Ok(bpe) => Some(bpe),
    Err(error) => {
        // The data is compiled into the binary, so this only happens if the crate is broken.
        // Counting still works through the upper bound below rather than failing every turn.
        tracing::error!(%error, "cl100k_base tokenizer failed to load; counting UTF-8 bytes");
        None
    }
});

/// Number of `cl100k_base` tokens in `text` (ordinary text: special-token spellings such as
/// `<|endoftext|>` count as the plain characters they are).
pub fn count(text: &str) -> usize {
    let Some(bpe) = BPE.as_ref() else {
        return upper_bound(text);
    };
    // The tokenizer unwraps its regex matches internally. A budget check must never take the
    // turn down with it, so a panic degrades to the byte bound, which is never an undercount.
    catch_unwind(AssertUnwindSafe(|| bpe.encode_ordinary(text).len()))
        .unwrap_or_else(|_| upper_bound(text))
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
}

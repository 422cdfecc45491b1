//! Recall: the read side of the learning flywheel — what `context` retrieves, how it is rendered
//! into the prompt as data rather than instructions, and what its receipt records.
//!
//! - [`search_terms`] turns prompt or search text into bounded, quoted terms. It is the only
//!   path by which user or prompt text reaches an FTS `MATCH`, so FTS operators, column
//!   selectors and unmatched quotes stay data instead of becoming query grammar.
//! - [`render`] is the injection-safe renderer for the `learning.experiences` and `memory.*`
//!   prompt sections: escaping, visible `[U+XXXX]` markers, and the data-not-instructions frame.
//! - [`token_count`] measures rendered sections with a real BPE tokenizer so the retrieval
//!   budget is charged for what the prompt actually spends.
//! - [`semantic`] and [`fusion`] are the optional semantic layer: experience vectors from an
//!   embeddings provider, fused with the lexical ranking by reciprocal rank.

pub mod floor;
pub mod fusion;
pub mod index;
pub mod render;
pub mod search_terms;
pub mod semantic;
pub mod store;
pub mod token_count;

/// A seeded generator for the recall fuzz tests (SplitMix64): every run tries the same inputs, and
/// a failure reproduces from the case number it prints.
#[cfg(test)]
pub(crate) struct TestRng(pub(crate) u64);

#[cfg(test)]
impl TestRng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub(crate) fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

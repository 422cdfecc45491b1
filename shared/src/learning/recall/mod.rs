//! Recall: the read side of the learning flywheel (spec 002 "Retrieval and prompt receipts" and
//! "Untrusted learned text").
//!
//! - [`query`] turns prompt or search text into bounded, quoted terms. It is the only path by
//!   which user or prompt text reaches an FTS `MATCH`, so FTS operators, column selectors and
//!   unmatched quotes stay data instead of becoming query grammar.
//! - [`render`] is the injection-safe renderer for the `learning.experiences` and `memory.*`
//!   prompt sections: escaping, visible `[U+XXXX]` markers, and the data-not-instructions frame.
//! - [`tokens`] measures rendered sections with a real BPE tokenizer so the retrieval budget is
//!   charged for what the prompt actually spends.

pub mod query;
pub mod render;
pub mod tokens;

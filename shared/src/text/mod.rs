//! Text helpers every part of the domain shares: secret redaction, the English stemmer, the
//! codepoint checks and the content digest. Leaf module: it depends on no other module of this
//! crate, so learning, Memory, providers and Skills can all use it without depending on each other.

pub mod codepoints;
pub mod redact;
pub mod stem;

use sha2::{Digest, Sha256};

/// The hex SHA-256 of `text`: the digest sources, snapshots and Memory texts are keyed by.
pub fn sha256(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

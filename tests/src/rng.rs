//! A seeded generator for benchmark corpora and randomised tests.

/// SplitMix64: small, fast and deterministic, so every run with the same seed builds the same
/// corpus and prompts; the data need not be cryptographic.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// A number in `low..=high`.
    pub fn range(&mut self, low: usize, high: usize) -> usize {
        low + self.below(high - low + 1)
    }

    /// A number in `[0, 1)` with 53 random bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A number in `[-1, 1]` in steps of a millionth: a component of a random test vector.
    pub fn signed_unit(&mut self) -> f32 {
        (self.next_u64() % 2_000_001) as f32 / 1_000_000.0 - 1.0
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    pub fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }

    /// `bytes` random bytes as lowercase hex.
    pub fn hex(&mut self, bytes: usize) -> String {
        let mut out = String::with_capacity(bytes * 2);
        while out.len() < bytes * 2 {
            out.push_str(&format!("{:016x}", self.next_u64()));
        }
        out.truncate(bytes * 2);
        out
    }
}

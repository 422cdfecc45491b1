//! Codepoints a reader of a prompt or a Memory file would not see as written: invisible and
//! reordering characters (shown as `[U+XXXX]` markers when rendered) and encodings a model reads
//! differently from a person (refused where text becomes learning or Memory).

/// The first codepoint a model would read differently from a person, if any.
pub fn unresolvable_codepoint(text: &str) -> Option<char> {
    text.chars().find(|&c| {
        let code = c as u32;
        (0xE0000..=0xE007F).contains(&code)
            || (0xE0100..=0xE01EF).contains(&code)
            || (c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
    })
}

/// Whether `c` is invisible or changes the visual order of text, and so must be shown as a
/// `[U+XXXX]` marker rather than passed through.
///
/// Covers Unicode general category Cf (as of Unicode 16), variation selectors, the combining
/// grapheme joiner, Hangul fillers, a few other default-ignorable or invisible codepoints, the
/// line/paragraph separators (they break lines without being `\n`), and the C0/C1 controls other
/// than `\n` and `\t` — `\r` included, since a bare carriage return can hide a line's start.
pub fn is_invisible_or_reordering(c: char) -> bool {
    if c.is_control() {
        return !matches!(c, '\n' | '\t');
    }
    matches!(
        c as u32,
        // Category Cf.
        0x00AD // soft hyphen
            | 0x0600..=0x0605 // Arabic number signs
            | 0x061C // Arabic letter mark
            | 0x06DD // Arabic end of ayah
            | 0x070F // Syriac abbreviation mark
            | 0x0890..=0x0891 // Arabic pound/piastre mark above
            | 0x08E2 // Arabic disputed end of ayah
            | 0x180E // Mongolian vowel separator
            | 0x200B..=0x200F // ZWSP, ZWNJ, ZWJ, LRM, RLM
            | 0x202A..=0x202E // bidi embeddings and overrides
            | 0x2060..=0x2064 // word joiner, invisible operators
            | 0x2066..=0x206F // bidi isolates, deprecated format characters
            | 0xFEFF // BOM / zero-width no-break space
            | 0xFFF9..=0xFFFB // interlinear annotation
            | 0x110BD | 0x110CD // Kaithi number signs
            | 0x13430..=0x1343F // Egyptian hieroglyph format controls
            | 0x1BCA0..=0x1BCA3 // shorthand format controls
            | 0x1D173..=0x1D17A // musical symbol format controls
            | 0xE0000..=0xE007F // Tags block (a payload re-spelled here has no ASCII `<`)
            // Variation selectors (Mongolian free ones included) and the CGJ.
            | 0x180B..=0x180D | 0x180F
            | 0xFE00..=0xFE0F
            | 0xE0100..=0xE01EF
            | 0x034F
            // Hangul fillers: render as blank space but are letters to a tokenizer.
            | 0x115F | 0x1160 | 0x3164 | 0xFFA0
            // Khmer inherent vowels, default-ignorable and invisible.
            | 0x17B4 | 0x17B5
            // Line and paragraph separators: line breaks that are not `\n`.
            | 0x2028 | 0x2029
    )
}

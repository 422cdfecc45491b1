//! A crude English stemmer shared by recall (a later prompt's "tests" meets a lesson's "test")
//! and Memory deduplication (the same rule in other words).

/// A crude English stem: plural and verb endings removed, a final doubled consonant and a final
/// `e` dropped, so inflections of one word meet (`use`/`uses`/`using`/`used` → `us`,
/// `committing`/`commits` → `commit`). Words with digits or `_` are identifiers and stay exact.
pub fn stem(word: &str) -> String {
    if word.chars().any(|c| c.is_ascii_digit() || c == '_') || !word.is_ascii() {
        return word.to_owned();
    }
    let mut stem = word.to_owned();
    if stem.len() > 4 && stem.ends_with("ies") {
        stem.truncate(stem.len() - 3);
        stem.push('y');
    } else if stem.ends_with("sses") {
        stem.truncate(stem.len() - 2);
    } else if stem.len() > 3
        && stem.ends_with('s')
        && !stem.ends_with("ss")
        && !stem.ends_with("us")
        && !stem.ends_with("is")
    {
        stem.pop();
    }
    if stem.len() >= 7 && stem.ends_with("er") {
        stem.truncate(stem.len() - 2);
    } else if stem.len() >= 5 && stem.ends_with("ing") {
        stem.truncate(stem.len() - 3);
    } else if stem.len() >= 4 && stem.ends_with("ed") {
        stem.truncate(stem.len() - 2);
    }
    let bytes = stem.as_bytes();
    if bytes.len() >= 3 {
        let (last, before) = (bytes[bytes.len() - 1], bytes[bytes.len() - 2]);
        if last == before && !b"aeioulsz".contains(&last) {
            stem.pop();
        }
    }
    if stem.len() >= 3 && stem.ends_with('e') {
        stem.pop();
    }
    stem
}

/// The prefix every inflection of `word` starts with, for prefix search in a full-text index:
/// the stem without a final `y` (`dependency`/`dependencies` → `dependenc`). `None` for words
/// too short to search by prefix, identifiers and non-ASCII text.
pub fn search_prefix(word: &str) -> Option<String> {
    if word.len() < 4 || !word.bytes().all(|b| b.is_ascii_lowercase()) {
        return None;
    }
    let mut prefix = stem(word);
    if prefix.len() > 4 && prefix.ends_with('y') {
        prefix.pop();
    }
    (prefix.len() >= 3 && prefix != word).then_some(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inflections_share_a_search_prefix() {
        for (a, b) in [
            ("dependency", "dependencies"),
            ("tests", "testing"),
            ("update", "updated"),
            ("commits", "committing"),
        ] {
            let prefix = search_prefix(a).or_else(|| Some(a.to_owned())).unwrap();
            assert!(
                b.starts_with(&prefix) || stem(b).starts_with(&prefix),
                "{a} {b} {prefix}"
            );
        }
        assert_eq!(search_prefix("npm"), None);
        assert_eq!(search_prefix("v1_2"), None);
    }
}

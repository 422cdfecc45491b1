//! Edits a JSON document's text with the fewest changes, so an installer keeps the user's
//! formatting: members and elements the edit doesn't touch keep their bytes (key order,
//! indentation, line breaks, inline arrays); a changed scalar is replaced where it stands; a new
//! member or element is appended in the container's own style (its separator, the file's indent
//! unit and line ending); a removed one takes the separator it was written with. Appending and
//! then removing the same thing therefore gives back the original text byte for byte.
//!
//! Edits are computed from two values — the document as parsed and as the installer wants it —
//! and the result is checked by parsing it again; whatever this can't express (an element
//! inserted in the middle of an array, a text it can't read) falls back to re-writing the whole
//! document in its detected indentation.

use serde_json::{Map, Value};

/// `text` (which parses to `old`) changed so that it parses to `new`, with every part the change
/// doesn't touch kept as written.
pub fn edit(text: &str, old: &Value, new: &Value) -> String {
    let style = Style::detect(text);
    if old == new {
        return text.to_owned();
    }
    let spliced = Parser::new(text).document().and_then(|root| {
        let mut edits = Vec::new();
        patch(text, &style, &root, old, new, &mut edits)?;
        apply(text, edits)
    });
    match spliced {
        Some(result) if serde_json::from_str::<Value>(&result).is_ok_and(|value| value == *new) => {
            result
        }
        _ => style.document(new, text.ends_with('\n') || text.trim().is_empty()),
    }
}

/// The file's indentation unit and line ending.
struct Style {
    indent: String,
    newline: &'static str,
}

impl Style {
    fn detect(text: &str) -> Style {
        let newline = if text.contains("\r\n") { "\r\n" } else { "\n" };
        let indent = text
            .lines()
            .skip(1)
            .map(|line| {
                let trimmed = line.trim_start_matches([' ', '\t']);
                (&line[..line.len() - trimmed.len()], trimmed)
            })
            .find(|(lead, rest)| !lead.is_empty() && !rest.trim().is_empty())
            .map(|(lead, _)| match lead.chars().next() {
                Some('\t') => String::from("\t"),
                _ => lead.chars().take_while(|c| *c == ' ').collect(),
            })
            .unwrap_or_else(|| String::from("  "));
        Style { indent, newline }
    }

    /// `value` written over several lines, its first line where it is placed, the others indented
    /// from `base`.
    fn render(&self, value: &Value, base: &str) -> String {
        let formatter = serde_json::ser::PrettyFormatter::with_indent(self.indent.as_bytes());
        let mut out = Vec::new();
        let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
        if serde::Serialize::serialize(value, &mut serializer).is_err() {
            return value.to_string();
        }
        String::from_utf8_lossy(&out).replace('\n', &format!("{}{base}", self.newline))
    }

    /// A whole document in this style.
    fn document(&self, value: &Value, final_newline: bool) -> String {
        let mut text = self.render(value, "");
        if final_newline {
            text.push_str(self.newline);
        }
        text
    }
}

/// A value's place in the text: `start..end` covers it (brackets included).
struct Node {
    start: usize,
    end: usize,
    kind: Kind,
}

enum Kind {
    Scalar,
    /// Members in text order, each with its decoded key; `colon` is the text from the first key's
    /// end to its value (`": "` when there is no member).
    Object {
        members: Vec<Member>,
        colon: String,
    },
    Array(Vec<Node>),
}

/// An object member: its decoded key, where the key starts, and its value.
struct Member {
    key: String,
    key_start: usize,
    value: Node,
}

/// A lenient reader of text serde_json already accepted: it only records where things are.
struct Parser<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Parser<'a> {
        Parser { text, at: 0 }
    }

    fn document(mut self) -> Option<Node> {
        let node = self.value()?;
        self.space();
        (self.at == self.text.len()).then_some(node)
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.peek() == Some(byte)).then(|| self.at += 1)
    }

    fn value(&mut self) -> Option<Node> {
        self.space();
        let start = self.at;
        let kind = match self.peek()? {
            b'{' => self.object()?,
            b'[' => self.array()?,
            b'"' => {
                self.string()?;
                Kind::Scalar
            }
            _ => {
                while self.peek().is_some_and(|b| {
                    !matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b',' | b']' | b'}')
                }) {
                    self.at += 1;
                }
                if self.at == start {
                    return None;
                }
                Kind::Scalar
            }
        };
        Some(Node {
            start,
            end: self.at,
            kind,
        })
    }

    fn string(&mut self) -> Option<()> {
        self.expect(b'"')?;
        loop {
            match self.peek()? {
                b'\\' => self.at += 2,
                b'"' => {
                    self.at += 1;
                    return Some(());
                }
                _ => self.at += 1,
            }
        }
    }

    fn object(&mut self) -> Option<Kind> {
        self.expect(b'{')?;
        let mut members = Vec::new();
        let mut colon = None;
        self.space();
        if self.expect(b'}').is_some() {
            return Some(Kind::Object {
                members,
                colon: String::from(": "),
            });
        }
        loop {
            self.space();
            let key_start = self.at;
            self.string()?;
            let key: String = serde_json::from_str(&self.text[key_start..self.at]).ok()?;
            let key_end = self.at;
            self.space();
            self.expect(b':')?;
            let value = self.value()?;
            colon.get_or_insert_with(|| self.text[key_end..value.start].to_owned());
            members.push(Member {
                key,
                key_start,
                value,
            });
            self.space();
            if self.expect(b',').is_none() {
                self.expect(b'}')?;
                return Some(Kind::Object {
                    members,
                    colon: colon.unwrap_or_default(),
                });
            }
        }
    }

    fn array(&mut self) -> Option<Kind> {
        self.expect(b'[')?;
        let mut items = Vec::new();
        self.space();
        if self.expect(b']').is_some() {
            return Some(Kind::Array(items));
        }
        loop {
            items.push(self.value()?);
            self.space();
            if self.expect(b',').is_none() {
                self.expect(b']')?;
                return Some(Kind::Array(items));
            }
        }
    }
}

/// One replacement of `start..end` by `text`.
type Splice = (usize, usize, String);

/// Collects the splices turning `node` (holding `old`) into `new`; `None` when they can't be
/// expressed as splices.
fn patch(
    text: &str,
    style: &Style,
    node: &Node,
    old: &Value,
    new: &Value,
    edits: &mut Vec<Splice>,
) -> Option<()> {
    if old == new {
        return Some(());
    }
    match (&node.kind, old, new) {
        (Kind::Object { members, colon }, Value::Object(old), Value::Object(new)) => {
            patch_object(text, style, node, (members, colon), old, new, edits)
        }
        (Kind::Array(items), Value::Array(old), Value::Array(new)) if old.len() == new.len() => {
            for ((item, old), new) in items.iter().zip(old).zip(new) {
                patch(text, style, item, old, new, edits)?;
            }
            Some(())
        }
        (Kind::Array(items), Value::Array(old), Value::Array(new)) => {
            patch_array(text, style, node, items, old, new, edits)
        }
        _ => {
            let base = line_indent(text, node.start);
            edits.push((node.start, node.end, style.render(new, base)));
            Some(())
        }
    }
}

fn patch_object(
    text: &str,
    style: &Style,
    node: &Node,
    (members, colon): (&[Member], &str),
    old: &Map<String, Value>,
    new: &Map<String, Value>,
    edits: &mut Vec<Splice>,
) -> Option<()> {
    let mut removed = Vec::new();
    for (index, member) in members.iter().enumerate() {
        match new.get(&member.key) {
            None => removed.push(index),
            // With a key written twice, the last one is the value (as serde_json reads it).
            Some(value)
                if members[index + 1..]
                    .iter()
                    .all(|other| other.key != member.key) =>
            {
                patch(
                    text,
                    style,
                    &member.value,
                    old.get(&member.key)?,
                    value,
                    edits,
                )?;
            }
            Some(_) => {}
        }
    }
    let added: Vec<(String, &Value)> = new
        .iter()
        .filter(|(key, _)| !old.contains_key(*key))
        .map(|(key, value)| (format!("{}{colon}", Value::from(key.as_str())), value))
        .collect();
    let spans: Vec<(usize, usize)> = members
        .iter()
        .map(|member| (member.key_start, member.value.end))
        .collect();
    splice_container(text, style, node, &spans, &removed, &added, edits)
}

fn patch_array(
    text: &str,
    style: &Style,
    node: &Node,
    items: &[Node],
    old: &[Value],
    new: &[Value],
    edits: &mut Vec<Splice>,
) -> Option<()> {
    // Align by equality (longest common subsequence); between two kept elements, changed ones
    // are patched pairwise, the rest removed; new elements may only come at the end.
    let (n, m) = (old.len(), new.len());
    let mut table = vec![vec![0usize; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            table[i][j] = if old[i] == new[j] {
                table[i + 1][j + 1] + 1
            } else {
                table[i + 1][j].max(table[i][j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let (mut gap_old, mut gap_new) = (Vec::new(), Vec::new());
    let mut removed = Vec::new();
    let mut appended: Vec<&Value> = Vec::new();
    let mut settle = |gap_old: &mut Vec<usize>,
                      gap_new: &mut Vec<usize>,
                      at_end: bool,
                      edits: &mut Vec<Splice>|
     -> Option<()> {
        let pairs = gap_old.len().min(gap_new.len());
        for (&o, &k) in gap_old.iter().zip(gap_new.iter()) {
            patch(text, style, &items[o], &old[o], &new[k], edits)?;
        }
        removed.extend_from_slice(&gap_old[pairs..]);
        if gap_new.len() > pairs {
            if !at_end {
                return None;
            }
            appended.extend(gap_new[pairs..].iter().map(|&k| &new[k]));
        }
        gap_old.clear();
        gap_new.clear();
        Some(())
    };
    while i < n || j < m {
        if i < n && j < m && old[i] == new[j] {
            settle(&mut gap_old, &mut gap_new, false, edits)?;
            i += 1;
            j += 1;
        } else if j < m && (i == n || table[i][j + 1] >= table[i + 1][j]) {
            gap_new.push(j);
            j += 1;
        } else {
            gap_old.push(i);
            i += 1;
        }
    }
    settle(&mut gap_old, &mut gap_new, true, edits)?;
    let added: Vec<(String, &Value)> = appended.into_iter().map(|v| (String::new(), v)).collect();
    let spans: Vec<(usize, usize)> = items.iter().map(|item| (item.start, item.end)).collect();
    splice_container(text, style, node, &spans, &removed, &added, edits)
}

/// Removes the elements at `removed` (indices into `spans`, ascending) and appends `added`
/// (each a prefix — `"key": ` for a member — and a value) to the container `node`.
fn splice_container(
    text: &str,
    style: &Style,
    node: &Node,
    spans: &[(usize, usize)],
    removed: &[usize],
    added: &[(String, &Value)],
    edits: &mut Vec<Splice>,
) -> Option<()> {
    if removed.is_empty() && added.is_empty() {
        return Some(());
    }
    let inner = (node.start + 1, node.end - 1);
    let own = line_indent(text, node.start);
    let kept = spans.len() - removed.len();
    if kept == 0 {
        // Nothing of the old content stays: the container is written anew.
        let mut body = String::new();
        if !added.is_empty() {
            let base = format!("{own}{}", style.indent);
            for (index, (prefix, value)) in added.iter().enumerate() {
                body.push_str(if index == 0 { "" } else { "," });
                body.push_str(style.newline);
                body.push_str(&base);
                body.push_str(prefix);
                body.push_str(&style.render(value, &base));
            }
            body.push_str(style.newline);
            body.push_str(own);
        }
        edits.push((inner.0, inner.1, body));
        return Some(());
    }
    let first_kept = (0..spans.len()).find(|index| !removed.contains(index))?;
    for &index in removed {
        if index < first_kept {
            continue;
        }
        edits.push((spans[index - 1].1, spans[index].1, String::new()));
    }
    if first_kept > 0 {
        edits.push((spans[0].0, spans[first_kept].0, String::new()));
    }
    if !added.is_empty() {
        // The separator the container already uses (`,` and what follows it).
        let separator = if spans.len() >= 2 {
            text[spans[0].1..spans[1].0].to_owned()
        } else {
            format!(",{}", &text[inner.0..spans[0].0])
        };
        let multiline = separator.contains('\n');
        let base = match separator.rfind('\n') {
            Some(at) => separator[at + 1..].to_owned(),
            None => String::new(),
        };
        let mut body = String::new();
        for (prefix, value) in added {
            body.push_str(&separator);
            body.push_str(prefix);
            if multiline {
                body.push_str(&style.render(value, &base));
            } else {
                body.push_str(&value.to_string());
            }
        }
        let last = spans.last()?.1;
        edits.push((last, last, body));
    }
    Some(())
}

/// The whitespace that starts the line holding byte `at`.
fn line_indent(text: &str, at: usize) -> &str {
    let line_start = text[..at].rfind('\n').map_or(0, |found| found + 1);
    let line = &text[line_start..at];
    &line[..line.len() - line.trim_start_matches([' ', '\t']).len()]
}

/// Applies non-overlapping splices; `None` when two overlap.
fn apply(text: &str, mut edits: Vec<Splice>) -> Option<String> {
    edits.sort_by_key(|(start, end, _)| (*start, *end));
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (start, end, replacement) in edits {
        if start < at {
            return None;
        }
        out.push_str(&text[at..start]);
        out.push_str(&replacement);
        at = end;
    }
    out.push_str(&text[at..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// `text` edited by `change`, and then back.
    fn round_trip(text: &str, change: impl FnOnce(&mut Value)) -> (String, String) {
        let old: Value = serde_json::from_str(text).unwrap();
        let mut new = old.clone();
        change(&mut new);
        let edited = edit(text, &old, &new);
        assert_eq!(serde_json::from_str::<Value>(&edited).unwrap(), new);
        (edited.clone(), edit(&edited, &new, &old))
    }

    #[test]
    fn appending_and_removing_gives_back_the_same_bytes() {
        let text = "{\n    \"zeta\": [1, 2,   3],\n    \"alpha\": {\"x\": true},\n    \"hooks\": {\n        \"Stop\": [\n            {\"hooks\": []}\n        ]\n    }\n}";
        let (edited, back) = round_trip(text, |value| {
            value["hooks"]["Stop"]
                .as_array_mut()
                .unwrap()
                .push(json!({"hooks": [{"type": "command"}]}));
            value["hooks"]["Start"] = json!([{"hooks": [{"type": "command"}]}]);
            value["mcp"] = json!({"zuno": {"args": ["a", "b"]}});
        });
        assert_eq!(back, text, "byte for byte");
        assert!(
            edited.starts_with("{\n    \"zeta\": [1, 2,   3],\n    \"alpha\": {\"x\": true},"),
            "{edited}"
        );
        assert!(
            edited.contains(
                "\n            {\"hooks\": []},\n            {\n                \"hooks\": [\n"
            ),
            "new elements follow the container's style and the file's four spaces:\n{edited}"
        );
        assert!(edited.ends_with("    }\n}"), "{edited}");
    }

    #[test]
    fn tabs_crlf_and_one_liners_keep_their_style() {
        let tabs = "{\r\n\t\"model\": \"opus\"\r\n}\r\n";
        let (edited, back) = round_trip(tabs, |value| value["hooks"] = json!({"Stop": []}));
        assert_eq!(back, tabs);
        assert_eq!(
            edited,
            "{\r\n\t\"model\": \"opus\",\r\n\t\"hooks\": {\r\n\t\t\"Stop\": []\r\n\t}\r\n}\r\n"
        );

        let compact = "{\"a\":1,\"b\":[true]}";
        let (edited, back) = round_trip(compact, |value| value["c"] = json!({"d": 2}));
        assert_eq!(back, compact);
        assert_eq!(edited, "{\"a\":1,\"b\":[true],\"c\":{\"d\":2}}");
    }

    #[test]
    fn a_changed_value_is_replaced_where_it_stands() {
        let text = "{\n  \"b\": {\"command\": \"old\", \"timeout\": 5},\n  \"a\": 1\n}\n";
        let old: Value = serde_json::from_str(text).unwrap();
        let mut new = old.clone();
        new["b"]["command"] = json!("new \"quoted\"");
        assert_eq!(
            edit(text, &old, &new),
            "{\n  \"b\": {\"command\": \"new \\\"quoted\\\"\", \"timeout\": 5},\n  \"a\": 1\n}\n"
        );
    }

    #[test]
    fn removing_first_middle_and_all_elements() {
        let text = "[\n  1,\n  2,\n  3,\n  4\n]";
        let old: Value = serde_json::from_str(text).unwrap();
        assert_eq!(edit(text, &old, &json!([3, 4])), "[\n  3,\n  4\n]");
        assert_eq!(edit(text, &old, &json!([1, 4])), "[\n  1,\n  4\n]");
        assert_eq!(edit(text, &old, &json!([])), "[]");
        assert_eq!(edit(text, &old, &json!([1, 2, 5])), "[\n  1,\n  2,\n  5\n]");
        // An element inserted in the middle can't be spliced: the document is rewritten in its
        // own indentation.
        assert_eq!(
            edit(text, &old, &json!([1, 9, 2, 3, 4])),
            "[\n  1,\n  9,\n  2,\n  3,\n  4\n]"
        );
    }

    #[test]
    fn a_key_written_twice_and_escaped_keys_are_read_as_serde_json_reads_them() {
        let text = "{\"a\\\"b\": 1, \"k\": 1, \"k\": 2}";
        let old: Value = serde_json::from_str(text).unwrap();
        let mut new = old.clone();
        new["k"] = json!(3);
        new.as_object_mut().unwrap().remove("a\"b");
        let edited = edit(text, &old, &new);
        assert_eq!(serde_json::from_str::<Value>(&edited).unwrap(), new);
        assert_eq!(edited, "{\"k\": 1, \"k\": 3}");
    }
}

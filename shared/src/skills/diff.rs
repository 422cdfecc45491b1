//! A small line-based unified diff (LCS), enough for Skill files of a few dozen lines.

/// The unified diff turning `old` into `new` (`None` = the file is absent), with `a/` and `b/`
/// labels and three lines of context. Empty when nothing changes.
pub fn unified(label: &str, old: Option<&str>, new: Option<&str>) -> String {
    let a: Vec<&str> = old.map(|t| t.lines().collect()).unwrap_or_default();
    let b: Vec<&str> = new.map(|t| t.lines().collect()).unwrap_or_default();
    if old == new {
        return String::new();
    }
    let ops = lcs_ops(&a, &b);
    let from = if old.is_some() {
        format!("a/{label}")
    } else {
        String::from("/dev/null")
    };
    let to = if new.is_some() {
        format!("b/{label}")
    } else {
        String::from("/dev/null")
    };
    let mut out = format!("--- {from}\n+++ {to}\n");
    // Group changes into hunks with up to 3 lines of context.
    const CONTEXT: usize = 3;
    let changed: Vec<usize> = ops
        .iter()
        .enumerate()
        .filter(|(_, op)| !matches!(op, Op::Same(..)))
        .map(|(i, _)| i)
        .collect();
    let mut index = 0;
    while index < changed.len() {
        let start = changed[index].saturating_sub(CONTEXT);
        let mut end = (changed[index] + CONTEXT + 1).min(ops.len());
        while index + 1 < changed.len() && changed[index + 1] <= end + CONTEXT {
            index += 1;
            end = (changed[index] + CONTEXT + 1).min(ops.len());
        }
        index += 1;
        let (mut a_start, mut b_start) = (0usize, 0usize);
        for op in &ops[..start] {
            match op {
                Op::Same(..) => {
                    a_start += 1;
                    b_start += 1;
                }
                Op::Del(_) => a_start += 1,
                Op::Add(_) => b_start += 1,
            }
        }
        let hunk = &ops[start..end];
        let a_len = hunk.iter().filter(|op| !matches!(op, Op::Add(_))).count();
        let b_len = hunk.iter().filter(|op| !matches!(op, Op::Del(_))).count();
        let a_from = if a_len == 0 { a_start } else { a_start + 1 };
        let b_from = if b_len == 0 { b_start } else { b_start + 1 };
        out.push_str(&format!("@@ -{a_from},{a_len} +{b_from},{b_len} @@\n"));
        for op in hunk {
            match op {
                Op::Same(line, _) => out.push_str(&format!(" {line}\n")),
                Op::Del(line) => out.push_str(&format!("-{line}\n")),
                Op::Add(line) => out.push_str(&format!("+{line}\n")),
            }
        }
    }
    out
}

enum Op<'a> {
    Same(&'a str, ()),
    Del(&'a str),
    Add(&'a str),
}

fn lcs_ops<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<Op<'a>> {
    let (n, m) = (a.len(), b.len());
    let mut table = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            table[i][j] = if a[i] == b[j] {
                table[i + 1][j + 1] + 1
            } else {
                table[i + 1][j].max(table[i][j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut ops = Vec::new();
    while i < n && j < m {
        if a[i] == b[j] {
            ops.push(Op::Same(a[i], ()));
            i += 1;
            j += 1;
        } else if table[i + 1][j] >= table[i][j + 1] {
            ops.push(Op::Del(a[i]));
            i += 1;
        } else {
            ops.push(Op::Add(b[j]));
            j += 1;
        }
    }
    ops.extend(a[i..].iter().map(|l| Op::Del(l)));
    ops.extend(b[j..].iter().map(|l| Op::Add(l)));
    ops
}

#[cfg(test)]
mod tests {
    use super::unified;

    #[test]
    fn a_new_file_is_all_additions() {
        let diff = unified("x/SKILL.md", None, Some("a\nb\n"));
        assert_eq!(
            diff,
            "--- /dev/null\n+++ b/x/SKILL.md\n@@ -0,0 +1,2 @@\n+a\n+b\n"
        );
    }

    #[test]
    fn a_changed_line_shows_context() {
        let diff = unified("f", Some("1\n2\n3\n"), Some("1\nX\n3\n"));
        assert_eq!(diff, "--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n 1\n-2\n+X\n 3\n");
        assert_eq!(unified("f", Some("same"), Some("same")), "");
    }
}

//! Consolidation at the cap: how a write that would cross its document's character cap fits.
//!
//! Instead of refusing, the write consolidates the document in its own transaction:
//!
//! 1. Entries stating the same rule in other words ([`super::dedupe`]) become one: the more
//!    valuable one stays (a person's entry over a derived one; then the one in use, the one not
//!    violated, the one already in the document, the older one) and the other's supporting
//!    experiences move onto it.
//! 2. Derived entries are dropped, least valuable first, until the result fits: an entry none
//!    of whose sources still stands, then one never recalled (no supporting experience was ever
//!    selected into a prompt or reinforced), then one that was violated, then the one with the
//!    fewest standing sources, then the least used, and only among equals the oldest.
//!
//! Entries a person wrote or imported are never merged away or dropped, and neither are entries
//! an automatic writer stated without evidence: only what learning derived from evidence can be
//! learned again from it. The write's own new text is never dropped to make room for itself. When
//! only such entries remain and the result still does not fit, the write is refused as before.
//!
//! This module only plans; the memory service applies the plan and records it in the revision
//! and the candidate journal.

use std::cmp::Reverse;
use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::dedupe::RuleSignature;
use super::store::Entry;
use super::write_check::document_chars;

/// What is known of an entry's worth, from the experiences supporting it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntryValue {
    /// Supporting experiences that are active with unchanged sources.
    pub live_sources: i64,
    /// Times a supporting experience was selected into a prompt or reinforced.
    pub uses: i64,
    /// Times a supporting experience was violated (the user corrected a turn that used it).
    pub violations: i64,
    /// The supporting experience ids.
    pub evidence: Vec<String>,
}

impl EntryValue {
    fn absorb(&mut self, other: &EntryValue) {
        self.live_sources += other.live_sources;
        self.uses += other.uses;
        self.violations += other.violations;
        for id in &other.evidence {
            if !self.evidence.contains(id) {
                self.evidence.push(id.clone());
            }
        }
    }
}

/// Why an entry was dropped, by the first rule that ranked it lowest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// None of its sources still stands; prompts were already withholding it.
    Unsupported,
    /// No supporting experience was ever recalled into a prompt or reinforced.
    Unused,
    /// A supporting experience was violated.
    Violated,
    /// In use and never violated, but with the fewest standing sources, then the least use; the
    /// oldest among equals. (Recorded as `oldest` before evidence strength ranked first.)
    #[serde(alias = "oldest")]
    Weakest,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DroppedEntry {
    pub entry_id: String,
    pub content: String,
    pub reason: DropReason,
    /// The experiences that supported it.
    pub evidence: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MergedEntry {
    /// The entry merged away; none when it was the text this write proposed.
    pub entry_id: Option<String>,
    pub content: String,
    /// The experiences that supported it; they now support the kept entry.
    pub evidence: Vec<String>,
    /// The kept entry; none in a plan whose kept entry is the write's own new text and does not
    /// exist yet (a candidate still pending review).
    pub into_entry_id: Option<String>,
    pub into: String,
}

/// What a write merged and dropped to fit its document's cap.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Consolidation {
    /// The cap, in Unicode scalar values.
    pub limit: usize,
    /// The size the write's result would have had without consolidation.
    pub chars_before: usize,
    pub chars_after: usize,
    pub merged: Vec<MergedEntry>,
    pub dropped: Vec<DroppedEntry>,
}

/// How the write's new text will be held once it is an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Written or imported by a person: never merged away or dropped.
    Protected,
    /// Stated by an automatic writer without evidence: kept, since nothing could teach it again.
    Asserted,
    /// Derived from evidence by learning: may be merged away or dropped.
    Derived,
}

impl Standing {
    pub fn of(entry: &Entry) -> Standing {
        if matches!(entry.owner.as_str(), "user" | "imported") {
            Standing::Protected
        } else if entry.derived {
            Standing::Derived
        } else {
            Standing::Asserted
        }
    }
}

/// The planned result: the entries after the write and what consolidation did.
#[derive(Debug, Clone, PartialEq)]
pub struct Fitted {
    pub after: Vec<String>,
    pub consolidation: Consolidation,
}

/// One text of the write's result.
struct Slot<'a> {
    content: &'a str,
    /// The current entry this text keeps; none for the write's new text.
    entry: Option<&'a Entry>,
    standing: Standing,
    value: EntryValue,
    signature: RuleSignature,
    removed: bool,
}

impl Slot<'_> {
    fn used(&self) -> bool {
        self.value.uses > 0
    }

    fn violated(&self) -> bool {
        self.value.violations > 0
    }

    fn created_revision(&self) -> i64 {
        self.entry.map_or(i64::MAX, |e| e.created_revision)
    }

    /// Higher is kept when two slots state the same rule.
    fn keep_rank(&self, index: usize) -> impl Ord {
        (
            self.standing != Standing::Derived,
            self.used(),
            !self.violated(),
            self.entry.is_some(),
            Reverse(self.created_revision()),
            Reverse(index),
        )
    }

    /// Lower is dropped first.
    fn drop_rank(&self) -> impl Ord {
        (
            self.value.live_sources > 0,
            self.used(),
            !self.violated(),
            // Evidence strength, then use, before age: recency alone never decides.
            self.value.live_sources,
            self.value.uses,
            self.created_revision(),
            self.entry.map_or(i64::MAX, |e| e.position),
        )
    }

    fn drop_reason(&self) -> DropReason {
        if self.value.live_sources == 0 {
            DropReason::Unsupported
        } else if !self.used() {
            DropReason::Unused
        } else if self.violated() {
            DropReason::Violated
        } else {
            DropReason::Weakest
        }
    }
}

/// Plans how `after` (the write's result, over `limit`) fits: `entries` are the document's
/// current entries, `values` their worth by entry id, `new_text` how the write's new text will
/// be held and `new_evidence` what supports it. Returns the smallest size consolidation can
/// reach when that is still over the cap.
pub fn fit(
    after: &[String],
    entries: &[Entry],
    values: &HashMap<String, EntryValue>,
    new_text: Standing,
    new_evidence: &[String],
    limit: usize,
) -> Result<Fitted, usize> {
    let chars_before = document_chars(after);
    let mut slots = slots_of(after, entries, values, new_text, new_evidence);
    let merged = merge_same_rules(&mut slots);
    let (dropped, chars) = drop_until_under(&mut slots, limit);
    if chars > limit {
        return Err(chars);
    }
    Ok(Fitted {
        after: remaining(&slots),
        consolidation: Consolidation {
            limit,
            chars_before,
            chars_after: chars,
            merged,
            dropped,
        },
    })
}

/// One slot per text of `after`, holding the current entry it keeps (if any), how it is held
/// and what it is worth.
fn slots_of<'a>(
    after: &'a [String],
    entries: &'a [Entry],
    values: &HashMap<String, EntryValue>,
    new_text: Standing,
    new_evidence: &[String],
) -> Vec<Slot<'a>> {
    let mut unclaimed: Vec<&Entry> = entries.iter().collect();
    after
        .iter()
        .map(|content| {
            let entry = unclaimed
                .iter()
                .position(|e| &e.content == content)
                .map(|index| unclaimed.remove(index));
            let (standing, value) = match entry {
                Some(entry) => (
                    Standing::of(entry),
                    values.get(&entry.id).cloned().unwrap_or_default(),
                ),
                None => (
                    new_text,
                    EntryValue {
                        live_sources: new_evidence.len() as i64,
                        evidence: new_evidence.to_vec(),
                        ..EntryValue::default()
                    },
                ),
            };
            Slot {
                content,
                entry,
                standing,
                value,
                signature: RuleSignature::of(content),
                removed: false,
            }
        })
        .collect()
}

/// Merges derived entries into another entry stating the same rule (the better-ranked one is
/// kept and absorbs the other's evidence).
fn merge_same_rules(slots: &mut [Slot<'_>]) -> Vec<MergedEntry> {
    let mut merged = Vec::new();
    for first in 0..slots.len() {
        for second in first + 1..slots.len() {
            if slots[first].removed
                || slots[second].removed
                || !slots[first]
                    .signature
                    .same_rule_as(&slots[second].signature)
            {
                continue;
            }
            let (kept, lost) = if slots[first].keep_rank(first) >= slots[second].keep_rank(second) {
                (first, second)
            } else {
                (second, first)
            };
            if slots[lost].standing != Standing::Derived {
                continue;
            }
            slots[lost].removed = true;
            let lost_value = slots[lost].value.clone();
            slots[kept].value.absorb(&lost_value);
            merged.push(MergedEntry {
                entry_id: slots[lost].entry.map(|e| e.id.clone()),
                content: slots[lost].content.to_owned(),
                evidence: lost_value.evidence,
                into_entry_id: slots[kept].entry.map(|e| e.id.clone()),
                into: slots[kept].content.to_owned(),
            });
        }
    }
    merged
}

fn remaining(slots: &[Slot<'_>]) -> Vec<String> {
    slots
        .iter()
        .filter(|s| !s.removed)
        .map(|s| s.content.to_owned())
        .collect()
}

/// Drops derived current entries, least worth first, until the document fits `limit` or
/// nothing droppable is left. Returns what was dropped and the size reached.
fn drop_until_under(slots: &mut [Slot<'_>], limit: usize) -> (Vec<DroppedEntry>, usize) {
    let mut droppable: Vec<usize> = (0..slots.len())
        .filter(|&i| {
            !slots[i].removed && slots[i].entry.is_some() && slots[i].standing == Standing::Derived
        })
        .collect();
    droppable.sort_by(|&a, &b| slots[a].drop_rank().cmp(&slots[b].drop_rank()));
    let mut dropped = Vec::new();
    let mut chars = document_chars(&remaining(slots));
    for index in droppable {
        if chars <= limit {
            break;
        }
        let slot = &mut slots[index];
        slot.removed = true;
        dropped.push(DroppedEntry {
            entry_id: slot.entry.map(|e| e.id.clone()).unwrap_or_default(),
            content: slot.content.to_owned(),
            reason: slot.drop_reason(),
            evidence: slot.value.evidence.clone(),
        });
        chars = document_chars(&remaining(slots));
    }
    (dropped, chars)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, content: &str, owner: &str, derived: bool, revision: i64) -> Entry {
        Entry {
            id: id.into(),
            content: content.into(),
            owner: owner.into(),
            derived,
            position: revision,
            created_revision: revision,
        }
    }

    fn derived(id: &str, content: &str, revision: i64) -> Entry {
        entry(id, content, "automatic", true, revision)
    }

    fn value(live: i64, uses: i64, violations: i64) -> EntryValue {
        EntryValue {
            live_sources: live,
            uses,
            violations,
            evidence: vec![String::from("exp")],
        }
    }

    fn with(entries: &[Entry], new: &str) -> Vec<String> {
        entries
            .iter()
            .map(|e| e.content.clone())
            .chain([new.to_owned()])
            .collect()
    }

    #[test]
    fn drops_unsupported_then_unused_then_violated_then_weakest_evidence_not_oldest() {
        let entries = [
            derived("old-used", "Rule aaaa.", 1),
            derived("violated", "Rule bbbb.", 2),
            derived("unused", "Rule cccc.", 3),
            derived("unsupported", "Rule dddd.", 4),
            derived("new-used", "Rule eeee.", 5),
        ];
        // The newer used entry rests on one source, the older on two: the newer goes first.
        let values = HashMap::from([
            (String::from("old-used"), value(2, 1, 0)),
            (String::from("violated"), value(1, 5, 1)),
            (String::from("unused"), value(1, 0, 0)),
            (String::from("unsupported"), value(0, 9, 0)),
            (String::from("new-used"), value(1, 3, 0)),
        ]);
        let after = with(&entries, "Rule ffff.");
        let order: Vec<(String, DropReason)> = (1..=5)
            .map(|drops| {
                // Each entry is 10 characters plus a separator.
                let limit = document_chars(&after) - 11 * drops;
                let fitted = fit(
                    &after,
                    &entries,
                    &values,
                    Standing::Derived,
                    &[String::from("exp-new")],
                    limit,
                )
                .unwrap();
                let last = fitted.consolidation.dropped.last().unwrap();
                assert_eq!(fitted.consolidation.dropped.len(), drops);
                assert!(fitted.after.contains(&String::from("Rule ffff.")));
                (last.entry_id.clone(), last.reason)
            })
            .collect();
        assert_eq!(
            order,
            [
                (String::from("unsupported"), DropReason::Unsupported),
                (String::from("unused"), DropReason::Unused),
                (String::from("violated"), DropReason::Violated),
                (String::from("new-used"), DropReason::Weakest),
                (String::from("old-used"), DropReason::Weakest),
            ]
        );
    }

    #[test]
    fn protected_and_asserted_entries_are_never_dropped() {
        let entries = [
            entry("mine", "Use tabs.", "user", false, 1),
            entry("imported", "Use pnpm.", "imported", false, 2),
            entry("tool", "Run nextest.", "automatic", false, 3),
            derived("learned", "Keep commits small.", 4),
        ];
        let after = with(&entries, "Write docs.");
        let limit = document_chars(&after) - 1;
        let fitted = fit(
            &after,
            &entries,
            &HashMap::new(),
            Standing::Derived,
            &[],
            limit,
        )
        .unwrap();
        assert_eq!(
            fitted.after,
            ["Use tabs.", "Use pnpm.", "Run nextest.", "Write docs."]
        );
        // Nothing else may go: the smallest reachable size is reported.
        let smallest = document_chars(&fitted.after);
        assert_eq!(
            fit(
                &after,
                &entries,
                &HashMap::new(),
                Standing::Derived,
                &[],
                smallest - 1
            ),
            Err(smallest)
        );
    }

    #[test]
    fn the_same_rule_merges_into_the_entry_worth_keeping() {
        let entries = [
            derived("pnpm", "Use pnpm, not npm.", 1),
            entry("mine", "Never push to main.", "user", false, 2),
            derived("push", "Don't push to main", 3),
            derived("other", "Keep commits small.", 4),
        ];
        let values = HashMap::from([
            (String::from("pnpm"), value(1, 0, 0)),
            (String::from("push"), value(1, 2, 0)),
        ]);
        // The new text repeats an existing rule: it becomes support for that entry.
        let after = with(&entries, "use pnpm instead of npm");
        let fitted = fit(
            &after,
            &entries,
            &values,
            Standing::Derived,
            &[String::from("exp-new")],
            document_chars(&after) - 1,
        )
        .unwrap();
        assert_eq!(
            fitted.after,
            [
                "Use pnpm, not npm.",
                "Never push to main.",
                "Keep commits small."
            ]
        );
        let merged = &fitted.consolidation.merged;
        assert_eq!(merged.len(), 2, "{merged:?}");
        assert_eq!(merged[0].entry_id, None);
        assert_eq!(merged[0].evidence, ["exp-new"]);
        assert_eq!(merged[0].into_entry_id.as_deref(), Some("pnpm"));
        // A person's entry keeps its place even against a derived entry in use.
        assert_eq!(merged[1].entry_id.as_deref(), Some("push"));
        assert_eq!(merged[1].into_entry_id.as_deref(), Some("mine"));
        assert!(fitted.consolidation.dropped.is_empty());

        // A person's new text replaces the derived entry stating the same rule.
        let after = with(&entries, "Use pnpm instead of npm.");
        let fitted = fit(
            &after,
            &entries,
            &values,
            Standing::Protected,
            &[],
            document_chars(&after) - 1,
        )
        .unwrap();
        assert!(
            fitted
                .after
                .contains(&String::from("Use pnpm instead of npm."))
        );
        assert!(!fitted.after.contains(&String::from("Use pnpm, not npm.")));
        assert_eq!(fitted.consolidation.merged[0].into_entry_id, None);
    }
}

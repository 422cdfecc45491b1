//! Revisions: applying a planned write by compare-and-set on the document revision, undo, and
//! the entries, history and evidence each revision commits.

use std::collections::HashMap;

use crate::db::{StoreError, Tx};
use crate::memory::consolidate::Consolidation;
use crate::memory::store::{self, Document, Entry, MemoryCandidateState};

use super::{
    MemoryError, MemoryService, Origin, Outcome, Write, consolidation_json, contents, json,
};

impl MemoryService {
    /// Commits `write.after` as the document's next revision (compare-and-set on the revision
    /// the candidate was planned against) with its consolidation and the candidate's state, in
    /// the caller's transaction.
    pub(super) async fn apply_in(
        &self,
        tx: &mut Tx,
        candidate_id: &str,
        document: &Document,
        write: Write<'_>,
        now: i64,
    ) -> Result<i64, MemoryError> {
        let Write {
            after,
            origin,
            evidence,
            consolidation,
        } = write;
        if contents(&document.entries) == after {
            keep_unchanged_in(tx, candidate_id, document, consolidation, evidence, now).await?;
            return Ok(document.revision);
        }
        let revision = self.advance_in(tx, document, now).await?;
        let new_entry = NewEntryRule {
            owner: origin.owner(),
            derived: origin == Origin::Maintenance && !evidence.is_empty(),
            evidence,
        };
        let created = write_entries_in(tx, document, after, &new_entry, revision, now).await?;
        let consolidation = match consolidation {
            Some(consolidation) => Some(
                settle_consolidation_in(
                    tx,
                    &document.id,
                    consolidation,
                    &created,
                    evidence,
                    revision,
                    now,
                )
                .await?,
            ),
            None => None,
        };
        let consolidation = consolidation.as_ref().map(consolidation_json);
        self.revision_row_in(
            tx,
            &document.id,
            revision,
            after,
            "apply",
            consolidation.as_deref(),
            Some(candidate_id),
            now,
        )
        .await?;
        store::record_applied_in(tx, candidate_id, revision, consolidation.as_deref(), now).await?;
        Ok(revision)
    }

    /// `UPDATE … WHERE revision = <read revision>`: two writers cannot both replace one revision.
    pub(super) async fn advance_in(
        &self,
        tx: &mut Tx,
        document: &Document,
        now: i64,
    ) -> Result<i64, MemoryError> {
        store::advance_revision_in(tx, &document.id, document.revision, now)
            .await?
            .map_err(|current| MemoryError::Stale {
                expected: document.revision,
                current,
            })
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn revision_row_in(
        &self,
        tx: &mut Tx,
        document_id: &str,
        revision: i64,
        entries: &[String],
        change: &str,
        consolidation: Option<&str>,
        candidate_id: Option<&str>,
        now: i64,
    ) -> Result<(), MemoryError> {
        let entries = json(entries);
        let row = store::RevisionRow {
            document_id,
            revision,
            entries: &entries,
            change,
            consolidation,
            candidate_id,
        };
        store::insert_revision_in(tx, &row, now).await?;
        Ok(())
    }

    pub(super) async fn document_by_id_in(
        &self,
        tx: &mut Tx,
        document_id: &str,
    ) -> Result<Document, MemoryError> {
        store::document_by_id_in(tx, document_id)
            .await?
            .ok_or_else(|| {
                MemoryError::NotFound(format!("memory document `{document_id}` was not found"))
            })
    }

    /// Undoes an applied candidate: the document returns to the candidate's exact `before`
    /// snapshot as a new revision (only when nothing changed since; later changes are never
    /// silently discarded). Undone text is not resurrected automatically.
    pub async fn undo(&self, id: &str) -> Result<Outcome, MemoryError> {
        let now = self.now();
        let mut tx = self.db.begin().await?;
        let candidate = store::candidate_in(&mut tx, id).await?.ok_or_else(|| {
            MemoryError::NotFound(format!("memory candidate `{id}` was not found"))
        })?;
        if candidate.state != MemoryCandidateState::Applied {
            return Err(MemoryError::Conflict(format!(
                "memory candidate `{id}` is `{}`; only applied candidates can be undone",
                candidate.state
            )));
        }
        let document = self
            .document_by_id_in(&mut tx, &candidate.document_id)
            .await?;
        let after: Vec<String> =
            serde_json::from_str(candidate.after_entries.as_deref().unwrap_or("[]"))
                .unwrap_or_default();
        let before: Vec<String> =
            serde_json::from_str(candidate.before_entries.as_deref().unwrap_or("[]"))
                .unwrap_or_default();
        if contents(&document.entries) != after {
            return Err(MemoryError::Conflict(format!(
                "memory changed after candidate `{id}` was applied; undoing it would discard later changes"
            )));
        }
        let revision = self
            .restore_in(&mut tx, &document, &before, "undo", Some(id), now)
            .await?;
        for removed in after.iter().filter(|e| !before.contains(e)) {
            store::remember_forgotten_in(&mut tx, &document.id, removed, "undone", now).await?;
        }
        store::record_undone_in(&mut tx, id, revision, now).await?;
        let candidate = store::candidate_in(&mut tx, id).await?.expect("exists");
        tx.commit().await?;
        self.published(&document.id, candidate, false, revision)
            .await
    }

    /// Sets the document's entries to `target` (keeping entries that survive, retracting the rest,
    /// re-adding from history with their original owners where possible) as a new revision.
    pub(super) async fn restore_in(
        &self,
        tx: &mut Tx,
        document: &Document,
        target: &[String],
        change: &str,
        candidate_id: Option<&str>,
        now: i64,
    ) -> Result<i64, MemoryError> {
        let revision = self.advance_in(tx, document, now).await?;
        let mut remaining: Vec<&Entry> = document.entries.iter().collect();
        for (position, content) in target.iter().enumerate() {
            if let Some(index) = remaining.iter().position(|e| &e.content == content) {
                let entry = remaining.remove(index);
                store::set_position_in(tx, &entry.id, position as i64).await?;
            } else {
                let previous = store::latest_entry_with_in(tx, &document.id, content).await?;
                // An undo brings a derived entry back as derived, with its evidence, so it is
                // withheld and consolidated like any derived entry (an undone consolidation
                // restores the entries it dropped).
                let restored_from = previous
                    .as_ref()
                    .filter(|(_, _, derived)| change == "undo" && *derived)
                    .map(|(id, _, _)| id.clone());
                let owner =
                    previous.map_or_else(|| String::from("imported"), |(_, owner, _)| owner);
                let id = crate::ids::new_id("ment");
                let entry = store::NewEntry {
                    id: &id,
                    document_id: &document.id,
                    content,
                    owner: &owner,
                    derived: restored_from.is_some(),
                    position: position as i64,
                    revision,
                };
                store::insert_entry_in(tx, &entry, now).await?;
                if let Some(from) = restored_from {
                    store::copy_support_in(tx, &from, &id).await?;
                }
            }
        }
        for entry in remaining {
            store::retract_entry_in(tx, &entry.id, revision).await?;
        }
        self.revision_row_in(
            tx,
            &document.id,
            revision,
            target,
            change,
            None,
            candidate_id,
            now,
        )
        .await?;
        Ok(revision)
    }
}

/// Who owns the entries a write creates, whether they are derived, and the evidence that
/// supports them.
struct NewEntryRule<'a> {
    owner: &'a str,
    derived: bool,
    evidence: &'a [String],
}

/// Makes the document's current entries `after` at `revision`: kept entries stay (moving only
/// when the order requires), new ones are created with their support, the rest are retracted.
/// Returns the new texts' entry ids.
async fn write_entries_in(
    tx: &mut Tx,
    document: &Document,
    after: &[String],
    rule: &NewEntryRule<'_>,
    revision: i64,
    now: i64,
) -> Result<HashMap<String, String>, MemoryError> {
    let mut remaining: Vec<&Entry> = document.entries.iter().collect();
    let mut created = HashMap::new();
    // Positions only order the entries: a kept entry keeps its position while the order
    // allows, so removing entries (a consolidation drops several) rewrites no other row.
    let mut previous: Option<i64> = None;
    for content in after {
        let next = previous.map_or(0, |p| p + 1);
        if let Some(index) = remaining.iter().position(|e| &e.content == content) {
            let entry = remaining.remove(index);
            let position = entry.position.max(next);
            if position != entry.position {
                store::set_position_in(tx, &entry.id, position).await?;
            }
            previous = Some(position);
        } else {
            previous = Some(next);
            let id = crate::ids::new_id("ment");
            let entry = store::NewEntry {
                id: &id,
                document_id: &document.id,
                content,
                owner: rule.owner,
                derived: rule.derived,
                position: next,
                revision,
            };
            store::insert_entry_in(tx, &entry, now).await?;
            store::support_in(tx, &id, rule.evidence).await?;
            created.insert(content.clone(), id);
        }
    }
    for entry in remaining {
        store::retract_entry_in(tx, &entry.id, revision).await?;
    }
    Ok(created)
}

/// A write that leaves the document as it is (an existing entry, or a rule an entry already
/// states) keeps the document revision; its consolidation still records the new support.
async fn keep_unchanged_in(
    tx: &mut Tx,
    candidate_id: &str,
    document: &Document,
    consolidation: Option<Consolidation>,
    evidence: &[String],
    now: i64,
) -> Result<(), MemoryError> {
    let (detail, consolidation) = match consolidation {
        Some(consolidation) => (
            "no change: an entry already states this rule; the evidence now supports it",
            Some(
                settle_consolidation_in(
                    tx,
                    &document.id,
                    consolidation,
                    &HashMap::new(),
                    evidence,
                    document.revision,
                    now,
                )
                .await?,
            ),
        ),
        None => ("no change: the entry already exists", None),
    };
    let consolidation = consolidation.as_ref().map(consolidation_json);
    store::record_unchanged_in(
        tx,
        candidate_id,
        document.revision,
        detail,
        consolidation.as_deref(),
        now,
    )
    .await?;
    Ok(())
}

/// Carries out a consolidation in the caller's transaction once the write's entries exist:
/// merged entries' evidence moves onto the entry kept for their rule, and every text that
/// left is recorded so the same evidence cannot bring it back. `created` maps the write's
/// new texts to their new entry ids. Returns the consolidation with every kept entry's id.
async fn settle_consolidation_in(
    tx: &mut Tx,
    document_id: &str,
    mut consolidation: Consolidation,
    created: &HashMap<String, String>,
    new_evidence: &[String],
    revision: i64,
    now: i64,
) -> Result<Consolidation, MemoryError> {
    for merged in &mut consolidation.merged {
        if merged.into_entry_id.is_none() {
            merged.into_entry_id = created.get(&merged.into).cloned();
        }
        let Some(into) = merged.into_entry_id.clone() else {
            return Err(StoreError::Corrupt(format!(
                "consolidation kept `{}`, which the write did not create",
                merged.into
            ))
            .into());
        };
        match &merged.entry_id {
            Some(from) => store::copy_support_in(tx, from, &into).await?,
            None => store::support_in(tx, &into, new_evidence).await?,
        }
        store::record_dropped_in(
            tx,
            document_id,
            &merged.content,
            &merged.evidence,
            revision,
            now,
        )
        .await?;
    }
    for dropped in &consolidation.dropped {
        store::record_dropped_in(
            tx,
            document_id,
            &dropped.content,
            &dropped.evidence,
            revision,
            now,
        )
        .await?;
    }
    Ok(consolidation)
}

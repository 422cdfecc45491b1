//! The harness's report: per file and in total, as text for people and JSON for scripts.

use std::fmt::Write as _;

use serde::Serialize;

use super::score::{Figures, FileReport};

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub files: Vec<FileView>,
    pub total: FigureView,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FileView {
    #[serde(flatten)]
    pub report: FileReport,
    pub summary: FigureView,
}

/// Counts with the ratios computed from them.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FigureView {
    #[serde(flatten)]
    pub counts: Figures,
    pub precision: Option<f64>,
    pub lesson_recall: Option<f64>,
    pub recall_at_5: Option<f64>,
    pub recall_at_5_all: Option<f64>,
    /// recall@5 counting the retrieved items alone (resident Memory left out).
    pub recall_at_5_items: Option<f64>,
    pub recall_at_5_items_all: Option<f64>,
    /// recall@5 with the semantic layer off, beside `recall_at_5` (only when it is configured).
    pub recall_at_5_without_semantic: Option<f64>,
    pub recall_at_5_all_without_semantic: Option<f64>,
    pub false_recall: Option<f64>,
}

impl FigureView {
    fn of(counts: Figures) -> FigureView {
        FigureView {
            precision: counts.precision(),
            lesson_recall: counts.lesson_recall(),
            recall_at_5: counts.recall_at_5(),
            recall_at_5_all: counts.recall_at_5_all(),
            recall_at_5_items: counts.recall_at_5_items(),
            recall_at_5_items_all: counts.recall_at_5_items_all(),
            recall_at_5_without_semantic: counts.recall_at_5_without_semantic(),
            recall_at_5_all_without_semantic: counts.recall_at_5_all_without_semantic(),
            false_recall: counts.false_recall(),
            counts,
        }
    }
}

impl Report {
    pub fn new(files: Vec<FileReport>) -> Report {
        let mut total = Figures::default();
        for file in &files {
            total.add(&file.figures);
        }
        Report {
            files: files
                .into_iter()
                .map(|report| FileView {
                    summary: FigureView::of(report.figures.clone()),
                    report,
                })
                .collect(),
            total: FigureView::of(total),
        }
    }
}

fn percent(value: Option<f64>) -> String {
    value.map_or_else(|| String::from("–"), |v| format!("{v:.2}"))
}

fn line(figures: &FigureView) -> String {
    let c = &figures.counts;
    let mut text = format!(
        "precision {} ({}/{}) · lesson recall {} ({}/{}) · recall@5 {} ({}/{}; all follow-ups {}; items only {}, all {}) · false recall {} ({}/{}) · cross-project items {} · user-wide reached {}/{} · Memory {} (junk {}, contradicting labels {}) · duplicates {} · audit: {} shared subjects, {} duplicate rules, {} documents over their limit",
        percent(figures.precision),
        c.precise,
        c.experiences,
        percent(figures.lesson_recall),
        c.groups_found,
        c.lesson_groups,
        percent(figures.recall_at_5),
        c.follow_up_hits_extracted,
        c.follow_ups_extracted,
        percent(figures.recall_at_5_all),
        percent(figures.recall_at_5_items),
        percent(figures.recall_at_5_items_all),
        percent(figures.false_recall),
        c.false_recalls,
        c.negatives,
        c.cross_project_items,
        c.user_wide_reached,
        c.user_wide_lessons,
        c.memory_entries,
        c.junk_memory,
        c.label_contradictions,
        c.duplicates,
        c.shared_subjects,
        c.duplicate_rules,
        c.documents_over_limit,
    );
    if c.lexical_only_follow_ups > 0 {
        text.push_str(&format!(
            " · recall@5 without the semantic layer {} ({}/{}; all follow-ups {})",
            percent(figures.recall_at_5_without_semantic),
            c.lexical_only_hits_extracted,
            c.follow_ups_extracted,
            percent(figures.recall_at_5_all_without_semantic),
        ));
    }
    text
}

/// `zuno memory audit` in one line: per document its size against its limit, entries sharing
/// a subject and duplicate rules.
fn audit_line(audit: &zuno_shared::memory::audit::MemoryAudit) -> String {
    let documents: Vec<String> = audit
        .documents
        .iter()
        .map(|d| {
            format!(
                "{} {} entries {}/{} chars{}, {} shared subjects, {} duplicate rules",
                d.target.as_str(),
                d.entries,
                d.chars,
                d.char_limit,
                if d.within_limit { "" } else { " OVER" },
                d.shared_subjects.len(),
                d.duplicates.len()
            )
        })
        .collect();
    if documents.is_empty() {
        String::from("memory audit: no entries")
    } else {
        format!("memory audit: {}", documents.join(" · "))
    }
}

/// The Memory entries of one file, with the labels behind each and the lessons they contradict.
fn write_memory(out: &mut String, memory: &[super::score::MemoryLine]) {
    for entry in memory {
        let from: Vec<String> = entry
            .labels
            .iter()
            .map(|l| format!("line {} {:?}/{:?}", l.line, l.signal, l.strength).to_lowercase())
            .collect();
        let _ = writeln!(
            out,
            "   memory {}{}: {} (from {})",
            entry.scope,
            if entry.junk { " JUNK" } else { "" },
            entry.content,
            if from.is_empty() {
                String::from("unlabelled")
            } else {
                from.join(", ")
            }
        );
    }
    for entry in memory.iter().filter(|e| !e.contradicts.is_empty()) {
        let _ = writeln!(
            out,
            "   contradicts {}: {}",
            entry.contradicts.join(", "),
            entry.content
        );
    }
}

/// The report as text: per file its figures, experiences, Memory entries and misses.
pub fn print_text(report: &Report) -> String {
    let mut out = String::new();
    for file in &report.files {
        let r = &file.report;
        let _ = writeln!(out, "== {} ({}, {})", r.labels, r.project, r.extractor);
        let _ = writeln!(out, "   {}", line(&file.summary));
        for experience in &r.experiences {
            let label = experience.label.as_ref().map_or_else(
                || String::from("unlabelled"),
                |l| format!("{:?}/{:?}", l.signal, l.strength).to_lowercase(),
            );
            let _ = writeln!(
                out,
                "   {} {} [{}{}] {}",
                if experience.precise { "+" } else { "-" },
                experience.source,
                label,
                if experience.verified {
                    ""
                } else {
                    ", unverified"
                },
                experience.summary
            );
        }
        write_memory(&mut out, &r.memory);
        if let Some(audit) = &r.audit {
            let _ = writeln!(out, "   {}", audit_line(audit));
        }
        if !r.missed_groups.is_empty() {
            let _ = writeln!(out, "   missed lessons: {}", r.missed_groups.join(", "));
        }
        for miss in &r.missed_follow_ups {
            let _ = writeln!(
                out,
                "   not recalled ({}): {:?} → {:?}",
                miss.group, miss.prompt, miss.recalled
            );
        }
        for miss in &r.false_recalls {
            let _ = writeln!(
                out,
                "   false recall ({}): {:?} → {:?}",
                miss.group, miss.prompt, miss.recalled
            );
        }
        if !r.unlabelled.is_empty() {
            let _ = writeln!(out, "   unlabelled prompts at lines {:?}", r.unlabelled);
        }
        for problem in &r.label_problems {
            let _ = writeln!(out, "   LABEL PROBLEM: {problem}");
        }
        for issue in &r.issues {
            let _ = writeln!(out, "   issue: {issue}");
        }
        let jobs: Vec<String> = r.jobs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(out, "   jobs: {}", jobs.join(" "));
    }
    let _ = writeln!(out, "== total ({} files)", report.files.len());
    let _ = writeln!(out, "   {}", line(&report.total));
    out
}

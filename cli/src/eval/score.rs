//! Scoring one labelled transcript: which experiences cite a labelled lesson, which lessons
//! were found, and what `context` brought back for follow-ups, negatives and the other project.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;
use zuno_shared::guards::compile::compile;
use zuno_shared::guards::endorse::endorses;
use zuno_shared::guards::matcher::Matcher;
use zuno_shared::learning::experience::{Experience, Verification};
use zuno_shared::learning::signals::is_host_generated;
use zuno_shared::memory::store::{Scope as MemoryScope, SupportedEntry};
use zuno_shared::transcript::Role;

use super::error::EvalError;
use super::labels::{Label, LabelFile, Scope, Source};
use super::probe::{Recalled, ask, new_session};
use super::transcript::Loaded;
use crate::client::ApiClient;

/// The figures of one file, or of all files together.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Figures {
    pub experiences: usize,
    /// Experiences whose first citation lies in a source labelled as a lesson.
    pub precise: usize,
    pub lesson_groups: usize,
    pub groups_found: usize,
    pub follow_ups: usize,
    pub follow_up_hits: usize,
    /// Follow-ups of groups that were extracted, and how many of them were recalled.
    pub follow_ups_extracted: usize,
    pub follow_up_hits_extracted: usize,
    /// Follow-up hits that came from resident Memory rather than retrieval.
    pub memory_hits: usize,
    /// Follow-up hits among the ≤ 5 retrieved items alone (resident Memory not counted): over
    /// every follow-up, and over those of extracted lessons.
    pub item_hits: usize,
    pub item_hits_extracted: usize,
    pub negatives: usize,
    pub false_recalls: usize,
    pub cross_project_items: usize,
    pub user_wide_lessons: usize,
    pub user_wide_reached: usize,
    pub memory_entries: usize,
    pub junk_memory: usize,
    /// Memory entries that endorse what a labelled lesson of the same file (found or missed)
    /// forbids, and do not rest on that lesson: the lesson compiles to a command guard
    /// (`guards::compile`) and the entry names the forbidden command without forbidding it.
    pub label_contradictions: usize,
    /// Experiences whose lesson repeats another's word for word.
    pub duplicates: usize,
    /// The Memory audit (`zuno memory audit`): groups of entries of one document that share a
    /// subject, pairs that state one rule twice, and documents over their character limit.
    pub shared_subjects: usize,
    pub duplicate_rules: usize,
    pub documents_over_limit: usize,
    /// With an embeddings provider configured, every follow-up is asked again with the semantic
    /// layer off: how many were asked, and how many of them (all / of extracted groups) were
    /// recalled that way.
    pub lexical_only_follow_ups: usize,
    pub lexical_only_hits: usize,
    pub lexical_only_hits_extracted: usize,
}

impl Figures {
    pub fn add(&mut self, other: &Figures) {
        self.experiences += other.experiences;
        self.precise += other.precise;
        self.lesson_groups += other.lesson_groups;
        self.groups_found += other.groups_found;
        self.follow_ups += other.follow_ups;
        self.follow_up_hits += other.follow_up_hits;
        self.follow_ups_extracted += other.follow_ups_extracted;
        self.follow_up_hits_extracted += other.follow_up_hits_extracted;
        self.memory_hits += other.memory_hits;
        self.item_hits += other.item_hits;
        self.item_hits_extracted += other.item_hits_extracted;
        self.negatives += other.negatives;
        self.false_recalls += other.false_recalls;
        self.cross_project_items += other.cross_project_items;
        self.user_wide_lessons += other.user_wide_lessons;
        self.user_wide_reached += other.user_wide_reached;
        self.memory_entries += other.memory_entries;
        self.junk_memory += other.junk_memory;
        self.label_contradictions += other.label_contradictions;
        self.duplicates += other.duplicates;
        self.shared_subjects += other.shared_subjects;
        self.duplicate_rules += other.duplicate_rules;
        self.documents_over_limit += other.documents_over_limit;
        self.lexical_only_follow_ups += other.lexical_only_follow_ups;
        self.lexical_only_hits += other.lexical_only_hits;
        self.lexical_only_hits_extracted += other.lexical_only_hits_extracted;
    }

    pub fn precision(&self) -> Option<f64> {
        ratio(self.precise, self.experiences)
    }

    pub fn lesson_recall(&self) -> Option<f64> {
        ratio(self.groups_found, self.lesson_groups)
    }

    /// recall@5 over the follow-ups of lessons that were extracted.
    pub fn recall_at_5(&self) -> Option<f64> {
        ratio(self.follow_up_hits_extracted, self.follow_ups_extracted)
    }

    /// recall@5 over every follow-up.
    pub fn recall_at_5_all(&self) -> Option<f64> {
        ratio(self.follow_up_hits, self.follow_ups)
    }

    /// recall@5 counting only the retrieved items, not resident Memory (extracted lessons).
    pub fn recall_at_5_items(&self) -> Option<f64> {
        ratio(self.item_hits_extracted, self.follow_ups_extracted)
    }

    /// The same over every follow-up.
    pub fn recall_at_5_items_all(&self) -> Option<f64> {
        ratio(self.item_hits, self.follow_ups)
    }

    /// recall@5 over the follow-ups of extracted lessons with the semantic layer off (only when
    /// the layer is configured, so the two can be compared).
    pub fn recall_at_5_without_semantic(&self) -> Option<f64> {
        (self.lexical_only_follow_ups > 0)
            .then(|| ratio(self.lexical_only_hits_extracted, self.follow_ups_extracted))
            .flatten()
    }

    /// The same over every follow-up.
    pub fn recall_at_5_all_without_semantic(&self) -> Option<f64> {
        (self.lexical_only_follow_ups > 0)
            .then(|| ratio(self.lexical_only_hits, self.follow_ups))
            .flatten()
    }

    pub fn false_recall(&self) -> Option<f64> {
        ratio(self.false_recalls, self.negatives)
    }
}

fn ratio(part: usize, whole: usize) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64)
}

/// One stored experience and the label of what it cites first.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExperienceLine {
    pub id: String,
    pub kind: String,
    pub summary: String,
    pub keywords: Vec<String>,
    pub verified: bool,
    /// `prompt:<line>`, `tool:<line>`, `feedback:<line>`, or where it points when unlabelled.
    pub source: String,
    pub label: Option<LabelRef>,
    pub precise: bool,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelRef {
    pub line: u64,
    pub signal: super::labels::Signal,
    pub strength: super::labels::Strength,
    pub lesson: Option<String>,
    pub group: Option<String>,
}

impl LabelRef {
    fn of(label: &Label) -> LabelRef {
        LabelRef {
            line: label.line,
            signal: label.signal,
            strength: label.strength,
            lesson: label.lesson.clone(),
            group: label.is_lesson().then(|| label.group()),
        }
    }
}

/// One resident Memory entry and the labels behind it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryLine {
    pub scope: &'static str,
    pub content: String,
    pub owner: String,
    pub labels: Vec<LabelRef>,
    /// Its sources are labelled without a lesson (or not labelled at all).
    pub junk: bool,
    /// The lesson groups whose forbidden command it endorses.
    pub contradicts: Vec<String>,
}

/// A prompt whose recall went wrong, for reading.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Miss {
    pub line: u64,
    pub group: String,
    pub prompt: String,
    pub recalled: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FileReport {
    pub labels: String,
    pub transcript: String,
    pub project: String,
    pub extractor: String,
    pub figures: Figures,
    pub experiences: Vec<ExperienceLine>,
    pub memory: Vec<MemoryLine>,
    /// What `zuno memory audit` says of the Memory it left.
    pub audit: Option<zuno_shared::memory::audit::MemoryAudit>,
    /// Lesson groups no experience cites.
    pub missed_groups: Vec<String>,
    pub missed_follow_ups: Vec<Miss>,
    pub false_recalls: Vec<Miss>,
    /// Human prompts the importer produced that no label covers.
    pub unlabelled: Vec<u64>,
    /// Labels that do not match the transcript (a stale or mistyped label).
    pub label_problems: Vec<String>,
    /// Lines the importer could not use, and messages the API refused.
    pub issues: Vec<String>,
    /// Jobs per `kind:state` after the run.
    pub jobs: BTreeMap<String, i64>,
}

/// What `context` answered for each probe.
pub struct Probes {
    follow_ups: Vec<(usize, String, Recalled)>,
    /// The follow-ups again, asked with the semantic layer off (when it is configured).
    lexical_only: Vec<(usize, String, Recalled)>,
    negatives: Vec<(usize, String, Recalled)>,
    cross: Vec<(usize, String, Recalled)>,
}

impl Probes {
    /// `lexical_only`: a client of the same store whose configuration has no embeddings
    /// provider, to ask the follow-ups again without the semantic layer.
    pub async fn ask(
        client: &ApiClient,
        lexical_only: Option<&ApiClient>,
        labels: &LabelFile,
        project: &str,
        other: &str,
    ) -> Result<Probes, EvalError> {
        let same = new_session(client, project).await?;
        let elsewhere = new_session(client, other).await?;
        let lexical = match lexical_only {
            Some(lexical_client) => {
                Some((lexical_client, new_session(lexical_client, project).await?))
            }
            None => None,
        };
        let mut probes = Probes {
            follow_ups: Vec::new(),
            lexical_only: Vec::new(),
            negatives: Vec::new(),
            cross: Vec::new(),
        };
        for (index, label) in labels.prompts.iter().enumerate() {
            if !label.is_lesson() {
                continue;
            }
            for prompt in &label.follow_up_prompts {
                let recalled = ask(client, &same, prompt).await?;
                probes.follow_ups.push((index, prompt.clone(), recalled));
                let recalled = ask(client, &elsewhere, prompt).await?;
                probes.cross.push((index, prompt.clone(), recalled));
                if let Some((lexical_client, session)) = &lexical {
                    let recalled = ask(lexical_client, session, prompt).await?;
                    probes.lexical_only.push((index, prompt.clone(), recalled));
                }
            }
            for prompt in &label.negative_prompts {
                let recalled = ask(client, &same, prompt).await?;
                probes.negatives.push((index, prompt.clone(), recalled));
            }
        }
        Ok(probes)
    }
}

/// Checks every label against the transcript (a stale label fails loudly).
pub fn check_labels(labels: &LabelFile, loaded: &Loaded) -> Vec<String> {
    let mut problems = Vec::new();
    let users: HashMap<u64, &str> = loaded
        .messages
        .values()
        .filter(|m| m.role == Role::User)
        .map(|m| (m.line, m.text.as_str()))
        .collect();
    let assistants: HashSet<u64> = loaded
        .messages
        .values()
        .filter(|m| m.role == Role::Assistant)
        .map(|m| m.line)
        .collect();
    let feedback: HashSet<u64> = loaded.feedback.values().copied().collect();
    for label in &labels.prompts {
        match label.source {
            Source::Prompt => match users.get(&label.line) {
                None => problems.push(format!("line {}: no human prompt starts there", label.line)),
                Some(text) if !text.trim_start().starts_with(label.excerpt.trim()) => {
                    problems.push(format!(
                        "line {}: the prompt does not start with the label's excerpt {:?}",
                        label.line, label.excerpt
                    ));
                }
                Some(_) => {}
            },
            Source::Tool if !assistants.contains(&label.line) => {
                problems.push(format!(
                    "line {}: no assistant message starts there",
                    label.line
                ));
            }
            Source::Feedback if !feedback.contains(&label.line) => {
                problems.push(format!("line {}: no feedback was given there", label.line));
            }
            _ => {}
        }
    }
    problems
}

pub fn score(
    labels: &LabelFile,
    loaded: &Loaded,
    experiences: &[Experience],
    memory: &[SupportedEntry],
    probes: &Probes,
    project: &str,
) -> FileReport {
    let by_source: HashMap<(Source, u64), &Label> = labels
        .prompts
        .iter()
        .map(|label| ((label.source, label.line), label))
        .collect();
    let mut report = FileReport {
        project: project.to_owned(),
        issues: loaded.issues.clone(),
        ..FileReport::default()
    };
    report.label_problems = check_labels(labels, loaded);

    let citations = score_experiences(experiences, loaded, &by_source, &mut report);
    let found = score_lesson_groups(labels, &citations.group_of, &mut report);
    let reach = Reach {
        group_of: &citations.group_of,
        memory_groups: score_memory(memory, labels, &citations.label_of, &mut report),
    };
    let scoring = Scoring {
        labels,
        experiences,
        reach: &reach,
        found: &found,
    };
    scoring.follow_ups(&probes.follow_ups, &mut report);
    scoring.lexical_only(&probes.lexical_only, &mut report);
    scoring.negatives(&probes.negatives, &mut report);
    scoring.cross_project(&probes.cross, &mut report);
    report.unlabelled = unlabelled_prompts(labels, loaded);
    report
}

/// The labels the experiences cite first, keyed by experience id.
struct Citations<'a> {
    /// Only experiences whose first citation is a lesson have a group.
    group_of: HashMap<String, String>,
    label_of: HashMap<String, &'a Label>,
}

/// Adds one [`ExperienceLine`] per experience, with the label of its first citation.
fn score_experiences<'a>(
    experiences: &[Experience],
    loaded: &Loaded,
    by_source: &HashMap<(Source, u64), &'a Label>,
    report: &mut FileReport,
) -> Citations<'a> {
    let mut citations = Citations {
        group_of: HashMap::new(),
        label_of: HashMap::new(),
    };
    let mut summaries: HashMap<String, usize> = HashMap::new();
    for experience in experiences {
        let primary = experience.evidence.iter().min_by_key(|e| e.ordinal);
        let (source, label) = match primary {
            Some(evidence) => locate(
                evidence.address.as_deref(),
                evidence.message_id.as_deref(),
                loaded,
                by_source,
            ),
            None => (String::from("uncited"), None),
        };
        let precise = label.is_some_and(|l| l.is_lesson());
        if let Some(label) = label {
            citations.label_of.insert(experience.id.clone(), label);
            if label.is_lesson() {
                citations
                    .group_of
                    .insert(experience.id.clone(), label.group());
            }
        }
        *summaries
            .entry(experience.summary.to_lowercase())
            .or_default() += 1;
        report.figures.experiences += 1;
        report.figures.precise += usize::from(precise);
        report.experiences.push(ExperienceLine {
            id: experience.id.clone(),
            kind: experience.kind.as_str().to_owned(),
            summary: experience.summary.clone(),
            keywords: experience.keywords.clone(),
            verified: experience.verification == Verification::Verified,
            source,
            label: label.map(LabelRef::of),
            precise,
        });
    }
    report.figures.duplicates = summaries.values().map(|n| n - 1).sum();
    citations
}

/// Counts the lesson groups and names those no experience cites; returns the groups found.
fn score_lesson_groups<'g>(
    labels: &LabelFile,
    group_of: &'g HashMap<String, String>,
    report: &mut FileReport,
) -> HashSet<&'g String> {
    // A list, not a set: missed groups are reported in label order, the same every run.
    let groups: Vec<String> = {
        let mut seen = Vec::new();
        for label in labels.prompts.iter().filter(|l| l.is_lesson()) {
            let group = label.group();
            if !seen.contains(&group) {
                seen.push(group);
            }
        }
        seen
    };
    let found: HashSet<&String> = group_of.values().collect();
    report.figures.lesson_groups = groups.len();
    report.figures.groups_found = groups.iter().filter(|g| found.contains(g)).count();
    report.missed_groups = groups
        .iter()
        .filter(|g| !found.contains(g))
        .cloned()
        .collect();
    found
}

/// Adds one [`MemoryLine`] per entry; returns the lesson groups behind each entry's scope.
fn score_memory(
    memory: &[SupportedEntry],
    labels: &LabelFile,
    label_of: &HashMap<String, &Label>,
    report: &mut FileReport,
) -> Vec<(MemoryScope, HashSet<String>)> {
    let forbidden = forbidden_by_lessons(labels);
    let mut memory_groups: Vec<(MemoryScope, HashSet<String>)> = Vec::new();
    for supported in memory {
        let labels_behind: Vec<&Label> = supported
            .experience_ids
            .iter()
            .filter_map(|id| label_of.get(id).copied())
            .collect();
        let user_owned = supported.entry.owner == "user";
        let junk = !user_owned && !labels_behind.iter().any(|l| l.is_lesson());
        report.figures.memory_entries += 1;
        report.figures.junk_memory += usize::from(junk);
        let groups_behind: HashSet<String> = labels_behind
            .iter()
            .filter(|l| l.is_lesson())
            .map(|l| l.group())
            .collect();
        let newest_behind = labels_behind
            .iter()
            .filter(|l| l.is_lesson())
            .map(|l| l.line)
            .max();
        let contradicts = contradicted_groups(
            &supported.entry.content,
            &forbidden,
            &groups_behind,
            newest_behind,
        );
        report.figures.label_contradictions += usize::from(!contradicts.is_empty());
        memory_groups.push((supported.scope, groups_behind));
        report.memory.push(MemoryLine {
            scope: supported.scope.as_str(),
            content: supported.entry.content.clone(),
            owner: supported.entry.owner.clone(),
            labels: labels_behind.into_iter().map(LabelRef::of).collect(),
            junk,
            contradicts,
        });
    }
    memory_groups
}

/// A command a labelled lesson forbids: the lesson's group, its line and the guard's matcher.
struct Forbidden {
    group: String,
    line: u64,
    matcher: Matcher,
}

/// The command guards each labelled lesson of `labels` compiles to.
fn forbidden_by_lessons(labels: &LabelFile) -> Vec<Forbidden> {
    labels
        .prompts
        .iter()
        .filter(|label| label.is_lesson())
        .flat_map(|label| {
            let lesson = label.lesson.as_deref().unwrap_or_default();
            compile(lesson).into_iter().map(move |guard| Forbidden {
                group: label.group(),
                line: label.line,
                matcher: guard.matcher,
            })
        })
        .collect()
}

/// The lesson groups whose forbidden command `content` endorses, in label order: not those it
/// rests on, and not those older than the newest lesson it rests on (a newer lesson replacing
/// an older one is Memory keeping current, not contradicting).
fn contradicted_groups(
    content: &str,
    forbidden: &[Forbidden],
    groups_behind: &HashSet<String>,
    newest_behind: Option<u64>,
) -> Vec<String> {
    let mut groups: Vec<String> = Vec::new();
    for rule in forbidden {
        let older = newest_behind.is_some_and(|newest| rule.line < newest);
        if !older
            && !groups_behind.contains(&rule.group)
            && !groups.contains(&rule.group)
            && endorses(content, &rule.matcher)
        {
            groups.push(rule.group.clone());
        }
    }
    groups
}

/// How a recalled context can reach a lesson group: by an experience extracted from it, or by
/// a Memory entry resting on it.
struct Reach<'a> {
    group_of: &'a HashMap<String, String>,
    memory_groups: Vec<(MemoryScope, HashSet<String>)>,
}

impl Reach<'_> {
    /// A Memory entry (of `scope`, or any) resting on `group` whose section was recalled.
    fn in_memory(&self, group: &str, scope: Option<MemoryScope>, recalled: &Recalled) -> bool {
        self.memory_groups.iter().any(|(entry_scope, groups)| {
            groups.contains(group)
                && scope.is_none_or(|s| s == *entry_scope)
                && recalled
                    .memory_sections
                    .iter()
                    .any(|name| name == entry_scope.section())
        })
    }

    /// A recalled experience extracted from `group`.
    fn by_retrieval(&self, group: &str, recalled: &Recalled) -> bool {
        recalled
            .experience_ids
            .iter()
            .any(|id| self.group_of.get(id).is_some_and(|g| g == group))
    }
}

/// What the probes' answers are scored against.
struct Scoring<'a> {
    labels: &'a LabelFile,
    experiences: &'a [Experience],
    reach: &'a Reach<'a>,
    /// Lesson groups some experience cites.
    found: &'a HashSet<&'a String>,
}

impl Scoring<'_> {
    fn follow_ups(&self, answers: &[(usize, String, Recalled)], report: &mut FileReport) {
        for (index, prompt, recalled) in answers {
            let label = &self.labels.prompts[*index];
            let group = label.group();
            let by_retrieval = self.reach.by_retrieval(&group, recalled);
            let by_memory = self.reach.in_memory(&group, None, recalled);
            let hit = by_retrieval || by_memory;
            report.figures.follow_ups += 1;
            report.figures.follow_up_hits += usize::from(hit);
            report.figures.memory_hits += usize::from(by_memory && !by_retrieval);
            report.figures.item_hits += usize::from(by_retrieval);
            if self.found.contains(&group) {
                report.figures.follow_ups_extracted += 1;
                report.figures.follow_up_hits_extracted += usize::from(hit);
                report.figures.item_hits_extracted += usize::from(by_retrieval);
                if !hit {
                    report
                        .missed_follow_ups
                        .push(miss(label, prompt, recalled, self.experiences));
                }
            }
        }
    }

    fn lexical_only(&self, answers: &[(usize, String, Recalled)], report: &mut FileReport) {
        for (index, _, recalled) in answers {
            let group = self.labels.prompts[*index].group();
            let hit = self.reach.by_retrieval(&group, recalled)
                || self.reach.in_memory(&group, None, recalled);
            report.figures.lexical_only_follow_ups += 1;
            report.figures.lexical_only_hits += usize::from(hit);
            if self.found.contains(&group) {
                report.figures.lexical_only_hits_extracted += usize::from(hit);
            }
        }
    }

    fn negatives(&self, answers: &[(usize, String, Recalled)], report: &mut FileReport) {
        for (index, prompt, recalled) in answers {
            let label = &self.labels.prompts[*index];
            report.figures.negatives += 1;
            if self.reach.by_retrieval(&label.group(), recalled) {
                report.figures.false_recalls += 1;
                report
                    .false_recalls
                    .push(miss(label, prompt, recalled, self.experiences));
            }
        }
    }

    /// The follow-ups asked in the other project: what leaked there, and which user-wide
    /// lessons reached it.
    fn cross_project(&self, answers: &[(usize, String, Recalled)], report: &mut FileReport) {
        let mut user_wide_reached: HashSet<String> = HashSet::new();
        for (index, _, recalled) in answers {
            let label = &self.labels.prompts[*index];
            let group = label.group();
            // Experiences never cross projects; a project lesson in global Memory does.
            let leaked = recalled
                .experience_ids
                .iter()
                .filter(|id| self.reach.group_of.contains_key(*id))
                .count();
            let project_lesson_in_global = label.scope != Some(Scope::User)
                && self
                    .reach
                    .in_memory(&group, Some(MemoryScope::Global), recalled);
            report.figures.cross_project_items += leaked + usize::from(project_lesson_in_global);
            if label.scope == Some(Scope::User)
                && self
                    .reach
                    .in_memory(&group, Some(MemoryScope::Global), recalled)
            {
                user_wide_reached.insert(group);
            }
        }
        let user_groups: HashSet<String> = self
            .labels
            .prompts
            .iter()
            .filter(|l| l.is_lesson() && l.scope == Some(Scope::User))
            .map(Label::group)
            .collect();
        report.figures.user_wide_lessons = user_groups.len();
        report.figures.user_wide_reached = user_wide_reached.len();
    }
}

/// Human prompts no label covers, by line.
fn unlabelled_prompts(labels: &LabelFile, loaded: &Loaded) -> Vec<u64> {
    let labelled: HashSet<u64> = labels
        .prompts
        .iter()
        .filter(|l| l.source == Source::Prompt)
        .map(|l| l.line)
        .collect();
    let mut unlabelled: Vec<u64> = loaded
        .messages
        .values()
        .filter(|m| {
            m.role == Role::User && !m.text.trim().is_empty() && !is_host_generated(&m.text)
        })
        .map(|m| m.line)
        .filter(|line| !labelled.contains(line))
        .collect();
    unlabelled.sort_unstable();
    unlabelled.dedup();
    unlabelled
}

/// Where a citation points, as `prompt:<line>` / `tool:<line>` / `feedback:<line>`, and its label.
fn locate<'a>(
    address: Option<&str>,
    message_id: Option<&str>,
    loaded: &Loaded,
    labels: &HashMap<(Source, u64), &'a Label>,
) -> (String, Option<&'a Label>) {
    let Some(message_id) = message_id else {
        return (String::from("unknown"), None);
    };
    if address.is_some_and(|a| a.starts_with("feedback:")) {
        return match loaded.feedback.get(message_id) {
            Some(&line) => (
                format!("feedback:{line}"),
                labels.get(&(Source::Feedback, line)).copied(),
            ),
            None => (String::from("feedback:?"), None),
        };
    }
    match loaded.messages.get(message_id) {
        Some(message) if message.role == Role::User => (
            format!("prompt:{}", message.line),
            labels.get(&(Source::Prompt, message.line)).copied(),
        ),
        Some(message) => (
            format!("tool:{}", message.line),
            labels.get(&(Source::Tool, message.line)).copied(),
        ),
        None => (String::from("unknown"), None),
    }
}

fn miss(label: &Label, prompt: &str, recalled: &Recalled, experiences: &[Experience]) -> Miss {
    Miss {
        line: label.line,
        group: label.group(),
        prompt: prompt.to_owned(),
        recalled: recalled
            .experience_ids
            .iter()
            .filter_map(|id| experiences.iter().find(|e| &e.id == id))
            .map(|e| e.summary.clone())
            .collect(),
    }
}

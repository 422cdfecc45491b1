//! Guards: checkable lessons compiled into tool-call matchers that the agents' `PreToolUse`
//! hooks enforce (`zuno hook claude-code PreToolUse`), and the evidence of their violations.
//!
//! Life of a guard: maintenance compiles the current Memory entries ([`compile`]) after each
//! plan; a new guard is `pending` until a person approves it (or `active` at once under
//! `guards.promotion: automatic`). The hook asks the server ([`check`]) before a shell command
//! or an edit; an `active` guard that matches answers `ask` (or `deny`) with the lesson, its
//! citation and the alternative. A guard whose lesson left Memory is `retired`; a person can
//! `disable`, `enable` or `reject` one, and every change is an event in its audit trail.
//! Imported assistant messages that run what a guard forbids count as violations of it.

pub mod call;
pub mod compile;
pub mod endorse;
pub mod matcher;
pub mod shell;
pub mod store;

use std::path::Path;

use crate::config::{GuardPromotion, GuardsConfig};
use crate::db::{StoreError, Tx};
use crate::memory::store::{self as memory_store, Scope};
use crate::transcript::{Message, Part, Role};
use matcher::ToolCall;
use store::{Guard, GuardDecision, GuardOrigin, GuardState, NewGuard};

/// The states in which a guard still stands for its lesson.
const LIVE: &[GuardState] = &[GuardState::Pending, GuardState::Active];

/// What compiling a project's Memory changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Compiled {
    pub proposed: Vec<String>,
    pub retired: Vec<String>,
}

/// Compiles the current entries of `project_id`'s document (into project guards) and of the
/// global document (into global guards), in the caller's transaction: new guards are proposed,
/// a guard whose lesson was rewritten follows its new entry, and a guard whose lesson left
/// Memory is retired.
pub async fn compile_memory_in(
    tx: &mut Tx,
    project_id: &str,
    config: &GuardsConfig,
    now: i64,
) -> Result<Compiled, StoreError> {
    let mut compiled = Compiled::default();
    let mut sources: Vec<String> = Vec::new();
    for (scope, owner) in [(Scope::Project, Some(project_id)), (Scope::Global, None)] {
        let Some(view) = memory_store::view_in(tx, scope, Some(project_id)).await? else {
            continue;
        };
        for entry in view.entries {
            let guards = compile::compile(&entry.content);
            if guards.is_empty() {
                continue;
            }
            sources.push(entry.id.clone());
            let evidence = crate::memory::store::entry_support_in(tx, &entry.id).await?;
            for guard in guards {
                let new = NewGuard {
                    project_id: owner,
                    matcher: &guard.matcher,
                    alternative: guard.alternative.as_deref(),
                    reason: &entry.content,
                    source_entry_id: Some(&entry.id),
                    evidence: &evidence,
                    origin: GuardOrigin::Rules,
                    state: match config.promotion {
                        GuardPromotion::Review => GuardState::Pending,
                        GuardPromotion::Automatic => GuardState::Active,
                    },
                    decision: config.decision,
                };
                if let Some(id) = propose_in(tx, &new, now).await? {
                    compiled.proposed.push(id);
                }
            }
        }
    }
    for guard in store::of_project_in(tx, project_id).await? {
        let orphaned = guard.origin != GuardOrigin::User
            && guard.state.is_live()
            && guard
                .source_entry_id
                .as_ref()
                .is_some_and(|entry| !sources.contains(entry));
        if orphaned && store::transition_in(tx, &guard.id, LIVE, GuardState::Retired, now).await? {
            store::event_in(
                tx,
                &guard.id,
                "retired",
                None,
                Some("its lesson left Memory"),
                now,
            )
            .await?;
            compiled.retired.push(guard.id);
        }
    }
    Ok(compiled)
}

/// Proposes `new`, or points the existing guard of the same matcher at `new`'s entry (a
/// rewritten lesson keeps its guard; a retired one comes back for review). Returns the id of a
/// newly proposed guard.
async fn propose_in(
    tx: &mut Tx,
    new: &NewGuard<'_>,
    now: i64,
) -> Result<Option<String>, StoreError> {
    if store::follow_entry_in(tx, new, now).await? {
        return Ok(None);
    }
    let Some(id) = store::insert_in(tx, new, now).await? else {
        return Ok(None);
    };
    store::event_in(
        tx,
        &id,
        "proposed",
        None,
        Some(&new.matcher.describe()),
        now,
    )
    .await?;
    if new.state == GuardState::Active {
        store::event_in(
            tx,
            &id,
            "approved",
            None,
            Some("guards.promotion: automatic"),
            now,
        )
        .await?;
    }
    Ok(Some(id))
}

/// The guard that stops `call`, with what it matched and the decision: the first `deny` guard
/// that matches, else the first `ask` one. `configured` (`guards.decision`) hardens every
/// guard to `deny` when the user chose so.
pub fn verdict<'a>(
    guards: &'a [Guard],
    call: &ToolCall,
    configured: GuardDecision,
) -> Option<Verdict<'a>> {
    let decision_of = |guard: &Guard| {
        if guard.decision == GuardDecision::Deny || configured == GuardDecision::Deny {
            GuardDecision::Deny
        } else {
            GuardDecision::Ask
        }
    };
    let call = call.prepare();
    let mut found: Option<Verdict<'a>> = None;
    for guard in guards {
        let Some(matched) = guard.matcher.matches_prepared(&call) else {
            continue;
        };
        let decision = decision_of(guard);
        if found
            .as_ref()
            .is_none_or(|f| f.decision == GuardDecision::Ask && decision == GuardDecision::Deny)
        {
            found = Some(Verdict {
                guard,
                matched,
                decision,
            });
        }
    }
    found
}

/// A guard's answer to a call.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict<'a> {
    pub guard: &'a Guard,
    /// The simple command or path it matched.
    pub matched: String,
    pub decision: GuardDecision,
}

impl Verdict<'_> {
    /// The reason the agent and the user read: the lesson, its citation, the alternative, and
    /// how to turn the guard off.
    pub fn reason(&self) -> String {
        let guard = self.guard;
        let mut reason = format!("Zuno rule: {}", guard.reason.trim());
        if let Some(alternative) = &guard.alternative {
            reason.push_str(&format!(" Use `{alternative}` instead."));
        }
        reason.push_str(&format!(" (`{}` matches guard {}", self.matched, guard.id));
        if !guard.evidence.is_empty() {
            reason.push_str(&format!(", learned from {}", guard.evidence.join(", ")));
        }
        reason.push_str(&format!(
            "; `zuno guards disable {}` turns it off.)",
            guard.id
        ));
        reason
    }
}

/// Counts, for each pending or active guard of the session's project, an assistant message
/// that ran what it forbids after the guard existed: the rule was in Memory (so in the prompt)
/// and was broken anyway. In the caller's transaction (the message's append).
pub async fn record_violations_in(
    tx: &mut Tx,
    message: &Message,
    now: i64,
) -> Result<usize, StoreError> {
    if message.role != Role::Assistant
        || !message
            .parts
            .iter()
            .any(|p| matches!(p.part, Part::ToolCall { .. }))
    {
        return Ok(0);
    }
    let Some((project_id, worktree)) = store::session_project_in(tx, &message.session_id).await?
    else {
        return Ok(0);
    };
    let guards: Vec<Guard> = store::of_project_in(tx, &project_id)
        .await?
        .into_iter()
        .filter(|g| g.state.is_live() && g.created_at <= message.created_at)
        .collect();
    if guards.is_empty() {
        return Ok(0);
    }
    let root = worktree.as_deref().map(Path::new);
    let mut recorded = 0;
    for part in &message.parts {
        let Part::ToolCall {
            tool_name,
            arguments,
            ..
        } = &part.part
        else {
            continue;
        };
        let Some(call) = call::tool_call(tool_name, arguments, root) else {
            continue;
        };
        let call = call.prepare();
        for guard in &guards {
            if let Some(matched) = guard.matcher.matches_prepared(&call) {
                store::count_in(tx, &guard.id, true, now).await?;
                store::event_in(
                    tx,
                    &guard.id,
                    "violated",
                    Some(&message.session_id),
                    Some(&matched),
                    now,
                )
                .await?;
                recorded += 1;
            }
        }
    }
    Ok(recorded)
}

#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error("guard `{0}` was not found")]
    NotFound(String),
    #[error("guard `{id}` is `{state}`; {action} needs it {from}")]
    Conflict {
        id: String,
        state: GuardState,
        action: &'static str,
        from: &'static str,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

zuno_queue::text_enum! {
    /// A person's decision on a guard.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Decision {
        /// `pending` → `active`.
        Approve = "approve",
        /// `pending` → `rejected` (never proposed again).
        Reject = "reject",
        /// `pending` or `active` → `disabled`.
        Disable = "disable",
        /// `disabled` → `active`.
        Enable = "enable",
    }
}

impl Decision {
    /// The states it moves a guard from, the state it moves it to, the audit event, and the
    /// precondition as an error message says it.
    fn transition(
        self,
    ) -> (
        &'static [GuardState],
        GuardState,
        &'static str,
        &'static str,
    ) {
        use GuardState::{Active, Disabled, Pending, Rejected};
        match self {
            Decision::Approve => (&[Pending], Active, "approved", "pending"),
            Decision::Reject => (&[Pending], Rejected, "rejected", "pending"),
            Decision::Disable => (LIVE, Disabled, "disabled", "pending or active"),
            Decision::Enable => (&[Disabled], Active, "enabled", "disabled"),
        }
    }
}

/// Applies a person's `decision` to guard `id` and records it in the guard's audit trail.
pub async fn decide(
    db: &crate::db::Db,
    id: &str,
    decision: Decision,
    now: i64,
) -> Result<Guard, GuardError> {
    let mut tx = db.begin().await?;
    let guard = store::get_in(&mut tx, id)
        .await?
        .ok_or_else(|| GuardError::NotFound(id.to_owned()))?;
    let (from, to, event, needs) = decision.transition();
    if !store::transition_in(&mut tx, id, from, to, now).await? {
        return Err(GuardError::Conflict {
            id: id.to_owned(),
            state: guard.state,
            action: decision.as_str(),
            from: needs,
        });
    }
    store::event_in(&mut tx, id, event, None, Some("by a person"), now).await?;
    let guard = store::get_in(&mut tx, id).await?.expect("exists");
    tx.commit().await?;
    Ok(guard)
}

/// The guard itself, without the scope check (the caller does that).
pub async fn get(db: &crate::db::Db, id: &str) -> Result<Option<Guard>, StoreError> {
    let mut read = db.begin_read().await?;
    let guard = store::get_in(&mut read, id).await?;
    read.rollback().await?;
    Ok(guard)
}

/// Records a call a guard stopped through a hook.
pub async fn record_block(
    db: &crate::db::Db,
    guard_id: &str,
    session_id: Option<&str>,
    matched: &str,
    now: i64,
) -> Result<(), StoreError> {
    let mut tx = db.begin().await?;
    store::count_in(&mut tx, guard_id, false, now).await?;
    store::event_in(&mut tx, guard_id, "blocked", session_id, Some(matched), now).await?;
    tx.commit().await?;
    Ok(())
}

/// A checkable rule as `learn status` shows it: how often its lesson was recalled, how often a
/// guard stopped it, and how often an agent broke it anyway.
#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuleUse {
    pub guard_id: String,
    pub rule: String,
    /// What the guard matches, as a person reads it.
    pub guards: String,
    #[schema(value_type = String)]
    pub state: GuardState,
    /// Times the lesson's experiences were selected into a prompt or reinforced.
    pub recalled: i64,
    pub blocked: i64,
    pub violated: i64,
}

/// The rules with guards of `project_id` (and the global ones), most broken first.
pub async fn rule_uses(db: &crate::db::Db, project_id: &str) -> Result<Vec<RuleUse>, StoreError> {
    let guards: Vec<Guard> = store::list(db, project_id, None)
        .await?
        .into_iter()
        .filter(|g| g.state.is_live() || g.state == GuardState::Disabled)
        .collect();
    let mut uses = Vec::new();
    for guard in guards {
        let mut recalled = 0;
        for id in &guard.evidence {
            recalled += store::times_recalled(db, id).await?.unwrap_or(0);
        }
        uses.push(RuleUse {
            guards: guard.matcher.describe(),
            guard_id: guard.id,
            rule: guard.reason,
            state: guard.state,
            recalled,
            blocked: guard.blocks,
            violated: guard.violations,
        });
    }
    uses.sort_by(|a, b| b.violated.cmp(&a.violated).then(b.blocked.cmp(&a.blocked)));
    uses.truncate(50);
    Ok(uses)
}

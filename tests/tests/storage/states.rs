//! Every typed state's variants are exactly what its column's CHECK constraint allows, read from
//! the migrated schema of each backend: a variant the database refuses, or a stored text no
//! variant decodes, cannot slip in on one backend only.

use std::collections::BTreeSet;

use zuno_shared::db::Backend;
use zuno_shared::guards::store::{GuardDecision, GuardOrigin, GuardState};
use zuno_shared::ledger::JobState;
use zuno_shared::memory::store::MemoryCandidateState;
use zuno_shared::skills::apply::{OperationKind, OperationState};
use zuno_shared::skills::candidate::{
    CandidateOperation, EvaluationState, SkillCandidateState, SourceKind,
};
use zuno_shared::skills::evaluation::{AttemptVariant, CaseKind, RunState};
use zuno_shared::skills::pattern::{PatternOrigin, PatternScope, PatternState};
use zuno_tests::{TestDb, on_both_backends};

/// The quoted values of the `column IN (…)` / `column = ANY (ARRAY[…])` CHECK on `table`.
async fn allowed(db: &TestDb, table: &str, column: &str) -> BTreeSet<String> {
    let constraint = match db.backend {
        Backend::Sqlite => {
            let sql: String = zuno_shared::on_db!(db.db, |pool| sqlx::query_scalar(
                "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = $1"
            )
            .bind(table)
            .fetch_one(pool)
            .await)
            .unwrap();
            let start = sql
                .find(&format!("CHECK ({column} IN ("))
                .unwrap_or_else(|| panic!("{table}.{column} has no CHECK: {sql}"));
            let end = start + sql[start..].find("))").unwrap();
            sql[start..end].to_owned()
        }
        Backend::Postgres => {
            let definitions: Vec<String> = zuno_shared::on_db!(db.db, |pool| sqlx::query_scalar(
                "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c \
                     JOIN pg_class t ON t.oid = c.conrelid WHERE t.relname = $1 AND c.contype = 'c'"
            )
            .bind(table)
            .fetch_all(pool)
            .await)
            .unwrap();
            let prefix = format!("CHECK (({column} = ANY");
            let mut matching = definitions.into_iter().filter(|d| d.starts_with(&prefix));
            let found = matching
                .next()
                .unwrap_or_else(|| panic!("{table}.{column} has no CHECK"));
            assert!(matching.next().is_none(), "one CHECK per column");
            found
        }
    };
    constraint
        .split('\'')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

fn texts(states: impl IntoIterator<Item = &'static str>) -> BTreeSet<String> {
    states.into_iter().map(str::to_owned).collect()
}

/// Each stored state enum's column and the texts of its variants.
macro_rules! stored_columns {
    ($($state:ty),+ $(,)?) => {
        vec![$((<$state>::COLUMN, texts(<$state>::ALL.iter().map(|s| s.as_str())))),+]
    };
}

async fn every_state_enum_matches_its_check_constraint(db: TestDb) {
    let mut typed = stored_columns![
        MemoryCandidateState,
        PatternState,
        SkillCandidateState,
        EvaluationState,
        RunState,
        PatternScope,
        PatternOrigin,
        CandidateOperation,
        SourceKind,
        OperationKind,
        OperationState,
        CaseKind,
        AttemptVariant,
        GuardState,
        GuardOrigin,
        GuardDecision,
    ];
    typed.push((
        ("learning_job", "state"),
        texts(JobState::ALL.iter().map(|s| s.as_str())),
    ));
    assert_eq!(typed.len(), 17, "every stored state enum is listed");
    for ((table, column), variants) in typed {
        assert_eq!(
            allowed(&db, table, column).await,
            variants,
            "{table}.{column} on {:?}",
            db.backend
        );
    }
}

on_both_backends!(every_state_enum_matches_its_check_constraint);

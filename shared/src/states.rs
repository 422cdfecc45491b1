//! Stored lifecycle states as enums: each lists its variants once, with the text its column's
//! CHECK constraint allows, in the style of the ledger's `JobState` (`ALL`, `as_str`, `parse`).

/// A stored state text no variant spells: the row was written by something else.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{column} holds the unknown state `{value}`")]
pub struct UnknownState {
    pub column: &'static str,
    pub value: String,
}

/// Declares a state enum stored as text in `table.column`: `TryFrom<String>` decodes rows
/// (`#[sqlx(try_from = "String")]`). Serde and OpenAPI spell variants in snake_case, which must
/// be the stored text (a test holds every enum to it).
macro_rules! stored_states {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident in $table:literal . $column:literal {
            $( $(#[$variant_meta:meta])* $variant:ident = $text:literal ),+ $(,)?
        }
    ) => {
        ::zuno_queue::text_enum! {
            $(#[$meta])*
            #[derive(
                Debug, Clone, Copy, PartialEq, Eq, Hash, ::serde::Serialize,
                ::serde::Deserialize, ::utoipa::ToSchema,
            )]
            #[serde(rename_all = "snake_case")]
            $vis enum $name {
                $( $(#[$variant_meta])* $variant = $text ),+
            }
        }

        impl $name {
            /// The table and column storing it; their CHECK constraint lists exactly `ALL`.
            pub const COLUMN: (&'static str, &'static str) = ($table, $column);
        }

        impl TryFrom<String> for $name {
            type Error = $crate::states::UnknownState;

            fn try_from(value: String) -> Result<$name, Self::Error> {
                $name::parse(&value).ok_or($crate::states::UnknownState {
                    column: concat!($table, ".", $column),
                    value,
                })
            }
        }
    };
}
pub(crate) use stored_states;

#[cfg(test)]
mod tests {
    use crate::guards::store::{GuardDecision, GuardOrigin, GuardState};
    use crate::memory::store::MemoryCandidateState;
    use crate::skills::apply::{OperationKind, OperationState};
    use crate::skills::candidate::{
        CandidateOperation, EvaluationState, SkillCandidateState, SourceKind,
    };
    use crate::skills::evaluation::{AttemptVariant, CaseKind, RunState};
    use crate::skills::pattern::{PatternOrigin, PatternScope, PatternState};

    fn round_trips<T>(all: &[T], as_str: fn(T) -> &'static str, parse: fn(&str) -> Option<T>)
    where
        T: Copy + PartialEq + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
    {
        assert!(!all.is_empty());
        for state in all {
            assert_eq!(parse(as_str(*state)), Some(*state));
            let json = serde_json::to_value(state).unwrap();
            assert_eq!(
                json,
                serde_json::json!(as_str(*state)),
                "serde speaks the stored text"
            );
            assert_eq!(serde_json::from_value::<T>(json).unwrap(), *state);
        }
        assert_eq!(parse("retry"), None);
    }

    #[test]
    fn every_stored_state_round_trips_through_its_text() {
        round_trips(
            &MemoryCandidateState::ALL,
            MemoryCandidateState::as_str,
            MemoryCandidateState::parse,
        );
        round_trips(
            &PatternState::ALL,
            PatternState::as_str,
            PatternState::parse,
        );
        round_trips(
            &PatternScope::ALL,
            PatternScope::as_str,
            PatternScope::parse,
        );
        round_trips(
            &PatternOrigin::ALL,
            PatternOrigin::as_str,
            PatternOrigin::parse,
        );
        round_trips(
            &SkillCandidateState::ALL,
            SkillCandidateState::as_str,
            SkillCandidateState::parse,
        );
        round_trips(
            &EvaluationState::ALL,
            EvaluationState::as_str,
            EvaluationState::parse,
        );
        round_trips(&RunState::ALL, RunState::as_str, RunState::parse);
        round_trips(
            &CandidateOperation::ALL,
            CandidateOperation::as_str,
            CandidateOperation::parse,
        );
        round_trips(&SourceKind::ALL, SourceKind::as_str, SourceKind::parse);
        round_trips(
            &OperationKind::ALL,
            OperationKind::as_str,
            OperationKind::parse,
        );
        round_trips(
            &OperationState::ALL,
            OperationState::as_str,
            OperationState::parse,
        );
        round_trips(&CaseKind::ALL, CaseKind::as_str, CaseKind::parse);
        round_trips(
            &AttemptVariant::ALL,
            AttemptVariant::as_str,
            AttemptVariant::parse,
        );
        round_trips(&GuardState::ALL, GuardState::as_str, GuardState::parse);
        round_trips(&GuardOrigin::ALL, GuardOrigin::as_str, GuardOrigin::parse);
        round_trips(
            &GuardDecision::ALL,
            GuardDecision::as_str,
            GuardDecision::parse,
        );
    }

    #[test]
    fn an_unknown_stored_text_names_its_column() {
        let unknown = MemoryCandidateState::try_from(String::from("retry")).unwrap_err();
        assert_eq!(unknown.column, "memory_candidate.state");
    }
}

//! Which completed turns are closed learning sources: the check that decides whether closing a
//! turn admits an `extract` job (README, "Using it", lists the reasons).

use serde::Serialize;

use super::signals;
use crate::transcript::{Message, MessageStatus, Part, Role, ToolStatus};

/// Why a turn qualifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EligibilityReason {
    ToolCall,
    Artifact,
    RecoveredError,
    UserCorrection,
    Feedback,
}

/// Why a turn does not qualify.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Ineligibility {
    /// The terminal message is not an assistant message.
    NotAssistant,
    /// The turn is unfinished, failed or truncated.
    NotCompleted,
    /// A tool call is still pending.
    PendingTools,
    /// No tool call, artifact, recovered error, correction or feedback.
    NoSignal,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Eligibility {
    pub eligible: bool,
    pub reasons: Vec<EligibilityReason>,
    pub ineligible: Option<Ineligibility>,
    /// A successful Web/MCP result was consumed in the turn (durable tool metadata).
    pub consumed_external_context: bool,
}

/// Assesses the turn `window` (oldest first, ending with the terminal assistant message).
pub fn assess(window: &[Message], has_feedback: bool) -> Eligibility {
    let consumed_external_context = window.iter().flat_map(|m| &m.parts).any(|p| {
        matches!(
            p.part,
            Part::ToolCall {
                external_context: true,
                status: ToolStatus::Completed,
                ..
            }
        )
    });
    let refuse = |reason| Eligibility {
        eligible: false,
        reasons: Vec::new(),
        ineligible: Some(reason),
        consumed_external_context,
    };
    if let Some(reason) = unfinished(window) {
        return refuse(reason);
    }
    let reasons = signals_of(window, has_feedback);
    if reasons.is_empty() {
        return refuse(Ineligibility::NoSignal);
    }
    Eligibility {
        eligible: true,
        reasons,
        ineligible: None,
        consumed_external_context,
    }
}

/// Why the window is not a finished turn: no terminal assistant message, or one that did not
/// complete, or one still waiting for its tools.
fn unfinished(window: &[Message]) -> Option<Ineligibility> {
    let Some(terminal) = window.last() else {
        return Some(Ineligibility::NotAssistant);
    };
    if terminal.role != Role::Assistant {
        return Some(Ineligibility::NotAssistant);
    }
    match terminal.status {
        MessageStatus::Completed => {}
        MessageStatus::PendingTools => return Some(Ineligibility::PendingTools),
        MessageStatus::InProgress | MessageStatus::Failed | MessageStatus::Truncated => {
            return Some(Ineligibility::NotCompleted);
        }
    }
    // Only the terminal message's tools decide: a tool left pending in an earlier message of
    // the window belongs to a turn the user interrupted and moved on from, and the correction
    // typed after it must still be learned.
    let pending = terminal.parts.iter().any(|p| {
        matches!(
            p.part,
            Part::ToolCall {
                status: ToolStatus::Pending,
                ..
            }
        )
    });
    pending.then_some(Ineligibility::PendingTools)
}

/// The learning signals in the window, each once, in the order they first appear.
fn signals_of(window: &[Message], has_feedback: bool) -> Vec<EligibilityReason> {
    let mut reasons = Vec::new();
    let mut push = |reason| {
        if !reasons.contains(&reason) {
            reasons.push(reason);
        }
    };
    let parts = window
        .iter()
        .flat_map(|m| m.parts.iter().map(move |p| (m.role, &p.part)));
    for (role, part) in parts {
        if part.is_injected() {
            continue;
        }
        match part {
            Part::ToolCall { status, .. } => {
                push(EligibilityReason::ToolCall);
                if *status == ToolStatus::Error {
                    push(EligibilityReason::RecoveredError);
                }
            }
            Part::Artifact { .. } => push(EligibilityReason::Artifact),
            // The turn completed normally after the error, so the error was recovered from.
            Part::Error { .. } => push(EligibilityReason::RecoveredError),
            Part::Text { text, .. } => {
                if role == Role::User
                    && !signals::is_host_generated(text)
                    && super::rules::v2::has_instruction(text)
                {
                    push(EligibilityReason::UserCorrection);
                }
            }
        }
    }
    if has_feedback {
        push(EligibilityReason::Feedback);
    }
    reasons
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(role: Role, status: MessageStatus, parts: Vec<Part>) -> Message {
        Message::sample("m", role, status, parts)
    }

    fn text(t: &str) -> Part {
        Part::Text {
            text: t.into(),
            injected: false,
        }
    }

    fn tool(status: ToolStatus) -> Part {
        Part::ToolCall {
            tool_name: "bash".into(),
            call_id: None,
            arguments: serde_json::json!({"cmd": "ls"}),
            result: Some("ok".into()),
            status,
            external_context: false,
            injected: false,
        }
    }

    #[test]
    fn a_completed_turn_with_a_tool_call_is_eligible() {
        let turn = [
            message(
                Role::User,
                MessageStatus::Completed,
                vec![text("list files")],
            ),
            message(
                Role::Assistant,
                MessageStatus::Completed,
                vec![tool(ToolStatus::Completed), text("done")],
            ),
        ];
        let result = assess(&turn, false);
        assert!(result.eligible);
        assert_eq!(result.reasons, vec![EligibilityReason::ToolCall]);
    }

    #[test]
    fn chat_without_signal_is_not_eligible() {
        let turn = [
            message(Role::User, MessageStatus::Completed, vec![text("hello")]),
            message(Role::Assistant, MessageStatus::Completed, vec![text("hi")]),
        ];
        assert_eq!(
            assess(&turn, false).ineligible,
            Some(Ineligibility::NoSignal)
        );
        assert!(assess(&turn, true).eligible, "feedback alone qualifies");
    }

    #[test]
    fn unfinished_failed_truncated_and_pending_turns_are_not_sources() {
        for status in [
            MessageStatus::InProgress,
            MessageStatus::Failed,
            MessageStatus::Truncated,
        ] {
            let turn = [message(
                Role::Assistant,
                status,
                vec![tool(ToolStatus::Completed)],
            )];
            assert_eq!(
                assess(&turn, false).ineligible,
                Some(Ineligibility::NotCompleted)
            );
        }
        let pending = [message(
            Role::Assistant,
            MessageStatus::PendingTools,
            vec![tool(ToolStatus::Pending)],
        )];
        assert_eq!(
            assess(&pending, false).ineligible,
            Some(Ineligibility::PendingTools)
        );
        let pending_part = [message(
            Role::Assistant,
            MessageStatus::Completed,
            vec![tool(ToolStatus::Pending)],
        )];
        assert_eq!(
            assess(&pending_part, false).ineligible,
            Some(Ineligibility::PendingTools)
        );
    }

    #[test]
    fn corrections_errors_and_artifacts_qualify_but_injected_text_does_not() {
        let correction = [
            message(
                Role::User,
                MessageStatus::Completed,
                vec![text("No, don't use npm; use pnpm")],
            ),
            message(Role::Assistant, MessageStatus::Completed, vec![text("ok")]),
        ];
        assert_eq!(
            assess(&correction, false).reasons,
            vec![EligibilityReason::UserCorrection]
        );
        let injected = [
            message(
                Role::User,
                MessageStatus::Completed,
                vec![Part::Text {
                    text: "always use pnpm".into(),
                    injected: true,
                }],
            ),
            message(Role::Assistant, MessageStatus::Completed, vec![text("ok")]),
        ];
        assert!(!assess(&injected, false).eligible);
        let interrupted = [
            message(
                Role::User,
                MessageStatus::Completed,
                vec![text("[Request interrupted by user] try again")],
            ),
            message(Role::Assistant, MessageStatus::Completed, vec![text("ok")]),
        ];
        assert!(!assess(&interrupted, false).eligible);
        let recovered = [message(
            Role::Assistant,
            MessageStatus::Completed,
            vec![
                Part::Error {
                    text: "exit 1".into(),
                },
                text("fixed"),
            ],
        )];
        assert_eq!(
            assess(&recovered, false).reasons,
            vec![EligibilityReason::RecoveredError]
        );
        let artifact = [message(
            Role::Assistant,
            MessageStatus::Completed,
            vec![Part::Artifact {
                name: "a.png".into(),
                uri: None,
                text: None,
            }],
        )];
        assert_eq!(
            assess(&artifact, false).reasons,
            vec![EligibilityReason::Artifact]
        );
    }
}

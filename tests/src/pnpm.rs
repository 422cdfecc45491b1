//! The turn most tests and benches feed the pipeline: the user corrects npm to pnpm, the
//! assistant installs with pnpm (a completed tool call, which closes the turn), and the fake
//! provider's extraction cites the correction.

use serde_json::json;

use crate::fake_provider::Reply;

/// The user's correction that opens each turn; [`valid_answer`] cites an exact excerpt of it.
pub const CORRECTION: &str = "No, don't use npm here; use pnpm. It keeps the lockfile consistent.";

/// The completed assistant turn (a tool call) that closes the turn and admits extraction.
pub fn assistant_turn() -> serde_json::Value {
    json!({
        "role": "assistant",
        "status": "completed",
        "parts": [
            {"type": "tool_call", "toolName": "bash", "callId": "c1",
             "arguments": {"command": "pnpm install"}, "result": "Done in 2.1s", "status": "completed"},
            {"type": "text", "text": "Installed with pnpm."}
        ]
    })
}

pub fn user_turn() -> serde_json::Value {
    json!({"role": "user", "parts": [{"type": "text", "text": CORRECTION}]})
}

/// An extraction whose one experience cites `use pnpm` in the user's message (source `S1`), so
/// it validates and is stored verified.
pub fn valid_answer() -> Reply {
    Reply::answer(
        json!({
            "experiences": [{
                "kind": "correction", "title": "Use pnpm", "summary": "Use pnpm, not npm.",
                "resolution": "Installed with pnpm.",
                "citations": [{"source_id": "S1", "excerpt": "use pnpm"}],
                "confidence": 0.85
            }],
            "memories": []
        })
        .to_string(),
    )
}

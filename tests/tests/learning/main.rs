//! Closed-turn learning end to end, on both backends: admission, the rules and model extractors
//! (the model through the fake provider speaking real wire formats), validation and refusal,
//! settlement, policy, feedback, manual commands, repair and token accounting.

mod accounting;
mod eval;
mod extraction;
mod harness;
mod maintenance;
mod manual;
mod policy;
mod quality;
mod recall;
mod recall_index;
mod semantic;

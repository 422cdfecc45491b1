//! The worker runtime: the queue crate's handler trait, runner, shutdown and wake-ups, plus what
//! the learning domain adds on top — process wiring for the worker binaries and `zuno serve`
//! ([`process`]) and the one path every model call takes ([`model_call`]).

pub mod model_call;
pub mod process;

pub use zuno_queue::runtime::*;

//! How an evaluation run fails.

use std::path::PathBuf;

use crate::error::CliError;

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("cannot read `{path}`: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{path}` is not a valid labels file: {detail}")]
    Labels { path: PathBuf, detail: String },
    #[error("{path}:{line}: {detail}")]
    Transcript {
        path: PathBuf,
        line: u64,
        detail: String,
    },
    #[error("{0}")]
    Store(String),
    #[error("{message}")]
    Cli { code: u8, message: String },
}

impl EvalError {
    pub(crate) fn cli(error: CliError) -> EvalError {
        EvalError::Cli {
            code: error.code,
            message: error.message,
        }
    }

    pub(crate) fn store(error: impl std::fmt::Display) -> EvalError {
        EvalError::Store(error.to_string())
    }

    /// The CLI exit code: bad labels or transcripts are bad input.
    pub fn exit_code(&self) -> u8 {
        match self {
            EvalError::Read { .. } | EvalError::Labels { .. } | EvalError::Transcript { .. } => {
                CliError::BAD_INPUT
            }
            EvalError::Store(_) => CliError::UNAVAILABLE,
            EvalError::Cli { code, .. } => *code,
        }
    }
}

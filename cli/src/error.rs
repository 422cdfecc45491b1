//! The command line's one failure type and the exit code that classifies each failure.

/// A failure with the exit code that classifies it.
#[derive(Debug)]
pub struct CliError {
    pub code: u8,
    pub message: String,
}

impl CliError {
    pub const FAILURE: u8 = 1;
    pub const BAD_INPUT: u8 = 2;
    pub const NOT_FOUND: u8 = 3;
    pub const CONFLICT: u8 = 4;
    pub const UNAVAILABLE: u8 = 5;

    pub fn new(code: u8, message: impl Into<String>) -> CliError {
        CliError {
            code,
            message: message.into(),
        }
    }
}

impl From<anyhow::Error> for CliError {
    fn from(error: anyhow::Error) -> CliError {
        if let Some(config) = error.downcast_ref::<zuno_shared::config::ConfigError>() {
            return CliError::new(CliError::BAD_INPUT, config.to_string());
        }
        if let Some(untrusted) = error.downcast_ref::<zuno_shared::ownership::Untrusted>() {
            return CliError::new(CliError::BAD_INPUT, untrusted.to_string());
        }
        if let Some(migration) = error.downcast_ref::<zuno_shared::db::MigrationError>() {
            let code = match migration {
                zuno_shared::db::MigrationError::Store(store) if store.is_connection() => {
                    CliError::UNAVAILABLE
                }
                _ => CliError::FAILURE,
            };
            return CliError::new(code, migration.to_string());
        }
        CliError::new(CliError::FAILURE, format!("{error:#}"))
    }
}

impl From<zuno_shared::ledger::LedgerError> for CliError {
    fn from(error: zuno_shared::ledger::LedgerError) -> CliError {
        use zuno_shared::ledger::LedgerError;
        let code = match &error {
            LedgerError::NotFound(_) => CliError::NOT_FOUND,
            LedgerError::Invalid(_) => CliError::BAD_INPUT,
            LedgerError::LeaseLost { .. } => CliError::CONFLICT,
            LedgerError::Store(store) if store.is_connection() => CliError::UNAVAILABLE,
            LedgerError::Store(_) => CliError::FAILURE,
        };
        CliError::new(code, error.to_string())
    }
}

impl From<zuno_shared::db::StoreError> for CliError {
    fn from(error: zuno_shared::db::StoreError) -> CliError {
        let code = if error.is_connection() {
            CliError::UNAVAILABLE
        } else {
            CliError::FAILURE
        };
        CliError::new(code, error.to_string())
    }
}

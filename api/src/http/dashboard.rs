//! The dashboard's one-time sign-in code (`routes/ui.rs` serves the page that redeems it).

use std::sync::{Arc, Mutex};

use zuno_shared::clock::SharedClock;

/// How long an unused sign-in code stays valid: long enough to open the printed link, short
/// enough that a link lying in a log or a scrollback is dead by the time someone finds it.
pub const CODE_LIFETIME_MS: i64 = 10 * 60 * 1000;

/// The one-time sign-in of the dashboard.
#[derive(Clone)]
pub struct Dashboard {
    inner: Arc<DashboardInner>,
}

struct DashboardInner {
    token: Option<String>,
    clock: SharedClock,
    code: Mutex<Option<IssuedCode>>,
}

/// The unused sign-in code and when it was issued (by the server's clock).
struct IssuedCode {
    code: String,
    issued_ms: i64,
}

impl Dashboard {
    pub fn new(server_token: Option<&str>, clock: SharedClock) -> Dashboard {
        Dashboard {
            inner: Arc::new(DashboardInner {
                token: server_token.map(str::to_owned),
                clock,
                code: Mutex::new(None),
            }),
        }
    }

    /// A new one-time sign-in code (replacing any unused one), when the server has a token. It
    /// is valid for [`CODE_LIFETIME_MS`].
    pub fn new_code(&self) -> Option<String> {
        self.inner.token.as_ref()?;
        let code =
            uuid::Uuid::new_v4().simple().to_string() + &uuid::Uuid::new_v4().simple().to_string();
        *self
            .inner
            .code
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(IssuedCode {
            code: code.clone(),
            issued_ms: self.inner.clock.now_ms(),
        });
        Some(code)
    }

    /// The token for `code`, once, while the code has not expired. An expired code is
    /// forgotten, so it stays refused whatever the clock does next.
    pub fn redeem(&self, code: &str) -> Option<String> {
        let mut stored = self
            .inner
            .code
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let age = stored
            .as_ref()
            .map(|issued| self.inner.clock.now_ms() - issued.issued_ms);
        if age.is_some_and(|age| age > CODE_LIFETIME_MS) {
            *stored = None;
        }
        let matches = stored.as_ref().is_some_and(|issued| {
            let expected = &issued.code;
            expected.len() == code.len()
                && expected
                    .bytes()
                    .zip(code.bytes())
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                    == 0
        });
        if !matches {
            return None;
        }
        *stored = None;
        self.inner.token.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use zuno_shared::clock::ManualClock;

    use super::{CODE_LIFETIME_MS, Dashboard};

    #[test]
    fn a_code_works_once_within_its_lifetime() {
        let clock = ManualClock::starting_at(1_800_000_000_000);
        let dashboard = Dashboard::new(Some("server-token"), Arc::new(clock.clone()));
        let code = dashboard.new_code().expect("a code");
        clock.advance(CODE_LIFETIME_MS);
        assert_eq!(dashboard.redeem(&code).as_deref(), Some("server-token"));
        assert_eq!(dashboard.redeem(&code), None, "used once");
    }

    #[test]
    fn an_unused_code_expires() {
        let clock = ManualClock::starting_at(1_800_000_000_000);
        let dashboard = Dashboard::new(Some("server-token"), Arc::new(clock.clone()));
        let code = dashboard.new_code().expect("a code");
        clock.advance(CODE_LIFETIME_MS + 1);
        assert_eq!(dashboard.redeem(&code), None, "expired");
        // A clock set back does not revive it: the expired code is gone.
        clock.advance(-CODE_LIFETIME_MS);
        assert_eq!(dashboard.redeem(&code), None, "still refused");
        // A fresh code works again.
        let fresh = dashboard.new_code().expect("a code");
        assert_eq!(dashboard.redeem(&fresh).as_deref(), Some("server-token"));
    }
}

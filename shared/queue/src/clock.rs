//! Time as the ledger sees it: Unix milliseconds from an injectable clock.
//!
//! On Postgres the ledger decides leases, rescues and retry times by the database's clock, so a
//! host whose clock is off cannot steal or shorten another host's lease; SQLite (one host) uses
//! this local clock. See docs/adr/0002-job-ledger-design.md. Tests use [`ManualClock`] to cross
//! deadlines without sleeping, and `ZUNO_CLOCK_OFFSET_MS` to run a process whose wall clock is
//! off by a fixed amount.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// Environment variable that shifts this process's wall clock by a signed number of
/// milliseconds: a host with a skewed clock, for tests of what the ledger decides under skew.
pub const CLOCK_OFFSET_ENV: &str = "ZUNO_CLOCK_OFFSET_MS";

/// Milliseconds since the Unix epoch, from the system clock (shifted by `ZUNO_CLOCK_OFFSET_MS`
/// when set).
pub fn now_ms() -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(now.as_millis())
        .unwrap_or(i64::MAX)
        .saturating_add(clock_offset_ms())
}

fn clock_offset_ms() -> i64 {
    static OFFSET: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *OFFSET.get_or_init(|| {
        std::env::var(CLOCK_OFFSET_ENV)
            .ok()
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(0)
    })
}

pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now_ms(&self) -> i64;

    /// A simulated clock that tests move by hand. The ledger then decides leases by it on every
    /// backend; a real clock defers to the database's clock where there is one (Postgres).
    fn is_simulated(&self) -> bool {
        false
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        now_ms()
    }
}

/// A clock that only moves when told to.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<AtomicI64>,
}

impl ManualClock {
    pub fn starting_at(ms: i64) -> Self {
        ManualClock {
            now: Arc::new(AtomicI64::new(ms)),
        }
    }

    pub fn advance(&self, ms: i64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }

    pub fn now(&self) -> i64 {
        self.now.load(Ordering::SeqCst)
    }

    pub fn set(&self, ms: i64) {
        self.now.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now.load(Ordering::SeqCst)
    }

    fn is_simulated(&self) -> bool {
        true
    }
}

/// Shared handle to a clock.
pub type SharedClock = Arc<dyn Clock>;

pub fn system_clock() -> SharedClock {
    Arc::new(SystemClock)
}

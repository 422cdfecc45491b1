//! The SQL of the learning modules that are one file each: `learning/<name>.rs` keeps the
//! logic, `learning/store/<name>.rs` its statements (docs/architecture.md, "The boundary").
//! Experience and ingestion have their own `store` modules.

pub(crate) mod changes;
pub(crate) mod events;
pub(crate) mod feedback;
pub(crate) mod manifest;
pub(crate) mod policy;
pub(crate) mod projection;
pub(crate) mod snapshot;

/// Runs a read: `$sql` built by `sqlx::$query` (`query_as`, `query_scalar`) with `$key` bound to
/// `$1` (or the keys of `[…]` to `$1`, `$2`, … in order), on a pool (`on_db`) or in a
/// transaction (`on_tx`), fetched with `$fetch` (`fetch_all`, `fetch_optional`, `fetch_one`).
/// Most learning reads are this one shape, so it is written once instead of as one bind chain
/// per statement.
macro_rules! keyed {
    ($on:ident, $handle:expr, $query:ident($sql:expr), [$($key:expr),+], $fetch:ident) => {
        crate::$on!($handle, |executor| sqlx::$query($sql)
            $(.bind($key))+
            .$fetch(executor)
            .await)
    };
    ($on:ident, $handle:expr, $query:ident($sql:expr), $key:expr, $fetch:ident) => {
        $crate::learning::store::keyed!($on, $handle, $query($sql), [$key], $fetch)
    };
}
pub(crate) use keyed;

/// Runs one write statement in `tx` (see [`crate::db::execute_in`]) whose row count nobody
/// needs.
pub(crate) async fn write_in(
    tx: &mut crate::db::Tx,
    sql: &'static str,
    args: &[crate::db::Arg<'_>],
) -> Result<(), crate::db::StoreError> {
    crate::db::execute_in(tx, sql, args).await?;
    Ok(())
}

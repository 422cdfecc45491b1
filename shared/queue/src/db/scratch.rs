//! Scratch databases on a Postgres server: one is created for a single evaluation, test or
//! benchmark run and dropped after it. `CREATE DATABASE` takes no bound parameter, so the name
//! is checked here before it becomes part of a statement: callers build it from a fixed prefix
//! and generated digits, never from input.

use super::{ConnectOptions, StoreError};

/// Why a scratch database could not be created or dropped.
#[derive(Debug, thiserror::Error)]
pub enum ScratchError {
    #[error(
        "`{0}` is not a scratch database name (a lower-case letter, then lower-case letters, digits and `_`; at most 63)"
    )]
    Name(String),
    #[error("the admin URL must name a Postgres server")]
    NotPostgres,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Creates the empty database `name` on the server of `admin_url` and returns its URL.
pub async fn create_scratch_database(admin_url: &str, name: &str) -> Result<String, ScratchError> {
    on_admin(admin_url, &format!("CREATE DATABASE {}", checked(name)?)).await?;
    Ok(scratch_url(admin_url, name))
}

/// Drops `name` (if it exists) on the server of `admin_url`, closing its connections.
pub async fn drop_scratch_database(admin_url: &str, name: &str) -> Result<(), ScratchError> {
    on_admin(
        admin_url,
        &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", checked(name)?),
    )
    .await
}

/// `admin_url` with its database name replaced by `name` (query string kept).
pub fn scratch_url(admin_url: &str, name: &str) -> String {
    let (base, query) = admin_url
        .split_once('?')
        .map_or((admin_url, None), |(base, query)| (base, Some(query)));
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[scheme_end..].find('/').map(|i| scheme_end + i);
    let root = path_start.map_or(base, |i| &base[..i]);
    match query {
        Some(query) => format!("{root}/{name}?{query}"),
        None => format!("{root}/{name}"),
    }
}

fn checked(name: &str) -> Result<&str, ScratchError> {
    let mut chars = name.chars();
    let valid = name.len() <= 63
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if valid {
        Ok(name)
    } else {
        Err(ScratchError::Name(name.to_owned()))
    }
}

async fn on_admin(admin_url: &str, sql: &str) -> Result<(), ScratchError> {
    let admin = super::connect::connect(&ConnectOptions::new(admin_url.to_owned())).await?;
    let done = match admin.as_postgres() {
        Some(pool) => sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(pool)
            .await
            .map(drop)
            .map_err(|e| ScratchError::Store(e.into())),
        None => Err(ScratchError::NotPostgres),
    };
    admin.close().await;
    done
}

#[cfg(test)]
mod tests {
    use super::{ScratchError, checked, scratch_url};

    #[test]
    fn the_url_swaps_only_the_database_name() {
        assert_eq!(
            scratch_url("postgres://u@127.0.0.1:5433/postgres", "t1"),
            "postgres://u@127.0.0.1:5433/t1"
        );
        assert_eq!(
            scratch_url("postgres://u:p@h/postgres?sslmode=disable", "t1"),
            "postgres://u:p@h/t1?sslmode=disable"
        );
        assert_eq!(
            scratch_url("postgres://h:5432", "t1"),
            "postgres://h:5432/t1"
        );
    }

    #[test]
    fn only_plain_names_reach_the_statement() {
        assert!(checked("zuno_test_0f3a").is_ok());
        for bad in [
            "",
            "Zuno",
            "1abc",
            "a-b",
            "a;drop database x",
            "a b",
            &"a".repeat(64),
        ] {
            assert!(matches!(checked(bad), Err(ScratchError::Name(_))), "{bad}");
        }
    }
}

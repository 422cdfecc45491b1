//! The application's migrations (`migrations/sqlite`, `migrations/postgres`) and the one schema
//! every process opens its database with: the queue's migrations and these, in version order.
//!
//! Versions 0001 and 0014 also create and rebuild the job ledger's tables: they predate the
//! split and are recorded, with their checksums, in every deployed database, so they stay here
//! unchanged. New ledger migrations go to `shared/queue/migrations/`, new application migrations
//! here; both take the next version after the highest in either directory
//! (docs/adr/0010-one-migration-history-two-owners.md).

use std::sync::LazyLock;

use sqlx::migrate::Migrator;

use crate::db::{MigrationSet, Schema};

static SQLITE: Migrator = sqlx::migrate!("../migrations/sqlite");
static POSTGRES: Migrator = sqlx::migrate!("../migrations/postgres");

/// The application's own migrations.
pub static APPLICATION_MIGRATIONS: MigrationSet =
    MigrationSet::new("application", &SQLITE, &POSTGRES);

static SCHEMA: LazyLock<Schema> = LazyLock::new(|| {
    // Both sets are embedded at compile time, so a clash is a bug in this build, caught by the
    // test below before it can ship.
    Schema::new(&APPLICATION_MIGRATIONS)
        .expect("the queue's and the application's migrations merge")
});

/// The schema of Zuno's database: pass it to `Db::open` / `Db::connect`.
pub fn schema() -> &'static Schema {
    &SCHEMA
}

#[cfg(test)]
mod tests {
    use crate::db::Backend;

    /// The two backends list the same migrations, no version is used twice, and the merged
    /// history is the one deployed databases recorded before the split: every version from 1 to
    /// the newest except the two never released (7 and 15).
    #[test]
    fn the_merged_history_is_the_deployed_one() {
        let sqlite = super::schema().versions(Backend::Sqlite);
        assert_eq!(sqlite, super::schema().versions(Backend::Postgres));
        let versions: Vec<i64> = sqlite.iter().map(|(version, _)| *version).collect();
        let newest = *versions.last().unwrap();
        let expected: Vec<i64> = (1..=newest).filter(|v| ![7, 15].contains(v)).collect();
        assert_eq!(versions, expected);
        assert!(sqlite.contains(&(11, "ledger bounds".to_owned())));
    }
}

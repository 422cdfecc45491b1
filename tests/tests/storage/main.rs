//! Storage suites: every test body runs on SQLite and on Postgres.

mod idle_transactions;
mod ledger;
mod migrations;
mod runner;
mod snapshot;
mod states;
mod withdraw;

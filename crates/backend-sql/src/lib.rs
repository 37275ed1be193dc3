//! The SQL backend: one append-only table of key versions, one row per change.
//!
//! SQLite is implemented now (`sqlite://PATH`); PostgreSQL and MySQL will share the schema and
//! the shared write engine of `kine-core` with their own dialect.
//! This crate knows SQL and `kine-core`, nothing of gRPC.

mod pg;
mod pool;
mod restore;
mod schema;
mod sqlite;
mod view;
mod writer;

pub use pg::{PostgresBackend, PostgresOptions};
pub use restore::restore_sqlite;
pub use sqlite::{SqliteBackend, SqliteOptions};

//! The SQL backend: one append-only table of key versions, one row per change.
//!
//! SQLite (`sqlite://PATH`) and PostgreSQL (`postgres://`, `pg/`) share the log's shape and
//! the write engine of `kine-core`, each with its own SQL; MySQL/MariaDB will follow.
//! This crate knows SQL and `kine-core`, nothing of gRPC.

mod auth;
mod compact_worker;
mod events;
mod foreign;
mod gokine_log;
mod gokine_write;
mod members;
mod mysql;
mod pg;
mod pool;
mod remote;
mod removal;
mod restore;
mod schema;
mod sqlite;
mod sqlite_compact;
mod sqlite_lock;
mod view;
mod writer;

pub use foreign::check_sqlite;
pub use gokine_log::{GoKineDb, GoKineLog, GoKineRow, GoKineSummary};
pub use gokine_write::{GoKineRowOut, GoKineWriter};
pub use mysql::dsn::{parse as parse_mysql_dsn, redact as redact_mysql_dsn};
pub use mysql::{MysqlBackend, MysqlOptions};
pub use pg::{PoolOptions, PostgresBackend, PostgresOptions, TlsFiles};
pub use restore::{Restored, Row, restore_sqlite, restore_sqlite_rows};
pub use sqlite::{SqliteBackend, SqliteOptions};

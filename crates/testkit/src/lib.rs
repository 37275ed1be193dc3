//! Shared test machinery: backend constructors, the backend contract suite ([`contract`]) and
//! the model-based random checker ([`model`]). Used by the tests of every backend.

pub mod auth;
pub mod certs;
pub mod contract;
pub mod members;
pub mod migration;
pub mod model;
pub mod mysql;
pub mod nats;
pub mod postgres;
pub mod proxy;
pub mod s3;
pub mod session;

use kine_core::backend::Backend;
use std::path::Path;
use std::sync::Arc;

pub fn memory() -> Arc<dyn Backend> {
    Arc::new(kine_core::memory::MemoryBackend::new())
}

pub fn sqlite(dir: &Path) -> Arc<dyn Backend> {
    Arc::new(
        kine_backend_sql::SqliteBackend::open(kine_backend_sql::SqliteOptions { path: dir.join("state.db") })
            .expect("open sqlite backend"),
    )
}

/// A PostgreSQL backend on database `db` of `server` (created if missing).
pub fn postgres(server: &postgres::PgServer, db: &str) -> Arc<dyn Backend> {
    postgres_at(server.url(db))
}

/// A PostgreSQL backend at `url` (e.g. a server's URL with more parameters).
pub fn postgres_at(url: String) -> Arc<dyn Backend> {
    Arc::new(
        kine_backend_sql::PostgresBackend::open(kine_backend_sql::PostgresOptions {
            url,
            pool: Default::default(),
            tls: Default::default(),
            stop: None,
        })
        .expect("open postgres backend"),
    )
}

/// A MySQL backend on database `db` of `server` (created if missing).
pub fn mysql(server: &mysql::MariaDbServer, db: &str) -> Arc<dyn Backend> {
    Arc::new(
        kine_backend_sql::MysqlBackend::open(kine_backend_sql::MysqlOptions {
            url: server.url(db),
            pool: Default::default(),
            tls: Default::default(),
            stop: None,
        })
        .expect("open mysql backend"),
    )
}

/// A fresh temporary directory, removed on drop.
pub struct TempDir(std::path::PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let dir =
            std::env::temp_dir().join(format!("kine-rs-{tag}-{}-{}", std::process::id(), kine_core::id::random_u64()));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Deterministic pseudo-random numbers (xorshift64*), so failures replay from a printed seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

//! A small pool of read-only SQLite connections, used from blocking tasks.
//! WAL mode lets them read a consistent snapshot while the writer commits.

use anyhow::{Context, Result};
use rusqlite::{Connection, OpenFlags};
use std::path::PathBuf;
use std::sync::Mutex;

pub struct ReadPool {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    /// Idle connections kept beyond this are closed.
    max_idle: usize,
}

impl ReadPool {
    pub fn new(path: PathBuf, max_idle: usize) -> ReadPool {
        ReadPool { path, idle: Mutex::new(Vec::new()), max_idle }
    }

    fn take(&self) -> Result<Connection> {
        if let Some(conn) = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            return Ok(conn);
        }
        let conn =
            Connection::open_with_flags(&self.path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
                .with_context(|| format!("open {} for reading", self.path.display()))?;
        conn.busy_timeout(std::time::Duration::from_secs(30))?;
        crate::schema::tune(&conn)?;
        Ok(conn)
    }

    fn give_back(&self, conn: Connection) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < self.max_idle {
            idle.push(conn);
        }
    }

    /// Runs `f` inside one read transaction on this thread: for reads that take microseconds
    /// (one key), where the hop to a blocking thread and back costs more than the read.
    pub fn read_here<T>(&self, f: impl FnOnce(&Connection) -> kine_core::Result<T>) -> kine_core::Result<T> {
        let conn = self.take()?;
        let result = snapshot(&conn, f)?;
        self.give_back(conn);
        result
    }

    /// Runs `f` inside one read transaction (one consistent snapshot) on a blocking thread.
    pub async fn read<T: Send + 'static>(
        self: &std::sync::Arc<Self>,
        f: impl FnOnce(&Connection) -> kine_core::Result<T> + Send + 'static,
    ) -> kine_core::Result<T> {
        let pool = self.clone();
        tokio::task::spawn_blocking(move || {
            let conn = pool.take()?;
            let result = snapshot(&conn, f)?;
            pool.give_back(conn);
            result
        })
        .await
        .map_err(|e| kine_core::Error::Backend(anyhow::anyhow!("read task failed: {e}")))?
    }

    pub fn clear(&self) {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// Runs `f` inside one read transaction. The outer error: the transaction could not begin or
/// end, and the connection must not be reused; the inner one is `f`'s answer. BEGIN and COMMIT
/// are cached statements (rusqlite's `transaction()` compiles both every time).
fn snapshot<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> kine_core::Result<T>,
) -> kine_core::Result<kine_core::Result<T>> {
    conn.prepare_cached("BEGIN").and_then(|mut s| s.execute([])).context("begin read transaction")?;
    let result = f(conn);
    conn.prepare_cached("COMMIT").and_then(|mut s| s.execute([])).context("end read transaction")?;
    Ok(result)
}

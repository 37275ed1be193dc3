//! Idle PostgreSQL connections for reads, each read one REPEATABLE READ, read-only transaction
//! (one consistent snapshot) on a blocking thread. A broken connection is dropped, not reused.

use super::Connector;
use anyhow::Context;
use std::sync::Mutex;

pub struct ReadPool {
    connector: Connector,
    idle: Mutex<Vec<postgres::Client>>,
    max_idle: usize,
}

impl ReadPool {
    pub fn new(connector: Connector, max_idle: usize) -> ReadPool {
        ReadPool { connector, idle: Mutex::new(Vec::new()), max_idle }
    }

    fn take(&self) -> kine_core::Result<postgres::Client> {
        loop {
            let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
            match idle {
                Some(c) if !c.is_closed() => return Ok(c),
                Some(_) => continue,
                None => break,
            }
        }
        self.connector.connect().map_err(|e| kine_core::Error::Unavailable(format!("PostgreSQL: {e:#}")))
    }

    /// Runs `f` in one REPEATABLE READ, read-only transaction.
    pub async fn read<T: Send + 'static>(
        self: &std::sync::Arc<Self>,
        f: impl FnOnce(&mut postgres::Transaction<'_>) -> kine_core::Result<T> + Send + 'static,
    ) -> kine_core::Result<T> {
        self.run(true, f).await
    }

    /// Runs `f` in one read-write transaction (small bookkeeping writes beside the writer).
    pub async fn write<T: Send + 'static>(
        self: &std::sync::Arc<Self>,
        f: impl FnOnce(&mut postgres::Transaction<'_>) -> kine_core::Result<T> + Send + 'static,
    ) -> kine_core::Result<T> {
        self.run(false, f).await
    }

    async fn run<T: Send + 'static>(
        self: &std::sync::Arc<Self>,
        read_only: bool,
        f: impl FnOnce(&mut postgres::Transaction<'_>) -> kine_core::Result<T> + Send + 'static,
    ) -> kine_core::Result<T> {
        let pool = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = pool.take()?;
            let result = (|| {
                let mut tx = if read_only {
                    conn.build_transaction()
                        .isolation_level(postgres::IsolationLevel::RepeatableRead)
                        .read_only(true)
                        .start()
                } else {
                    conn.transaction()
                }
                .context("begin transaction")?;
                let result = f(&mut tx);
                tx.commit().context("end transaction")?;
                result
            })();
            if conn.is_closed() {
                return Err(match result {
                    Err(kine_core::Error::Backend(e)) => kine_core::Error::Unavailable(format!("PostgreSQL: {e:#}")),
                    Err(other) => other,
                    Ok(_) => kine_core::Error::Unavailable("PostgreSQL: connection lost".into()),
                });
            }
            let mut idle = pool.idle.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() < pool.max_idle {
                idle.push(conn);
            }
            result
        })
        .await
        .map_err(|e| kine_core::Error::Backend(anyhow::anyhow!("read task failed: {e}")))?
    }

    pub fn clear(&self) {
        let idle = std::mem::take(&mut *self.idle.lock().unwrap_or_else(|p| p.into_inner()));
        drop_off_runtime(idle);
    }
}

impl Drop for ReadPool {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Closing a synchronous client blocks on its own runtime, which must not happen on a thread
/// that drives async tasks: such clients are closed on a thread of their own.
fn drop_off_runtime(clients: Vec<postgres::Client>) {
    if clients.is_empty() {
        return;
    }
    let _ = std::thread::Builder::new().name("pg-close".into()).spawn(move || drop(clients));
}

//! Pooled PostgreSQL connections for reads (one REPEATABLE READ, read-only transaction each:
//! one consistent snapshot) and small bookkeeping writes, run on blocking threads. Limits are
//! kine's pool flags (`PoolOptions`). A broken connection is dropped, never reused; each keeps
//! its prepared statements (`conn.rs`).

use super::conn::Conn;
use super::{Connector, PoolOptions};
use anyhow::Context;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::Semaphore;

struct Pooled {
    conn: Conn,
    opened: Instant,
    idle_since: Instant,
}

pub struct ReadPool {
    connector: Connector,
    options: PoolOptions,
    idle: Mutex<Vec<Pooled>>,
    /// Permits for open connections (`max_open`).
    open: Option<Arc<Semaphore>>,
}

impl ReadPool {
    pub fn new(connector: Connector, options: PoolOptions) -> ReadPool {
        let open = options.max_open.map(|n| Arc::new(Semaphore::new(n.max(1))));
        ReadPool { connector, options, idle: Mutex::new(Vec::new()), open }
    }

    fn expired(&self, p: &Pooled, now: Instant) -> bool {
        p.conn.is_closed()
            || self.options.max_lifetime.is_some_and(|l| now.duration_since(p.opened) >= l)
            || self.options.max_idle_time.is_some_and(|l| now.duration_since(p.idle_since) >= l)
    }

    fn take(&self) -> kine_core::Result<Pooled> {
        let now = Instant::now();
        let mut stale = Vec::new();
        let found = {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                match idle.pop() {
                    Some(p) if self.expired(&p, now) => stale.push(p.conn),
                    other => break other,
                }
            }
        };
        drop(stale); // on this blocking thread
        match found {
            Some(p) => Ok(p),
            None => {
                let conn =
                    self.connector.open().map_err(|e| kine_core::Error::Unavailable(format!("PostgreSQL: {e:#}")))?;
                Ok(Pooled { conn, opened: now, idle_since: now })
            }
        }
    }

    fn give_back(&self, mut p: Pooled) {
        let now = Instant::now();
        p.idle_since = now;
        if self.expired(&p, now) {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < self.options.max_idle {
            idle.push(p);
        }
    }

    /// Runs `f` in one REPEATABLE READ, read-only transaction.
    pub async fn read<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Conn) -> kine_core::Result<T> + Send + 'static,
    ) -> kine_core::Result<T> {
        self.run("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY", f).await
    }

    /// Runs `f`, which sends one statement: a snapshot of its own, no transaction around it
    /// (one round trip instead of three). An idle connection found broken is replaced and `f`
    /// run again.
    pub async fn single<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl Fn(&mut Conn) -> kine_core::Result<T> + Send + 'static,
    ) -> kine_core::Result<T> {
        let permit = crate::remote::open_permit(&self.open).await?;
        let pool = self.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            loop {
                let mut conn = pool.take()?;
                let result = f(&mut conn.conn);
                if !conn.conn.is_closed() {
                    pool.give_back(conn);
                    return result;
                }
                if conn.opened == conn.idle_since {
                    // A fresh connection failed: an outage.
                    return Err(match result {
                        Err(kine_core::Error::Backend(e)) => {
                            kine_core::Error::Unavailable(format!("PostgreSQL: {e:#}"))
                        }
                        Err(other) => other,
                        Ok(_) => kine_core::Error::Unavailable("PostgreSQL: connection lost".into()),
                    });
                }
            }
        })
        .await
        .map_err(|e| kine_core::Error::Backend(anyhow::anyhow!("read task failed: {e}")))?
    }

    /// Runs `f` in one read-write transaction (small bookkeeping writes beside the writer).
    pub async fn write<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Conn) -> kine_core::Result<T> + Send + 'static,
    ) -> kine_core::Result<T> {
        self.run("BEGIN", f).await
    }

    async fn run<T: Send + 'static>(
        self: &Arc<Self>,
        begin: &'static str,
        f: impl FnOnce(&mut Conn) -> kine_core::Result<T> + Send + 'static,
    ) -> kine_core::Result<T> {
        let permit = crate::remote::open_permit(&self.open).await?;
        let pool = self.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            // An idle connection that broke while it waited (the database restarted) shows it
            // only when used: one that fails to begin is dropped and the next one tried.
            let mut conn = loop {
                let mut conn = pool.take()?;
                let begun = conn.conn.client().batch_execute(begin);
                match begun {
                    Ok(()) => break conn,
                    Err(_) if conn.conn.is_closed() && conn.opened != conn.idle_since => continue,
                    Err(e) => {
                        return Err(kine_core::Error::Unavailable(format!("PostgreSQL: begin transaction: {e}")));
                    }
                }
            };
            let result = (|| {
                let result = f(&mut conn.conn);
                let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
                conn.conn.client().batch_execute(end).with_context(|| format!("{end} transaction"))?;
                result
            })();
            if conn.conn.is_closed() {
                return Err(match result {
                    Err(kine_core::Error::Backend(e)) => kine_core::Error::Unavailable(format!("PostgreSQL: {e:#}")),
                    Err(other) => other,
                    Ok(_) => kine_core::Error::Unavailable("PostgreSQL: connection lost".into()),
                });
            }
            pool.give_back(conn);
            result
        })
        .await
        .map_err(|e| kine_core::Error::Backend(anyhow::anyhow!("read task failed: {e}")))?
    }

    pub fn clear(&self) {
        let idle = std::mem::take(&mut *self.idle.lock().unwrap_or_else(|p| p.into_inner()));
        if !idle.is_empty() {
            // Closing a synchronous client blocks on its own runtime, which must not happen on
            // a thread that drives async tasks.
            let _ = std::thread::Builder::new().name("pg-close".into()).spawn(move || drop(idle));
        }
    }
}

impl Drop for ReadPool {
    fn drop(&mut self) {
        self.clear();
    }
}

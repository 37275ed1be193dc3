//! Pooled MySQL connections for reads (one consistent-snapshot, read-only transaction each) and
//! small bookkeeping writes, run on blocking threads, within kine's pool flags (`PoolOptions`).
//! A connection that failed at the network level is dropped, never reused.

use super::{Connector, Role, connection_lost, unavailable};
use crate::remote::PoolOptions;
use kine_core::{Error, Result};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::Semaphore;

struct Pooled {
    conn: mysql::Conn,
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
        self.options.max_lifetime.is_some_and(|l| now.duration_since(p.opened) >= l)
            || self.options.max_idle_time.is_some_and(|l| now.duration_since(p.idle_since) >= l)
    }

    fn take(&self) -> Result<(Pooled, bool)> {
        let now = Instant::now();
        let mut stale = Vec::new();
        let found = {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                match idle.pop() {
                    Some(p) if self.expired(&p, now) => stale.push(p),
                    other => break other,
                }
            }
        };
        drop(stale);
        match found {
            Some(p) => Ok((p, true)),
            None => {
                let conn = self.connector.connect(Role::Pool).map_err(|e| unavailable(&e))?;
                Ok((Pooled { conn, opened: now, idle_since: now }, false))
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

    /// Runs `f` in one consistent-snapshot, read-only transaction (REPEATABLE READ).
    pub async fn read<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut mysql::Conn) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.run("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY", f).await
    }

    /// Runs `f`, which sends one statement: a snapshot of its own, no transaction around it
    /// (one round trip instead of four). An idle connection found broken is replaced and `f`
    /// run again.
    pub async fn single<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl Fn(&mut mysql::Conn) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let permit = crate::remote::open_permit(&self.open).await?;
        let pool = self.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            loop {
                let (mut conn, reused) = pool.take()?;
                match f(&mut conn.conn) {
                    Err(Error::Backend(e)) if connection_lost(&e) => {
                        if !reused {
                            return Err(unavailable(&e));
                        }
                    }
                    result => {
                        pool.give_back(conn);
                        return result;
                    }
                }
            }
        })
        .await
        .map_err(|e| Error::Backend(anyhow::anyhow!("read task failed: {e}")))?
    }

    /// Runs `f` in one read-write transaction (small bookkeeping writes beside the writer).
    pub async fn write<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut mysql::Conn) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.run("START TRANSACTION", f).await
    }

    async fn run<T: Send + 'static>(
        self: &Arc<Self>,
        begin: &'static str,
        f: impl FnOnce(&mut mysql::Conn) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        use mysql::prelude::Queryable;
        let permit = crate::remote::open_permit(&self.open).await?;
        let pool = self.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            // An idle connection that broke while it waited (the database restarted) shows it
            // only when used: one that fails to begin is dropped and the next one tried.
            let mut conn = loop {
                let (mut conn, reused) = pool.take()?;
                match conn.conn.query_drop(begin) {
                    Ok(()) => break conn,
                    Err(e) => {
                        let e = anyhow::Error::new(e).context("begin transaction");
                        if reused && connection_lost(&e) {
                            continue;
                        }
                        return Err(unavailable(&e));
                    }
                }
            };
            let result = f(&mut conn.conn);
            let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
            let ended =
                conn.conn.query_drop(end).map_err(|e| anyhow::Error::new(e).context(format!("{end} transaction")));
            let lost = match (&result, &ended) {
                (_, Err(e)) => connection_lost(e),
                (Err(Error::Backend(e)), _) => connection_lost(e),
                _ => false,
            };
            if lost {
                return Err(match (result, ended) {
                    (Err(Error::Backend(e)), _) | (_, Err(e)) => unavailable(&e),
                    (Err(other), _) => other,
                    (Ok(_), Ok(())) => unreachable!("lost implies an error"),
                });
            }
            let result = match ended {
                Ok(()) => result,
                Err(e) => result.and(Err(Error::Backend(e))),
            };
            pool.give_back(conn);
            result
        })
        .await
        .map_err(|e| Error::Backend(anyhow::anyhow!("read task failed: {e}")))?
    }

    pub fn clear(&self) {
        let idle = std::mem::take(&mut *self.idle.lock().unwrap_or_else(|p| p.into_inner()));
        drop(idle);
    }
}

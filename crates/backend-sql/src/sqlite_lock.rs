//! One serving process per SQLite database. kine-rs keeps the revision counter of an SQLite
//! database in memory, so a second process writing the same file would hand out revisions the
//! first one also hands out (its writes then fail on the table's unique keys, and each process
//! answers reads from a different idea of the store). A writer therefore holds an exclusive
//! lock (`flock`) on `<database>.kine-rs-lock`, with its pid inside, for as long as it is open;
//! a second one is refused at start naming that pid. Readers (`inspect`, `migrate --from`)
//! take no lock. The lock is a file of its own, not the database: on NFS, Linux emulates
//! `flock` with the POSIX locks SQLite itself uses, which a lock on the database would disturb.

use anyhow::{Context, bail};
use std::fs::{File, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The held lock; released by [`ServeLock::release`] or when the process ends.
pub(crate) struct ServeLock(Mutex<Option<File>>);

pub(crate) fn lock_path(database: &Path) -> PathBuf {
    let mut name = database.as_os_str().to_os_string();
    name.push(".kine-rs-lock");
    name.into()
}

/// Takes the lock of `database`, or fails naming the process that holds it.
pub(crate) fn take(database: &Path) -> anyhow::Result<ServeLock> {
    let path = lock_path(database);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("open the lock file {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            let who = if holder.is_empty() { "another process".to_string() } else { format!("process {holder}") };
            bail!(
                "{} is open for writing in {who} (it holds {}): one SQLite database is served by one kine-rs at a \
                 time; stop that one first, or serve several nodes from PostgreSQL, MySQL or NATS",
                database.display(),
                path.display()
            );
        }
        Err(TryLockError::Error(e)) => return Err(e).with_context(|| format!("lock {}", path.display())),
    }
    file.set_len(0)?;
    file.rewind()?;
    writeln!(file, "{}", std::process::id())?;
    Ok(ServeLock(Mutex::new(Some(file))))
}

impl ServeLock {
    /// Lets another opener take the database (the backend is closed).
    pub(crate) fn release(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

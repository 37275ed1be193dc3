//! Where the NATS replica keeps the bucket's values by default (a file, unlinked at once:
//! docs/nats.md): [`NatsOptions::new`](crate::NatsOptions::new) and the kine-rs binary use it.
//!
//! A temporary directory, never the embedded server's store: JetStream sizes its limit from
//! that disk's free space, and a file beside it would fill the disk before the limit is reached.
//! `TMPDIR` when set (the user's choice, even a tmpfs); otherwise `/tmp`, unless `/tmp` is a
//! tmpfs (Debian 13, Fedora, Arch) and `/var/tmp` is on disk: in a tmpfs the values would be
//! held in memory again, only outside the process.

use std::path::{Path, PathBuf};

/// The directory for the replica's value file (see the module documentation).
pub fn values_dir() -> PathBuf {
    let dir = choose(std::env::var_os("TMPDIR").map(PathBuf::from), is_tmpfs);
    tracing::debug!(dir = %dir.display(), tmpfs = ?is_tmpfs(&dir), "the NATS replica's value file goes here");
    dir
}

/// `in_tmpfs(dir)`: whether `dir` is in a tmpfs, `None` if that cannot be told (no such
/// directory, or not Linux).
fn choose(tmpdir: Option<PathBuf>, in_tmpfs: impl Fn(&Path) -> Option<bool>) -> PathBuf {
    if let Some(dir) = tmpdir.filter(|d| !d.as_os_str().is_empty()) {
        return dir;
    }
    let (tmp, var_tmp) = (PathBuf::from("/tmp"), PathBuf::from("/var/tmp"));
    if in_tmpfs(&tmp) == Some(true) && in_tmpfs(&var_tmp) == Some(false) { var_tmp } else { tmp }
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn is_tmpfs(dir: &Path) -> Option<bool> {
    use std::os::unix::ffi::OsStrExt;
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `path` is a NUL-terminated string and `st` a statfs the call fills in.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    // f_type is a signed long on glibc and an unsigned one on musl.
    #[allow(clippy::unnecessary_cast)]
    Some(st.f_type as u64 == TMPFS_MAGIC)
}

#[cfg(not(target_os = "linux"))]
fn is_tmpfs(_: &Path) -> Option<bool> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fs(tmpfs: &'static [&'static str], disk: &'static [&'static str]) -> impl Fn(&Path) -> Option<bool> {
        move |p: &Path| {
            let p = p.to_str().unwrap();
            if tmpfs.contains(&p) {
                Some(true)
            } else if disk.contains(&p) {
                Some(false)
            } else {
                None
            }
        }
    }

    #[test]
    fn tmpdir_wins_even_on_a_tmpfs() {
        let dir = choose(Some("/run/user/1000".into()), fs(&["/run/user/1000", "/tmp"], &["/var/tmp"]));
        assert_eq!(dir, Path::new("/run/user/1000"));
    }

    #[test]
    fn a_tmpfs_tmp_gives_way_to_var_tmp_on_disk() {
        assert_eq!(choose(None, fs(&["/tmp"], &["/var/tmp"])), Path::new("/var/tmp"));
        assert_eq!(choose(Some("".into()), fs(&["/tmp"], &["/var/tmp"])), Path::new("/var/tmp"));
    }

    #[test]
    fn tmp_stays_when_on_disk_or_when_var_tmp_is_no_better() {
        assert_eq!(choose(None, fs(&[], &["/tmp", "/var/tmp"])), Path::new("/tmp"));
        assert_eq!(choose(None, fs(&["/tmp", "/var/tmp"], &[])), Path::new("/tmp"));
        assert_eq!(choose(None, fs(&["/tmp"], &[])), Path::new("/tmp"));
        assert_eq!(choose(None, fs(&[], &[])), Path::new("/tmp"));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_machine_tells_a_tmpfs_from_a_disk() {
        // /proc is neither; /dev/shm is a tmpfs wherever glibc's shm_open works.
        assert_eq!(is_tmpfs(Path::new("/dev/shm")), Some(true));
        assert_eq!(is_tmpfs(Path::new("/proc")), Some(false));
        assert_eq!(is_tmpfs(Path::new("/no/such/dir")), None);
    }
}

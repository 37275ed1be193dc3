//! Faults the harness injects and heals on a schedule.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A fault: something broken on `inject`, repaired on `heal`.
pub trait Fault: Send {
    fn name(&self) -> String;
    fn inject(&mut self) -> Result<()>;
    fn heal(&mut self) -> Result<()>;
}

/// Stops processes with SIGSTOP (a datastore that stalls: no crash, no closed connection, no
/// answer) and resumes them with SIGCONT. Processes left stopped are resumed on drop.
pub struct Stall {
    pub what: String,
    /// The processes named; with `tree`, their descendants at the time of each stall too
    /// (PostgreSQL's backends, for one).
    pub roots: Vec<u32>,
    tree: bool,
    stopped: Vec<u32>,
}

impl Stall {
    pub fn new(what: impl Into<String>, pids: Vec<u32>) -> Stall {
        Stall { what: what.into(), roots: pids, tree: false, stopped: Vec::new() }
    }

    /// Stalls `pid` and every process it started.
    pub fn tree(what: impl Into<String>, pid: u32) -> Stall {
        Stall { what: what.into(), roots: vec![pid], tree: true, stopped: Vec::new() }
    }
}

/// `roots` and all their descendants, from /proc.
pub fn descendants(roots: &[u32]) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
            // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
            if let Some(ppid) = after.split_whitespace().nth(1).and_then(|p| p.parse().ok()) {
                parents.push((pid, ppid));
            }
        }
    }
    let mut all = roots.to_vec();
    let mut i = 0;
    while i < all.len() {
        let parent = all[i];
        all.extend(parents.iter().filter(|(_, pp)| *pp == parent).map(|(p, _)| *p));
        i += 1;
    }
    all
}

fn signal(pid: u32, sig: libc::c_int) -> Result<()> {
    // SAFETY: kill(2) with a pid and a signal number has no memory-safety preconditions.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
    if rc != 0 {
        bail!("kill({pid}, {sig}): {}", std::io::Error::last_os_error());
    }
    Ok(())
}

impl Fault for Stall {
    fn name(&self) -> String {
        format!("stall of {} (SIGSTOP)", self.what)
    }
    fn inject(&mut self) -> Result<()> {
        let pids = if self.tree { descendants(&self.roots) } else { self.roots.clone() };
        for &pid in &pids {
            signal(pid, libc::SIGSTOP)?;
            self.stopped.push(pid);
        }
        Ok(())
    }
    fn heal(&mut self) -> Result<()> {
        for pid in std::mem::take(&mut self.stopped) {
            // A process that exited meanwhile is not an error.
            let _ = signal(pid, libc::SIGCONT);
        }
        Ok(())
    }
}

impl Drop for Stall {
    fn drop(&mut self) {
        let _ = self.heal();
    }
}

/// A small file system of its own (tmpfs), so that a disk can fill up without touching the
/// machine's. Unmounted (lazily, even if files are still open) and removed on drop.
pub struct SmallDisk {
    pub path: PathBuf,
    mounted: bool,
}

impl SmallDisk {
    /// Mounts a `size_mib` tmpfs at a new directory under `parent`. Refuses with a clear
    /// message where mounting is not allowed (needs root, or CAP_SYS_ADMIN).
    pub fn mount(parent: &Path, size_mib: u64) -> Result<SmallDisk> {
        require_root("a small file system that fills up (tmpfs mount)")?;
        let path = parent.join(format!("small-disk-{}", std::process::id()));
        std::fs::create_dir_all(&path).with_context(|| format!("create {}", path.display()))?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "kine-chaos"])
            .arg(&path)
            .status()
            .context("run mount")?;
        if !status.success() {
            let _ = std::fs::remove_dir(&path);
            bail!("mount -t tmpfs at {} failed ({status}): the fault harness cannot fill a disk here", path.display());
        }
        Ok(SmallDisk { path, mounted: true })
    }

    /// Fills the file system with a file until writing fails; returns the file's path.
    pub fn fill(&self) -> Result<PathBuf> {
        use std::io::Write;
        let filler = self.path.join("filler");
        let mut f = std::fs::File::create(&filler).context("create filler")?;
        let block = vec![0u8; 64 * 1024];
        loop {
            match f.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => return Err(e).context("fill"),
            }
        }
        // Whatever fits of a smaller write, so that not even a page is left.
        let small = [0u8; 512];
        while f.write(&small).map(|n| n > 0).unwrap_or(false) {}
        Ok(filler)
    }

    /// Bytes still free.
    pub fn free_bytes(&self) -> u64 {
        let out = Command::new("df").args(["-B1", "--output=avail"]).arg(&self.path).output();
        out.ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).lines().nth(1).and_then(|l| l.trim().parse().ok()))
            .unwrap_or(0)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
            let _ = std::fs::remove_dir(&self.path);
        }
    }
}

/// Refuses, with a message that says why, where namespaces or mounts cannot be made.
pub fn require_root(what: &str) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    #[allow(unsafe_code)]
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        bail!("{what} needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN); run the fault tests as root");
    }
    Ok(())
}

//! What the server under load spent: CPU time and peak resident memory, read from `/proc` for
//! the process id given with `--server-pid` (Linux).

use anyhow::{Context as _, Result};

#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    /// User + system CPU time, seconds.
    pub cpu_s: f64,
    /// Peak resident set size (VmHWM), MiB.
    pub peak_rss_mib: f64,
    /// Resident anonymous memory now (RssAnon), MiB: the process's own memory, without the
    /// files it maps (etcd's bbolt file and kine-rs's SQLite file are mapped, and their cached
    /// pages count in the RSS).
    pub rss_anon_mib: f64,
}

pub fn usage(pid: u32) -> Result<Usage> {
    let stat =
        std::fs::read_to_string(format!("/proc/{pid}/stat")).with_context(|| format!("read /proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) closed by ')'.
    let fields: Vec<&str> = stat.rsplit_once(')').context("bad /proc stat")?.1.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the line: 11 and 12 (from 0) after the name.
    let hz = 100.0; // USER_HZ on Linux
    let cpu_s = (ticks(11) + ticks(12)) / hz;
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).with_context(|| format!("read /proc/{pid}/status"))?;
    let mib = |field: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(0.0, |kib| kib / 1024.0)
    };
    Ok(Usage { cpu_s, peak_rss_mib: mib("VmHWM:"), rss_anon_mib: mib("RssAnon:") })
}

/// The process's resident set size now (VmRSS), MiB.
pub fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse::<f64>().ok()?;
    Some(kib / 1024.0)
}

/// Resets the process's peak resident set size (VmHWM) to its current one, so that the next
/// reading is the peak since now (Linux's `clear_refs`; needs the right to write it).
pub fn reset_peak(pid: u32) {
    if let Err(e) = std::fs::write(format!("/proc/{pid}/clear_refs"), "5") {
        eprintln!("cannot reset the peak RSS of {pid} ({e}): the reported peak covers its whole life");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_this_process() {
        let u = super::usage(std::process::id()).unwrap();
        assert!(u.peak_rss_mib > 0.0);
        assert!(u.rss_anon_mib > 0.0 && u.rss_anon_mib <= u.peak_rss_mib);
        assert!(u.cpu_s >= 0.0);
    }
}

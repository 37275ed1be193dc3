//! `kine-rs migrate`'s progress: a line on stderr rewritten in place on a terminal, a log line
//! every 10 s otherwise.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

pub struct Progress {
    what: &'static str,
    unit: &'static str,
    total: u64,
    done: u64,
    started: Instant,
    shown: Instant,
    tty: bool,
}

impl Progress {
    pub fn new(what: &'static str, unit: &'static str, total: u64) -> Progress {
        let now = Instant::now();
        Progress { what, unit, total, done: 0, started: now, shown: now, tty: std::io::stderr().is_terminal() }
    }

    pub fn advance(&mut self, n: u64) {
        self.done += n;
        let every = if self.tty { Duration::from_millis(200) } else { Duration::from_secs(10) };
        if self.shown.elapsed() >= every {
            self.shown = Instant::now();
            self.show();
        }
    }

    fn line(&self) -> String {
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        let rate = self.done as f64 / secs;
        let percent = if self.total == 0 { 100.0 } else { 100.0 * self.done as f64 / self.total as f64 };
        let left = if rate > 0.0 { self.total.saturating_sub(self.done) as f64 / rate } else { 0.0 };
        format!(
            "{}: {} of {} {} ({percent:.0} %), {rate:.0}/s, {left:.0} s left",
            self.what, self.done, self.total, self.unit
        )
    }

    fn show(&self) {
        if self.tty {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K{}", self.line());
            let _ = err.flush();
        } else {
            tracing::info!("{}", self.line());
        }
    }

    /// The last line, then a new line on a terminal.
    pub fn finish(self) {
        if self.tty && self.total > 0 {
            self.show();
            eprintln!();
        }
    }
}

//! An SQL session that stays open between statements (`psql` or the `mariadb` client reading
//! from a pipe), for tests that hold a lock or a transaction while kine-rs works.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

pub struct Session {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    marks: u64,
}

impl Session {
    /// Starts the client; it must print each query's rows unaligned, one per line.
    pub fn spawn(mut command: Command) -> Session {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the SQL client");
        let input = child.stdin.take().expect("client stdin");
        let output = BufReader::new(child.stdout.take().expect("client stdout"));
        Session { child, input, output, marks: 0 }
    }

    /// Runs `sql` (statements ending in `;`) and returns the rows it printed, once the client
    /// has answered them all.
    pub fn run(&mut self, sql: &str) -> String {
        self.marks += 1;
        let mark = format!("kine-rs-session-mark-{}", self.marks);
        writeln!(self.input, "{sql}\nSELECT '{mark}';").expect("write to the SQL client");
        self.input.flush().expect("flush the SQL client's input");
        let mut rows = String::new();
        loop {
            let mut line = String::new();
            let n = self.output.read_line(&mut line).expect("read the SQL client's output");
            assert!(n > 0, "the SQL client exited while running {sql:?} (rows so far: {rows:?})");
            if line.trim_end() == mark {
                return rows;
            }
            rows.push_str(&line);
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

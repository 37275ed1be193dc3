//! A throwaway PostgreSQL server for tests: `initdb` into a temporary directory, then the
//! `postgres` server itself as a child process on a free loopback port (killed on drop), with a
//! password user `kine`. The binaries come from `PG_BIN`, or the newest
//! `/usr/lib/postgresql/*/bin` (Debian's `postgresql` package; `scripts/install-test-deps`
//! installs it). A missing PostgreSQL is a test failure, never a skip. As root, the server runs
//! as the `postgres` user (PostgreSQL refuses to run as root).

use crate::TempDir;
use crate::nats::free_port;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const USER: &str = "kine";
pub const PASSWORD: &str = "kine-test-password";

fn bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| {
            d.filter_map(|e| e.ok()).map(|e| e.path().join("bin")).filter(|p| p.join("initdb").is_file()).collect()
        })
        .unwrap_or_default();
    found.sort_by_key(|p| {
        p.parent().and_then(|v| v.file_name()).and_then(|v| v.to_str()).and_then(|v| v.parse::<u32>().ok()).unwrap_or(0)
    });
    found.pop().unwrap_or_else(|| {
        panic!("PostgreSQL not found: install Debian's postgresql package (scripts/install-test-deps) or set PG_BIN")
    })
}

/// The uid and gid to run PostgreSQL as: `postgres` when this process is root.
fn run_as() -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to this process's effective user.
    if std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(1) != 0 {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    let line = passwd
        .lines()
        .find(|l| l.starts_with("postgres:"))
        .expect("running as root needs a postgres user (Debian's postgresql package creates it)");
    let fields: Vec<&str> = line.split(':').collect();
    Some((fields[2].parse().expect("uid"), fields[3].parse().expect("gid")))
}

fn command(path: PathBuf, user: Option<(u32, u32)>) -> Command {
    let mut cmd = Command::new(path);
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
    }
    cmd.current_dir("/");
    cmd
}

pub struct PgServer {
    child: Child,
    pub port: u16,
    bin: PathBuf,
    user: Option<(u32, u32)>,
    dir: TempDir,
}

impl PgServer {
    pub fn start() -> PgServer {
        Self::start_with(None)
    }

    /// A server that takes only TLS connections with a client certificate, from the files of
    /// [`crate::certs::make_certs`] in `certs`.
    pub fn start_tls(certs: &std::path::Path) -> PgServer {
        Self::start_with(Some(certs))
    }

    fn start_with(tls: Option<&std::path::Path>) -> PgServer {
        let bin = bin_dir();
        let user = run_as();
        let dir = TempDir::new("pg");
        let data = dir.path().join("data");
        let pwfile = dir.path().join("pwfile");
        std::fs::write(&pwfile, format!("{PASSWORD}\n")).expect("write pwfile");
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown the data directory");
            std::os::unix::fs::chown(&pwfile, Some(uid), Some(gid)).expect("chown pwfile");
        }
        let out = command(bin.join("initdb"), user)
            .arg("-D")
            .arg(&data)
            .args(["-U", USER, "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8"])
            .arg(format!("--pwfile={}", pwfile.display()))
            .arg("--no-sync")
            .output()
            .expect("run initdb");
        assert!(out.status.success(), "initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        if let Some(certs) = tls {
            // TLS only, and a client certificate signed by the CA as well as the password.
            for (from, to) in [("server.crt", "server.crt"), ("server.key", "server.key"), ("ca.crt", "root.crt")] {
                let dest = data.join(to);
                std::fs::copy(certs.join(from), &dest).expect("copy certificate");
                std::fs::set_permissions(&dest, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
                if let Some((uid, gid)) = user {
                    std::os::unix::fs::chown(&dest, Some(uid), Some(gid)).expect("chown certificate");
                }
            }
            let mut conf = std::fs::OpenOptions::new().append(true).open(data.join("postgresql.conf")).unwrap();
            std::io::Write::write_all(&mut conf, b"ssl = on\nssl_ca_file = 'root.crt'\n").unwrap();
            std::fs::write(
                data.join("pg_hba.conf"),
                "local all all trust\nhostssl all all 127.0.0.1/32 scram-sha-256 clientcert=verify-ca\n",
            )
            .unwrap();
        }
        let port = free_port();
        let child = Self::spawn(&bin, user, &dir, port);
        PgServer { child, port, bin, user, dir }
    }

    fn spawn(bin: &std::path::Path, user: Option<(u32, u32)>, dir: &TempDir, port: u16) -> Child {
        let log_path = dir.path().join("server.log");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path).expect("open the postgres log");
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&log_path, Some(uid), Some(gid)).expect("chown log");
        }
        let mut child = command(bin.join("postgres"), user)
            .arg("-D")
            .arg(dir.path().join("data"))
            .args(["-c", "listen_addresses=127.0.0.1", "-p", &port.to_string(), "-k"])
            .arg(dir.path())
            .args(["-c", "max_connections=300"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn postgres");
        // Ready when it accepts connections (an open port may still answer "starting up").
        let ready = || {
            Command::new(bin.join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &port.to_string()])
                .status()
                .is_ok_and(|s| s.success())
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready() {
            let exited = matches!(child.try_wait(), Ok(Some(_)));
            if exited || Instant::now() > deadline {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                panic!("postgres did not start on port {port}:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child
    }

    /// Stops the server at once (PostgreSQL's immediate shutdown: no checkpoint, recovery at
    /// the next start, as after a crash). Its data stays for [`PgServer::restart`].
    pub fn stop(&mut self) {
        let _ = Command::new("kill").args(["-QUIT", &self.child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server again on the same port and data.
    pub fn restart(&mut self) {
        self.child = Self::spawn(&self.bin, self.user, &self.dir, self.port);
    }

    /// The URL of database `db` (created by kine-rs when missing).
    /// Runs `sql` in database `db` with `psql` as the test user (over TCP); panics if it fails.
    pub fn sql(&self, db: &str, sql: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", USER, "-d", db, "-v", "ON_ERROR_STOP=1"])
            .args(["-At", "-c", sql])
            .env("PGPASSWORD", PASSWORD)
            .stdin(Stdio::null())
            .output()
            .expect("run psql");
        assert!(out.status.success(), "psql -c {sql:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A `psql` session on database `db` that stays open (see `Session`).
    pub fn session(&self, db: &str) -> crate::session::Session {
        let mut command = Command::new(self.bin.join("psql"));
        command
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", USER, "-d", db, "-v", "ON_ERROR_STOP=1"])
            .args(["-At", "-q"])
            .env("PGPASSWORD", PASSWORD);
        crate::session::Session::spawn(command)
    }

    /// The uid and gid the server runs as when it is not this process's user (as root: the
    /// `postgres` user), for files it must own (a tablespace directory).
    pub fn os_user(&self) -> Option<(u32, u32)> {
        self.user
    }

    /// The postmaster's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self, db: &str) -> String {
        format!("postgres://{USER}:{PASSWORD}@127.0.0.1:{}/{db}?sslmode=disable", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.stop();
    }
}

//! A throwaway MariaDB server for tests: `mariadb-install-db` into a temporary directory, then
//! `mariadbd` itself as a child process on a free loopback port (killed on drop), with a
//! password user `kine` that may connect from anywhere. The binaries come from the directory
//! `MARIADB_BIN`, or `PATH`, `/usr/sbin` and `/usr/bin` (Debian's `mariadb-server` and
//! `mariadb-client` packages; `scripts/install-test-deps` installs them). A missing MariaDB is a
//! test failure, never a skip.
//!
//! As root, the server runs as the `mysql` user (`--user=mysql`; it refuses root) and the
//! temporary directory is handed to that user. As anyone else it runs as that user, and the
//! administrative account (unix-socket authentication, used over the server's socket to create
//! `kine`) is named after that user instead of `root`.

use crate::TempDir;
use crate::nats::free_port;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const USER: &str = "kine";
pub const PASSWORD: &str = "kine-test-password";

const MISSING: &str = "install Debian's mariadb-server and mariadb-client packages (scripts/install-test-deps) \
                       or set MARIADB_BIN to the directory of the MariaDB binaries";

/// The path of MariaDB binary `name` (`mariadbd`, `mariadb`, `mariadb-admin`,
/// `mariadb-install-db`): in `MARIADB_BIN` if set, else on `PATH`, in `/usr/sbin` or `/usr/bin`.
pub fn binary(name: &str) -> PathBuf {
    let dirs: Vec<PathBuf> = match std::env::var_os("MARIADB_BIN") {
        Some(dir) => vec![PathBuf::from(dir)],
        None => std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
            .collect(),
    };
    dirs.iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("MariaDB's {name} not found in {dirs:?}: {MISSING}"))
}

/// The administrative account (`root` as root, else this process's user name from /etc/passwd),
/// and the `mysql` user's (uid, gid) when this process is root.
fn users() -> (String, Option<(u32, u32)>) {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to this process's effective user.
    let uid = std::fs::metadata("/proc/self").map(|m| m.uid()).expect("stat /proc/self");
    let passwd = std::fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    let entries: Vec<Vec<&str>> =
        passwd.lines().map(|l| l.split(':').collect::<Vec<_>>()).filter(|f| f.len() > 3).collect();
    let me = entries.iter().find(|f| f[2] == uid.to_string()).map(|f| f[0].to_string());
    if uid != 0 {
        return (me.unwrap_or_else(|| panic!("uid {uid} has no /etc/passwd entry (the MariaDB admin account)")), None);
    }
    let mysql = entries
        .iter()
        .find(|f| f[0] == "mysql")
        .unwrap_or_else(|| panic!("running as root needs a mysql user: {MISSING}"));
    ("root".to_string(), Some((mysql[2].parse().expect("uid"), mysql[3].parse().expect("gid"))))
}

pub struct MariaDbServer {
    child: Child,
    port: u16,
    /// The unix-socket account used for administration: `root`, or this process's user.
    admin: String,
    /// The `mysql` user's (uid, gid) when running as root.
    mysql: Option<(u32, u32)>,
    dir: TempDir,
    /// Server options added by [`MariaDbServer::require_tls`].
    extra: Vec<String>,
}

impl MariaDbServer {
    /// A fresh server, ready, with the password user [`USER`].
    pub fn start() -> MariaDbServer {
        let (admin, mysql) = users();
        let dir = TempDir::new("mariadb");
        let data = dir.path().join("data");
        std::fs::create_dir(&data).expect("create the MariaDB data directory");
        // The server (as `mysql`) writes its socket, pid file and log next to the data directory;
        // the temporary directory's parents are world-traversable (/tmp).
        for path in [dir.path(), &data] {
            std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o711)).unwrap();
            if let Some((uid, gid)) = mysql {
                std::os::unix::fs::chown(path, Some(uid), Some(gid)).expect("chown the MariaDB directory");
            }
        }
        let tmp = dir.path().join("tmp");
        std::fs::create_dir(&tmp).expect("create the MariaDB tmpdir");
        std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        if let Some((uid, gid)) = mysql {
            std::os::unix::fs::chown(&tmp, Some(uid), Some(gid)).expect("chown the MariaDB tmpdir");
        }
        let mut install = Command::new(binary("mariadb-install-db"));
        // --no-defaults must come first: no my.cnf of this machine applies.
        install.arg("--no-defaults");
        if mysql.is_some() {
            install.arg("--user=mysql");
        } else {
            install.arg(format!("--auth-root-socket-user={admin}"));
        }
        let out = install
            .arg(format!("--datadir={}", data.display()))
            .args(["--skip-test-db", "--auth-root-authentication-method=socket"])
            // No native AIO: io_uring rings need locked memory, which the `mysql` user's processes
            // share (ulimit -l, 8 MiB here); many test servers at once must not compete for it.
            .arg("--innodb-use-native-aio=0")
            // A server deletes every `#sql*` file in its tmpdir when it starts: with the shared
            // /tmp it removed another server's temporary tables mid-installation.
            .arg(format!("--tmpdir={}", tmp.display()))
            .current_dir("/")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run mariadb-install-db: {e}: {MISSING}"));
        assert!(
            out.status.success(),
            "mariadb-install-db failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
        let child = Self::spawn(dir.path(), port, &admin, mysql, &[]);
        let server = MariaDbServer { child, port, admin, mysql, dir, extra: Vec::new() };
        server.root_sql(&format!(
            "CREATE USER '{USER}'@'%' IDENTIFIED BY '{PASSWORD}'; GRANT ALL ON *.* TO '{USER}'@'%'; FLUSH PRIVILEGES;"
        ));
        server
    }

    /// Starts `mariadbd` on the data in `dir` and waits until it answers on its socket.
    fn spawn(dir: &Path, port: u16, admin: &str, mysql: Option<(u32, u32)>, extra: &[String]) -> Child {
        let log_path = dir.join("error.log");
        // Also the server's stderr, for what it says before it opens --log-error itself.
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path).expect("open the MariaDB log");
        let mut cmd = Command::new(binary("mariadbd"));
        cmd.arg("--no-defaults");
        if let Some((uid, gid)) = mysql {
            std::os::unix::fs::chown(&log_path, Some(uid), Some(gid)).expect("chown the MariaDB log");
            cmd.arg("--user=mysql");
        }
        let mut child = cmd
            .arg(format!("--datadir={}", dir.join("data").display()))
            .arg(format!("--socket={}", dir.join("mariadb.sock").display()))
            .arg(format!("--pid-file={}", dir.join("mariadb.pid").display()))
            .arg(format!("--log-error={}", log_path.display()))
            .arg(format!("--tmpdir={}", dir.join("tmp").display()))
            .arg(format!("--port={port}"))
            .args([
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
                "--max-connections=500",
                "--character-set-server=utf8mb4",
                "--collation-server=utf8mb4_general_ci",
                // Durable commits (the default, stated because the crash tests rely on it).
                "--innodb-flush-log-at-trx-commit=1",
                // See `start`: no native AIO, and a tmpdir of its own.
                "--innodb-use-native-aio=0",
                "--max-allowed-packet=64M",
            ])
            .args(extra)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn mariadbd: {e}: {MISSING}"));
        // Ready when it answers on its socket (as the admin account: the socket is where it is
        // allowed in; the TCP port opens at the same moment).
        let admin_bin = binary("mariadb-admin");
        let ready = || {
            Command::new(&admin_bin)
                .args(["--no-defaults", &format!("-u{admin}")])
                .arg(format!("--socket={}", dir.join("mariadb.sock").display()))
                .args(["--connect-timeout=2", "ping"])
                .stdin(Stdio::null())
                .output()
                .is_ok_and(|o| o.status.success())
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ready() {
            let exited = matches!(child.try_wait(), Ok(Some(_)));
            if exited || Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                panic!("mariadbd did not start on port {port} ({MISSING}):\n{log}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        child
    }

    /// Runs `sql` as the administrative account over the server's socket and returns what it
    /// printed (tab-separated rows, no column names); panics if the client fails.
    pub fn root_sql(&self, sql: &str) -> String {
        let out = Command::new(binary("mariadb"))
            .args(["--no-defaults", &format!("-u{}", self.admin)])
            .arg(format!("--socket={}", self.dir.path().join("mariadb.sock").display()))
            .args(["--batch", "--skip-column-names", "-e", sql])
            .stdin(Stdio::null())
            .output()
            .expect("run the mariadb client");
        assert!(out.status.success(), "mariadb -e {sql:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A session of the administrative account on database `db` that stays open (see
    /// `Session`).
    pub fn session(&self, db: &str) -> crate::session::Session {
        let mut command = Command::new(binary("mariadb"));
        command
            .args(["--no-defaults", &format!("-u{}", self.admin)])
            .arg(format!("--socket={}", self.dir.path().join("mariadb.sock").display()))
            .args(["--batch", "--skip-column-names", "--unbuffered", "--database", db]);
        crate::session::Session::spawn(command)
    }

    /// The uid and gid the server runs as when it is not this process's user (as root: the
    /// `mysql` user), for files it must own.
    pub fn os_user(&self) -> Option<(u32, u32)> {
        self.mysql
    }

    /// The server's data directory (a database is a directory in it).
    pub fn data_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("data")
    }

    /// Stops the server cleanly (SIGTERM: MariaDB's normal shutdown, waited for up to a minute,
    /// then SIGKILL). Its data stays for [`MariaDbServer::restart`].
    pub fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
            let deadline = Instant::now() + Duration::from_secs(60);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.kill();
    }

    /// Kills the server at once (SIGKILL, as in a crash: InnoDB recovers at the next start).
    /// Its data stays for [`MariaDbServer::restart`].
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server again on the same port and data (stopping it first if it still runs)
    /// and waits until it is ready.
    pub fn restart(&mut self) {
        self.stop();
        self.child = Self::spawn(self.dir.path(), self.port, &self.admin, self.mysql, &self.extra);
    }

    /// From now on only TLS connections, and [`USER`] must present a client certificate: the
    /// files of [`crate::certs::make_certs`] in `certs` (restarts the server).
    pub fn require_tls(&mut self, certs: &Path) {
        let tls = self.dir.path().join("tls");
        std::fs::create_dir(&tls).expect("create the TLS directory");
        for name in ["ca.crt", "server.crt", "server.key"] {
            let dest = tls.join(name);
            std::fs::copy(certs.join(name), &dest).expect("copy a certificate file");
            if let Some((uid, gid)) = self.mysql {
                std::os::unix::fs::chown(&dest, Some(uid), Some(gid)).expect("chown a certificate file");
            }
        }
        if let Some((uid, gid)) = self.mysql {
            std::os::unix::fs::chown(&tls, Some(uid), Some(gid)).expect("chown the TLS directory");
        }
        let file = |name: &str| tls.join(name).display().to_string();
        self.extra = vec![
            format!("--ssl-ca={}", file("ca.crt")),
            format!("--ssl-cert={}", file("server.crt")),
            format!("--ssl-key={}", file("server.key")),
            "--require-secure-transport=ON".to_string(),
        ];
        self.restart();
        self.root_sql(&format!("ALTER USER '{USER}'@'%' REQUIRE X509; FLUSH PRIVILEGES;"));
    }

    /// The kine URL of database `db` (created by kine-rs when missing).
    pub fn url(&self, db: &str) -> String {
        format!("mysql://{USER}:{PASSWORD}@tcp(127.0.0.1:{})/{db}", self.port)
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's error log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }
}

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        self.kill();
    }
}

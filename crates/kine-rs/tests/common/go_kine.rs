//! The real Go kine (v0.17.5, built with its embedded NATS server as k3s builds it) for tests of
//! the datastores it leaves behind. The binary comes from `GO_KINE_BIN` or `~/go/bin/kine`
//! (`scripts/install-test-deps` installs it); a missing binary is a test failure, never a skip.

#![allow(dead_code)]

use kine_testkit::nats::free_port;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const INSTALL: &str = "go install -tags nats github.com/k3s-io/kine@v0.17.5";

pub fn go_kine_bin() -> PathBuf {
    if let Ok(p) = std::env::var("GO_KINE_BIN") {
        return PathBuf::from(p);
    }
    let path = PathBuf::from(std::env::var("HOME").unwrap_or_default()).join("go/bin/kine");
    assert!(path.is_file(), "Go kine not found at {}: run `{INSTALL}` (or set GO_KINE_BIN)", path.display());
    path
}

/// A Go kine process serving `endpoint` on a free loopback port; killed on drop.
pub struct GoKine {
    child: Child,
    pub url: String,
    log: PathBuf,
}

impl GoKine {
    /// Starts Go kine (in `dir`, where its log goes too) and waits until it answers a read.
    pub async fn start(endpoint: &str, dir: &Path) -> GoKine {
        Self::start_with(endpoint, dir, &[]).await
    }

    /// [`GoKine::start`] with more of Go kine's flags.
    pub async fn start_with(endpoint: &str, dir: &Path, flags: &[&str]) -> GoKine {
        let port = free_port();
        let log = dir.join(format!("go-kine-{port}.log"));
        let child = Command::new(go_kine_bin())
            .args(["--endpoint", endpoint, "--listen-address", &format!("127.0.0.1:{port}")])
            .args(["--metrics-bind-address", "0"])
            .args(flags)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("Go kine's log"))
            .spawn()
            .expect("spawn Go kine");
        let mut kine = GoKine { child, url: format!("http://127.0.0.1:{port}"), log };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(mut c) = etcd_client::Client::connect([kine.url.as_str()], None).await
                && c.get("/registry/health", None).await.is_ok()
            {
                return kine;
            }
            if Instant::now() > deadline || matches!(kine.child.try_wait(), Ok(Some(_))) {
                panic!("Go kine on {endpoint} did not answer within 60 s; its log:\n{}", kine.log());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn client(&self) -> etcd_client::Client {
        etcd_client::Client::connect([self.url.as_str()], None).await.expect("connect to Go kine")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops Go kine as an operator would (SIGTERM) and waits for it to exit.
    pub async fn stop(mut self) {
        let _ = Command::new("kill").args(["-s", "TERM", &self.child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !matches!(self.child.try_wait(), Ok(Some(_))) {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for GoKine {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

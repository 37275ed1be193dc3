//! Network partitions with Linux network namespaces.
//!
//! A `Lab` gives every node a namespace of its own with two links to the host:
//! - a *data* link on a bridge shared by all nodes (10.77.N.i/24; the host is 10.77.N.254):
//!   the links between datastore servers (NATS routes) and from a node to a datastore the host
//!   serves (a proxy on 10.77.N.254 in front of PostgreSQL or MariaDB);
//! - a *client* link, point to point (the node is 10.78.N.4i+2, the host 10.78.N.4i+1), that the
//!   test's clients use, and that no partition cuts: a partitioned node keeps serving its
//!   clients, which is the interesting case.
//!
//! `cut(i)` takes node i's data link down (no packet passes, no connection is reset: a cable
//! pulled, not a process killed); `heal(i)` brings it back. Everything is removed on drop,
//! namespaces whose creator died are removed at the next start.

use anyhow::{Context, Result, bail};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

const NS_PREFIX: &str = "kine-chaos-";

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output().context("run `ip` (iproute2)")?;
    if !out.status.success() {
        bail!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Removes namespaces left by test processes that died without cleaning up.
fn remove_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else { return };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix(NS_PREFIX) else { continue };
        let pid: u32 = rest.split('-').next().and_then(|p| p.parse().ok()).unwrap_or(0);
        if pid != 0 && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

pub struct Lab {
    /// The subnet number N (10.77.N.0/24, 10.78.N.0/24).
    net: u32,
    bridge: String,
    namespaces: Vec<String>,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

impl Lab {
    /// Creates `nodes` namespaces, the bridge and every link.
    pub fn new(nodes: usize) -> Result<Lab> {
        crate::faults::require_root("a network partition (network namespaces)")?;
        Command::new("ip").arg("-V").output().context("the fault harness needs `ip` (Debian package iproute2)")?;
        remove_stale();
        // A subnet number not in use by another lab of this process or of a dead one.
        let net = loop {
            let n = (std::process::id() + NEXT.fetch_add(1, Ordering::Relaxed)) % 200 + 20;
            if !Command::new("ip").args(["link", "show", &format!("kc{n}br")]).output()?.status.success() {
                break n;
            }
        };
        let mut lab = Lab { net, bridge: format!("kc{net}br"), namespaces: Vec::new() };
        ip(&["link", "add", &lab.bridge, "type", "bridge"])?;
        ip(&["addr", "add", &format!("10.77.{net}.254/24"), "dev", &lab.bridge])?;
        ip(&["link", "set", &lab.bridge, "up"])?;
        for i in 0..nodes {
            lab.add_node(i)?;
        }
        Ok(lab)
    }

    fn add_node(&mut self, i: usize) -> Result<()> {
        let net = self.net;
        let ns = format!("{NS_PREFIX}{}-{net}-{i}", std::process::id());
        ip(&["netns", "add", &ns])?;
        self.namespaces.push(ns.clone());
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        let data = format!("kc{net}d{i}");
        ip(&["link", "add", &data, "type", "veth", "peer", "name", "data", "netns", &ns])?;
        ip(&["link", "set", &data, "master", &self.bridge, "up"])?;
        ip(&["-n", &ns, "addr", "add", &format!("{}/24", self.data_ip(i)), "dev", "data"])?;
        ip(&["-n", &ns, "link", "set", "data", "up"])?;
        let client = format!("kc{net}c{i}");
        ip(&["link", "add", &client, "type", "veth", "peer", "name", "client", "netns", &ns])?;
        ip(&["addr", "add", &format!("10.78.{net}.{}/30", 4 * i + 1), "dev", &client])?;
        ip(&["link", "set", &client, "up"])?;
        ip(&["-n", &ns, "addr", "add", &format!("{}/30", self.client_ip(i)), "dev", "client"])?;
        ip(&["-n", &ns, "link", "set", "client", "up"])?;
        Ok(())
    }

    /// Node i's address on the data bridge (its datastore server listens there).
    pub fn data_ip(&self, i: usize) -> String {
        format!("10.77.{}.{}", self.net, i + 1)
    }

    /// The host's address on the data bridge (a proxy to a datastore on the host listens here).
    pub fn host_data_ip(&self) -> String {
        format!("10.77.{}.254", self.net)
    }

    /// Node i's address on its client link (its kine-rs listens there).
    pub fn client_ip(&self, i: usize) -> String {
        format!("10.78.{}.{}", self.net, 4 * i + 2)
    }

    /// A command that runs `program` inside node i's namespace.
    pub fn command(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.namespaces[i]]).arg(program);
        cmd
    }

    /// Cuts node i's data link.
    pub fn cut(&self, i: usize) -> Result<()> {
        ip(&["link", "set", &format!("kc{}d{i}", self.net), "down"])
    }

    /// Restores node i's data link.
    pub fn heal(&self, i: usize) -> Result<()> {
        ip(&["link", "set", &format!("kc{}d{i}", self.net), "up"])
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            let _ = ip(&["netns", "del", ns]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}

/// A partition of one node's data link as a scheduled fault.
pub struct Partition {
    pub lab: std::sync::Arc<Lab>,
    pub node: usize,
    pub what: String,
}

impl crate::faults::Fault for Partition {
    fn name(&self) -> String {
        format!("partition: {}", self.what)
    }
    fn inject(&mut self) -> Result<()> {
        self.lab.cut(self.node)
    }
    fn heal(&mut self) -> Result<()> {
        self.lab.heal(self.node)
    }
}

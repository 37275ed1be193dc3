//! How a node works with its store in object storage (`--s3-*` flags): how often it ships and
//! writes checkpoints, the writer lock's lease and how the node is named in it, and how long a
//! linearizable read waits for an upload under `--s3-sync`. Read by the node that takes the
//! lock (`node.rs`), the runner that ships (`runner.rs`) and a follower (`follow.rs`).

use std::time::Duration;

#[derive(Clone, Debug)]
pub struct Options {
    /// A change is in object storage at most this long after it was committed.
    pub ship_interval: Duration,
    pub checkpoint_interval: Duration,
    /// A checkpoint is also written once this many segments were shipped since the last one.
    pub checkpoint_segments: u64,
    /// The writer lock's lease.
    pub lease: Duration,
    /// Names this node in the writer lock.
    pub node: String,
    pub address: String,
    /// With `--s3-sync`: the longest a linearizable read waits for the upload of a change it saw
    /// (`--request-timeout`); then it fails as etcd's do without a quorum.
    pub read_wait: Duration,
}

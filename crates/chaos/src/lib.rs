//! The kine-rs fault harness.
//!
//! A Kubernetes-shaped workload ([`workload`]) runs against several kine-rs nodes while a
//! [`faults::Fault`] strikes on a schedule: a stalled process ([`faults::Stall`]), a network
//! partition in Linux network namespaces ([`netns`]), a disk that fills up
//! ([`faults::SmallDisk`]). Everything the clients saw is recorded ([`history`]); afterwards
//! [`run`] checks that every acknowledged write is in the history every node's watch delivered,
//! that those histories are one and the same (no gap, duplicate, reordering or fork), that every
//! list and final read matches the history at its revision, and that each key's operations are
//! linearizable ([`linearizability`]).

pub mod faults;
pub mod history;
pub mod linearizability;
pub mod netns;
pub mod run;
pub mod verify;
pub mod watchers;
pub mod workload;

pub use faults::{Fault, SmallDisk, Stall};
pub use netns::{Lab, Partition};
pub use run::{Report, Schedule, run};
pub use workload::{Mix, Workload};

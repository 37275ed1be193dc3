//! The NATS JetStream backend (`nats://`). See `docs/nats.md` for the design.
//! Knows NATS and `kine-core`, nothing of gRPC.

mod backend;
mod batch;
pub mod codec;
pub mod config;
pub mod connect;
pub mod gokine;
pub mod gokine_bucket;
pub mod message;
pub mod values_dir;
mod write_locks;

pub use backend::{LocalHead, LocalServer, NatsBackend, NatsOptions};

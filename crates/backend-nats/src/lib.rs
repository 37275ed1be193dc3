//! The NATS JetStream backend (work in progress: the endpoint syntax and the key codec; the
//! backend itself is not wired into the binary yet — `nats://` endpoints are refused).
//! See `docs/nats.md` for the design.

pub mod codec;
pub mod config;

//! Generated etcd v3 API types (etcd v3.7.2 protos, see `proto/UPSTREAM.md`).
//!
//! The server side is generated; the client side too with feature `client` (tests only).
//! Nothing but `kine-server` (and tests) should depend on this crate.
#![allow(clippy::all, missing_docs, unreachable_pub)]

pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}
pub mod authpb {
    tonic::include_proto!("authpb");
}
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}
pub mod v3lockpb {
    tonic::include_proto!("v3lockpb");
}
pub mod v3electionpb {
    tonic::include_proto!("v3electionpb");
}

/// The descriptors of every message and service above (with their `google.api.http`
/// annotations, which give etcd's gRPC-gateway routes).
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!("../../../proto/etcd.fds");

//! Generated etcd v3 API types (etcd v3.7.2 protos, see `proto/UPSTREAM.md`).
//!
//! Only the server side is generated. Nothing but `kine-server` should depend on this crate.
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

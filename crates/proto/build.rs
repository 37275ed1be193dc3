//! Generates the etcd v3 server (and, with feature `client`, client) code from the committed FileDescriptorSet
//! (`proto/etcd.fds`), so that building kine-rs needs no `protoc`.
use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fds_path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../proto/etcd.fds");
    println!("cargo:rerun-if-changed={fds_path}");
    let bytes = std::fs::read(fds_path)?;
    let fds = prost_types::FileDescriptorSet::decode(bytes.as_slice())?;
    // Clients only for tests that talk to etcd and kine-rs alike (feature `client`).
    let client = std::env::var_os("CARGO_FEATURE_CLIENT").is_some();
    tonic_prost_build::configure().build_client(client).build_server(true).compile_fds(fds)?;
    Ok(())
}

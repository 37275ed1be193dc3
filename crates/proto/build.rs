//! Generates the etcd v3 server code from the committed FileDescriptorSet
//! (`proto/etcd.fds`), so that building kine-rs needs no `protoc`.
use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fds_path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../proto/etcd.fds");
    println!("cargo:rerun-if-changed={fds_path}");
    let bytes = std::fs::read(fds_path)?;
    let fds = prost_types::FileDescriptorSet::decode(bytes.as_slice())?;
    tonic_prost_build::configure().build_client(false).build_server(true).compile_fds(fds)?;
    Ok(())
}

//! How long a compaction holds a NATS replica's table when it rewrites the value file
//! (docs/benchmarks-history.md, "Issue 21, seventh pass"), against the same compaction of a
//! table that keeps its values in memory:
//!
//!     cargo run --release -p kine-core --example value_file_rewrite -- [KEYS] [DIR]
//!
//! KEYS keys (default 1,000,000) of 256 bytes are written three times, so that two thirds of
//! the file is dead, then compacted at the newest revision; DIR (default /var/tmp) holds the
//! file.

use kine_core::memory::MemTable;
use kine_core::request::{PutRequest, RequestOp, TxnRequest};
use kine_core::txn::WriteOp;
use std::time::Instant;

fn put(key: String, value: Vec<u8>) -> WriteOp {
    let put = PutRequest { key: key.into_bytes(), value, ..Default::default() };
    WriteOp::Txn(TxnRequest { compare: vec![], success: vec![RequestOp::Put(put)], failure: vec![] })
}

fn main() {
    let mut args = std::env::args().skip(1);
    let keys: usize = args.next().map_or(1_000_000, |s| s.parse().expect("KEYS: a number"));
    let dir = std::path::PathBuf::from(args.next().unwrap_or_else(|| "/var/tmp".into()));
    for in_file in [true, false] {
        let mut table = if in_file { MemTable::at_with_values_in(1, &dir) } else { MemTable::at(1) };
        let mut revision = 1;
        let start = Instant::now();
        for round in 0..3u8 {
            for i in 0..keys {
                let applied = table.apply(&put(format!("/registry/configmaps/ns/k{i:08}"), vec![b'a' + round; 256]));
                revision = applied.expect("put").events.map_or(revision, |e| e.revision);
            }
        }
        let written = start.elapsed();
        let start = Instant::now();
        table.compact(revision).expect("compact");
        println!(
            "values {}: {keys} keys written 3 times in {:.1} s; compaction at the newest revision: {:.0} ms",
            if in_file { "in a file" } else { "in memory" },
            written.as_secs_f64(),
            start.elapsed().as_secs_f64() * 1000.0
        );
    }
}

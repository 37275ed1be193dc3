//! Random identifiers without a random-number crate: std's per-process random hash keys,
//! mixed with the time and a counter.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A random u64 (not cryptographic).
pub fn random_u64() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    h.write_u128(now.as_nanos());
    h.finish()
}

/// A random non-zero u64 (cluster and member ids).
pub fn random_nonzero() -> u64 {
    loop {
        let v = random_u64();
        if v != 0 {
            return v;
        }
    }
}

/// A random positive i64 (lease ids chosen by the server).
pub fn random_positive_i64() -> i64 {
    loop {
        let v = (random_u64() >> 1) as i64;
        if v > 0 {
            return v;
        }
    }
}

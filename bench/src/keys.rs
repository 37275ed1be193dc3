//! Key spaces and values of the workloads, and the cheap random sequence that picks keys.
//! Everything here is deterministic, so that two systems measured one after the other are
//! given the same keys and the same value sizes.

use clap::ValueEnum;

/// The shape of the preloaded key space and of the values written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Shape {
    /// etcd's benchmark tool: `/bench/k/<i>` keys, values of `--value-bytes`.
    Flat,
    /// Kubernetes objects: pods under `/registry/pods/<namespace>/<name>`, 1000 per
    /// namespace, values of 1–4 KiB.
    K8s,
}

/// Value sizes of the k8s shape: most Kubernetes objects kube-apiserver stores (pods,
/// endpoint slices, events) are protobuf blobs of this order.
pub const K8S_VALUE_BYTES: std::ops::RangeInclusive<usize> = 1024..=4096;

/// Value size of the flat shape unless `--value-bytes` says otherwise (etcd's benchmark's).
pub const FLAT_VALUE_BYTES: usize = 256;

/// Pods per namespace in the k8s shape.
const PODS_PER_NAMESPACE: u64 = 1000;

impl Shape {
    /// The prefix holding the preloaded keys (what `list` and `count` read).
    pub fn prefix(self) -> &'static str {
        match self {
            Shape::Flat => "/bench/k/",
            Shape::K8s => "/registry/pods/",
        }
    }

    /// The end of the prefix's range: the prefix with its last byte incremented.
    pub fn prefix_end(self) -> String {
        let mut end = self.prefix().as_bytes().to_vec();
        *end.last_mut().expect("prefixes are not empty") += 1;
        String::from_utf8(end).expect("prefixes are ASCII")
    }

    /// How many preloaded keys the shape can name with key order = index order (the
    /// zero-padded fields would overflow beyond).
    pub fn max_keys(self) -> u64 {
        match self {
            Shape::Flat => 1_000_000_000,
            Shape::K8s => 10_000 * PODS_PER_NAMESPACE,
        }
    }

    /// Preloaded key `i`. Zero-padded, so that key order is index order (a page of `list`
    /// starting at key `i` holds keys `i, i+1, …`).
    pub fn key(self, i: u64) -> String {
        match self {
            Shape::Flat => format!("/bench/k/{i:09}"),
            Shape::K8s => format!("/registry/pods/ns-{:04}/pod-{i:09}", i / PODS_PER_NAMESPACE),
        }
    }

    /// Key `i` created by client `client` in the run `run`: outside the preloaded prefix (so
    /// that creates never change what `list` and `count` read) and unique across runs, since
    /// a create of an existing key fails.
    pub fn new_key(self, run: u64, client: u64, i: u64) -> String {
        match self {
            Shape::Flat => format!("/bench/c/{run:x}/{client}/{i:09}"),
            Shape::K8s => format!("/registry/events/bench-{run:x}/c{client}-{i:09}"),
        }
    }

    /// The value written to key number `key` the `iteration`-th time. Flat: `value_bytes`
    /// bytes ([`FLAT_VALUE_BYTES`] by default). K8s: pseudo-random bytes (so that a datastore
    /// that compresses, such as PostgreSQL's TOAST, gains no more than on real objects) of
    /// `value_bytes`, by default of a size in [`K8S_VALUE_BYTES`]; both fixed by
    /// `(key, iteration)`.
    pub fn value(self, value_bytes: Option<usize>, key: u64, iteration: u64) -> Vec<u8> {
        let mut v = format!("{key}:{iteration}:").into_bytes();
        match self {
            Shape::Flat => v.resize(value_bytes.unwrap_or(FLAT_VALUE_BYTES).max(v.len()), b'x'),
            Shape::K8s => {
                let mut rng = Rng::new(mix(key, iteration));
                let span = (K8S_VALUE_BYTES.end() - K8S_VALUE_BYTES.start() + 1) as u64;
                let random = K8S_VALUE_BYTES.start() + rng.below(span) as usize;
                // A size too small for the tag keeps the tag, as in the flat shape.
                let size = value_bytes.unwrap_or(random).max(v.len());
                while v.len() < size {
                    v.extend_from_slice(&rng.next().to_le_bytes());
                }
                v.truncate(size);
            }
        }
        v
    }
}

/// Two numbers hashed into one (splitmix64's finaliser), to seed per key and iteration.
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.rotate_left(32) ^ b;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A cheap pseudo-random sequence (xorshift64), seeded by the client number or a key.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_in_index_order_within_the_prefix() {
        for shape in [Shape::Flat, Shape::K8s] {
            let indexes = [0, 1, 9, 10, 999, 1000, 1001, 9_999, 10_000, 123_456, shape.max_keys() - 1];
            let keys: Vec<String> = indexes.iter().map(|&i| shape.key(i)).collect();
            assert!(keys.windows(2).all(|w| w[0] < w[1]), "{shape:?}: {keys:?}");
            for k in &keys {
                assert!(k.starts_with(shape.prefix()) && k.as_str() < shape.prefix_end().as_str(), "{k}");
            }
        }
        assert_eq!(Shape::K8s.key(0), "/registry/pods/ns-0000/pod-000000000");
        assert_eq!(Shape::K8s.key(12_345), "/registry/pods/ns-0012/pod-000012345");
        assert_eq!(Shape::Flat.key(42), "/bench/k/000000042");
        assert_eq!((Shape::Flat.prefix_end(), Shape::K8s.prefix_end()), ("/bench/k0".into(), "/registry/pods0".into()));
    }

    #[test]
    fn created_keys_are_unique_and_outside_the_preloaded_prefix() {
        for shape in [Shape::Flat, Shape::K8s] {
            let keys = [shape.new_key(1, 0, 0), shape.new_key(1, 0, 1), shape.new_key(1, 1, 0), shape.new_key(2, 0, 0)];
            for (i, k) in keys.iter().enumerate() {
                assert!(!k.starts_with(shape.prefix()), "{k}");
                assert!(!keys[..i].contains(k), "{k} twice");
            }
        }
    }

    #[test]
    fn values_are_deterministic_and_sized() {
        assert_eq!(Shape::Flat.value(None, 7, 3).len(), FLAT_VALUE_BYTES);
        assert_eq!(Shape::Flat.value(Some(100), 7, 3).len(), 100);
        assert!(Shape::Flat.value(None, 7, 3).starts_with(b"7:3:"));
        // A size too small for the tag keeps the tag.
        assert_eq!(Shape::Flat.value(Some(0), 7, 3), b"7:3:");
        assert_eq!(Shape::K8s.value(Some(0), 7, 3), b"7:3:");
        // A fixed size for the k8s shape: still pseudo-random bytes, differing per version.
        assert_eq!(Shape::K8s.value(Some(512), 7, 3).len(), 512);
        assert_ne!(Shape::K8s.value(Some(512), 7, 3), Shape::K8s.value(Some(512), 7, 4));
        let (mut smallest, mut largest) = (usize::MAX, 0);
        for key in 0..2000 {
            let v = Shape::K8s.value(None, key, key % 5);
            assert!(K8S_VALUE_BYTES.contains(&v.len()), "size {}", v.len());
            assert_eq!(v, Shape::K8s.value(None, key, key % 5));
            (smallest, largest) = (smallest.min(v.len()), largest.max(v.len()));
        }
        // Spread over the whole range, not one size.
        assert!(smallest < 1100 && largest > 4000, "{smallest}..{largest}");
        assert_ne!(Shape::K8s.value(None, 1, 0), Shape::K8s.value(None, 1, 1));
        assert_ne!(Shape::K8s.value(None, 1, 0), Shape::K8s.value(None, 2, 0));
    }

    #[test]
    fn rng_is_deterministic_and_in_range() {
        let (mut a, mut b) = (Rng::new(5), Rng::new(5));
        for _ in 0..1000 {
            let x = a.below(10);
            assert!(x < 10);
            assert_eq!(x, b.below(10));
        }
        assert_eq!(a.below(0), 0);
    }
}

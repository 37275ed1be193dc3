//! `cargo afl fuzz` target; see crates/fuzz and scripts/fuzz.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        let _ = kine_fuzz::bbolt(data);
    });
}

//! Builds the Go shim around nats-server (`go/`) into a shared library with
//! `go build -buildmode=c-shared`, which `src/ffi.rs` keeps inside the binary and loads on first
//! use. The nats-server version is pinned in `go/go.mod`.

use std::path::PathBuf;
use std::process::Command;

const NO_GO: &str = "the `embedded-nats` feature links the real nats-server, written in Go, into kine-rs, and building it needs the Go toolchain (https://go.dev/dl/; go 1.21 or newer fetches the 1.26 toolchain that nats-server needs by itself). Install Go, or build kine-rs without the embedded server: cargo build --no-default-features";

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let go_dir = manifest.join("go");
    for file in ["shim.go", "memory.go", "bolt.go", "go.mod", "go.sum"] {
        println!("cargo:rerun-if-changed={}", go_dir.join(file).display());
    }
    println!("cargo:rerun-if-env-changed=GO");
    let go = std::env::var("GO").unwrap_or_else(|_| "go".into());
    match Command::new(&go).arg("version").output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!("`{go} version` failed ({}): {}\n{NO_GO}", o.status, String::from_utf8_lossy(&o.stderr).trim()),
        Err(e) => panic!("cannot run `{go}`: {e}\n{NO_GO}"),
    }
    let mut cmd = Command::new(&go);
    cmd.current_dir(&go_dir)
        .args(["build", "-buildmode=c-shared", "-trimpath", "-mod=readonly", "-tags", "netgo,osusergo"])
        .args(["-ldflags=-s -w", "-o"])
        .arg(out.join("libkinenats.so"))
        .arg(".")
        .env("CGO_ENABLED", "1");
    cross(&mut cmd);
    if std::env::var_os("HOME").is_none() && std::env::var_os("GOCACHE").is_none() {
        // Go needs a cache directory; without HOME it has no default.
        cmd.env("GOCACHE", out.join("go-cache")).env("GOPATH", out.join("go-path"));
    }
    let status = cmd.status().unwrap_or_else(|e| panic!("cannot run `{go} build`: {e}\n{NO_GO}"));
    if !status.success() {
        panic!("`{go} build -buildmode=c-shared` of the embedded nats-server failed ({status}); see the output above");
    }
}

/// A cross build (`cargo build --target aarch64-unknown-linux-gnu` on x86_64, say): Go builds
/// the library for the same target, with that target's C compiler (`CC_<target>` or
/// `TARGET_CC` as the `cc` crate reads them, else Debian's `<arch>-linux-gnu-gcc`).
fn cross(cmd: &mut Command) {
    let target = std::env::var("TARGET").unwrap_or_default();
    let host = std::env::var("HOST").unwrap_or_default();
    for var in ["CC_".to_string() + &target.replace('-', "_"), "TARGET_CC".to_string()] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    if target == host {
        return;
    }
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let goarch = match arch.as_str() {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        "riscv64" => "riscv64",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        other => panic!("the embedded nats-server cannot be built for {target}: no Go architecture for {other}"),
    };
    let cc = std::env::var("CC_".to_string() + &target.replace('-', "_"))
        .or_else(|_| std::env::var("TARGET_CC"))
        .unwrap_or_else(|_| format!("{arch}-linux-gnu-gcc"));
    cmd.env("GOOS", std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_else(|_| "linux".into()))
        .env("GOARCH", goarch)
        .env("CC", cc);
}

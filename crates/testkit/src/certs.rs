//! Test certificates made with openssl for each run (X.509 v3, as rustls requires): a CA, a
//! server certificate and a client certificate.

use std::path::Path;
use std::process::Command;

/// A new P-256 key, unencrypted.
const EC: [&str; 5] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").current_dir(dir).args(args).output().expect("run openssl (is it installed?)");
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Writes `ca.crt`/`ca.key`, `server.crt`/`server.key` (for 127.0.0.1 and localhost) and
/// `client.crt`/`client.key` into `dir`.
pub fn make_certs(dir: &Path) {
    make_ca(dir, "ca");
    sign(dir, "ca", "server", "server", "serverAuth");
    sign(dir, "ca", "client", "client", "clientAuth");
}

/// Signs a certificate `NAME.crt`/`NAME.key` with CN `cn` and extendedKeyUsage `usage` by the
/// CA `CA.crt`/`CA.key` in `dir` (made by `make_ca` or `make_certs`), for 127.0.0.1 and
/// localhost.
pub fn sign(dir: &Path, ca: &str, name: &str, cn: &str, usage: &str) {
    std::fs::write(
        dir.join(format!("{name}.ext")),
        format!("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage={usage}\n"),
    )
    .unwrap();
    let (key, csr, crt, ext) =
        (format!("{name}.key"), format!("{name}.csr"), format!("{name}.crt"), format!("{name}.ext"));
    let (ca_crt, ca_key) = (format!("{ca}.crt"), format!("{ca}.key"));
    openssl(dir, &[&["req"], &EC[..], &["-keyout", &key, "-out", &csr, "-subj", &format!("/CN={cn}")]].concat());
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_crt,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            &ext,
        ],
    );
}

/// Writes a self-signed CA `NAME.crt`/`NAME.key` into `dir`.
pub fn make_ca(dir: &Path, name: &str) {
    let (key, crt) = (format!("{name}.key"), format!("{name}.crt"));
    openssl(
        dir,
        &[&["req", "-x509"], &EC[..], &["-keyout", &key, "-out", &crt, "-days", "2", "-subj", &format!("/CN={name}")]]
            .concat(),
    );
}

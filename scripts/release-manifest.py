#!/usr/bin/env python3
"""What a kine-rs binary is made of, for its release archive (run by scripts/release):

    scripts/release-manifest.py TARGET OUT_DIR

writes OUT_DIR/THIRD-PARTY-LICENSES.txt (every Rust crate and Go module linked into kine-rs for
TARGET, with its licence expression and the licence files it ships) and OUT_DIR/sbom.cdx.json (a
CycloneDX 1.5 SBOM of the same components, with package URLs). The Rust crates come from `cargo
metadata` for TARGET with kine-rs's default features: the normal dependencies reachable from
kine-rs, without build scripts' and proc macros' own dependencies (they run at build time and are
not linked). The Go modules come from `go list -deps` of the embedded nats-server shim for the
same GOOS/GOARCH, plus Go's standard library. A component whose package ships no licence file
is listed with the licence it declares; one with neither fails the run.
"""

import datetime
import glob
import json
import os
import subprocess
import sys
import tomllib
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GO_DIR = os.path.join(REPO, "crates/nats-embed/go")
LICENSE_GLOBS = ["LICEN[CS]E*", "licen[cs]e*", "COPYING*", "NOTICE*", "UNLICENSE*", "COPYRIGHT*"]
GOARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def spdx(expression):
    """Cargo's older `MIT/Apache-2.0` form as an SPDX expression."""
    return " OR ".join(part.strip() for part in expression.split("/"))


def licence_files(directory):
    found = []
    for pattern in LICENSE_GLOBS:
        found += [f for f in glob.glob(os.path.join(directory, pattern)) if os.path.isfile(f)]
    return sorted(set(found))


def rust_crates(target):
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked", "--filter-platform", target],
        cwd=REPO, check=True, capture_output=True, text=True).stdout)
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    root = next(p["id"] for p in meta["packages"] if p["name"] == "kine-rs")
    seen, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        for dep in nodes[pid]["deps"]:
            kinds = {k["kind"] for k in dep["dep_kinds"]}
            if None not in kinds:  # dev and build dependencies are not linked
                continue
            pkg = packages[dep["pkg"]]
            if any("proc-macro" in t["kind"] for t in pkg["targets"]):
                continue
            todo.append(dep["pkg"])
    ours = (os.path.join(REPO, "crates") + os.sep, os.path.join(REPO, "bench") + os.sep)
    crates = []
    for pid in seen:
        pkg = packages[pid]
        if pkg["manifest_path"].startswith(ours):
            continue
        directory = os.path.dirname(pkg["manifest_path"])
        crates.append({
            "name": pkg["name"], "version": pkg["version"],
            "license": pkg.get("license") or (f"see {pkg['license_file']}" if pkg.get("license_file") else None),
            "files": licence_files(directory), "purl": f"pkg:cargo/{pkg['name']}@{pkg['version']}",
            "where": pkg.get("repository") or "",
        })
    return sorted(crates, key=lambda c: (c["name"], c["version"]))


def go_modules(target):
    arch = target.split("-")[0]
    env = {**os.environ, "GOOS": "linux", "GOARCH": GOARCH.get(arch, arch), "CGO_ENABLED": "1", "GOFLAGS": "-mod=readonly"}
    out = subprocess.run(["go", "list", "-deps", "-tags", "netgo,osusergo", "-f",
                          "{{with .Module}}{{.Path}}\t{{.Version}}\t{{.Dir}}\t{{.Main}}{{end}}", "."],
                         cwd=GO_DIR, env=env, check=True, capture_output=True, text=True).stdout
    modules = {}
    for line in out.splitlines():
        path, version, directory, main = line.split("\t")
        if main == "true" or not path:
            continue
        modules[path] = {"name": path, "version": version, "license": None, "files": licence_files(directory),
                         "purl": f"pkg:golang/{path}@{version}", "where": f"https://{path}"}
    goroot = subprocess.run(["go", "env", "GOROOT"], check=True, capture_output=True, text=True).stdout.strip()
    goversion = subprocess.run(["go", "env", "GOVERSION"], check=True, capture_output=True, text=True).stdout.strip()
    modules["std"] = {"name": "Go standard library and runtime", "version": goversion, "license": "BSD-3-Clause",
                      "files": licence_files(goroot), "purl": f"pkg:golang/std@{goversion}", "where": "https://go.dev"}
    return sorted(modules.values(), key=lambda m: m["name"])


def main():
    target, out_dir = sys.argv[1], sys.argv[2]
    with open(os.path.join(REPO, "Cargo.toml"), "rb") as f:
        version = tomllib.load(f)["workspace"]["package"]["version"]
    crates, modules = rust_crates(target), go_modules(target)
    missing = [c["name"] for c in crates + modules if not c["files"] and not c["license"]]
    if missing:
        sys.exit(f"release-manifest: neither a licence file nor a declared licence for: {', '.join(missing)}")
    with open(os.path.join(out_dir, "THIRD-PARTY-LICENSES.txt"), "w") as f:
        f.write(f"kine-rs {version} for {target} links in the following {len(crates)} Rust crates and "
                f"{len(modules)} Go modules (the embedded nats-server and its dependencies).\n"
                "Each is listed with its licence as its authors declare it, followed by the licence files it ships.\n")
        for c in crates + modules:
            f.write(f"\n{'=' * 78}\n{c['name']} {c['version']}  ({c['license'] or 'see the files below'})\n"
                    f"{c['where']}\n{'=' * 78}\n")
            if not c["files"]:
                f.write(f"\n(The published package ships no licence file; its licence, as declared in its "
                        f"manifest, is {c['license']}.)\n")
            for path in c["files"]:
                with open(path, errors="replace") as lf:
                    f.write(f"\n--- {os.path.basename(path)}\n\n{lf.read().rstrip()}\n")
    component = lambda c: {
        "type": "library", "name": c["name"], "version": c["version"], "purl": c["purl"],
        **({"licenses": [{"expression": spdx(c["license"])}]} if c["license"] and not c["license"].startswith("see ") else {}),
    }
    sbom = {
        "bomFormat": "CycloneDX", "specVersion": "1.5", "serialNumber": f"urn:uuid:{uuid.uuid4()}", "version": 1,
        "metadata": {
            "timestamp": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "component": {"type": "application", "name": "kine-rs", "version": version,
                          "licenses": [{"expression": "Apache-2.0"}], "properties": [{"name": "target", "value": target}]},
        },
        "components": [component(c) for c in crates + modules],
    }
    with open(os.path.join(out_dir, "sbom.cdx.json"), "w") as f:
        json.dump(sbom, f, indent=1)
    print(f"release-manifest: {len(crates)} Rust crates, {len(modules)} Go modules")


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager and kubectl of Kubernetes $KUBE_VERSION from the
# Go module proxy (k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces its staging
# modules with directories; go.mod here replaces them with the published k8s.io/* v0.37.2) and
# installs them as BINDIR/NAME-$KUBE_VERSION (default BINDIR: $(go env GOPATH)/bin). Flags as
# upstream's release build (hack/lib/golang.sh): static, -trimpath, tags selinux,notest,grpcnotrace,
# stripped, version stamped. Does nothing when all of them are there and report $KUBE_VERSION.
# NAMEs: which to build (default kube-apiserver kube-controller-manager kubectl, what the tests
# need; kube-scheduler too for bench/kwok.sh). An empty BINDIR is the default.
#
#   tools/kubernetes/build.sh [BINDIR [NAME...]]
set -euo pipefail
cd "$(dirname "$0")"

KUBE_VERSION=1.37.2
bindir=${1:-$(go env GOPATH)/bin}
[ $# -gt 0 ] && shift

# Prints the version a binary reports ("v1.37.2"), or nothing.
reported() {
  case "$1" in
  kubectl) "$bindir/kubectl-$KUBE_VERSION" version --client 2>/dev/null | sed -n 's/^Client Version: //p' ;;
  *) "$bindir/$1-$KUBE_VERSION" --version 2>/dev/null | sed -n 's/^Kubernetes //p' ;;
  esac
}

names=("$@")
[ ${#names[@]} -gt 0 ] || names=(kube-apiserver kube-controller-manager kubectl)
for n in "${names[@]}"; do
  [ -f "$n/main.go" ] || { echo "kubernetes: no $n here (one of: $(ls -d kube*/ | tr -d / | xargs))" >&2; exit 2; }
done
missing=()
for n in "${names[@]}"; do
  [ "$(reported "$n")" = "v$KUBE_VERSION" ] || missing+=("$n")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "kubernetes: ${names[*]} v$KUBE_VERSION already in $bindir"
  exit 0
fi

x() { printf -- "-X 'k8s.io/client-go/pkg/version.%s=%s' -X 'k8s.io/component-base/version.%s=%s' " "$1" "$2" "$1" "$2"; }
ldflags="-s -w $(x gitVersion "v$KUBE_VERSION")$(x gitMajor "${KUBE_VERSION%%.*}")"
ldflags+="$(x gitMinor "$(echo "$KUBE_VERSION" | cut -d. -f2)")$(x gitTreeState clean)"

mkdir -p "$bindir"
tmp=$(mktemp -d "$bindir/.kubernetes-build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "kubernetes: building ${missing[*]} v$KUBE_VERSION from the Go module proxy (several minutes)"
start=$SECONDS
# One go build for all of them: their many shared packages are compiled once.
CGO_ENABLED=0 go build -trimpath -buildvcs=false -tags selinux,notest,grpcnotrace \
  -ldflags "$ldflags" -o "$tmp/" "${missing[@]/#/./}"
for n in "${missing[@]}"; do
  mv -f "$tmp/$n" "$bindir/$n-$KUBE_VERSION"
done
echo "kubernetes: built in $((SECONDS - start)) s:"
for n in "${names[@]}"; do
  printf '  %s (%s, %s MB)\n' "$bindir/$n-$KUBE_VERSION" "$(reported "$n")" \
    "$(($(stat -c %s "$bindir/$n-$KUBE_VERSION") / 1048576))"
  [ "$(reported "$n")" = "v$KUBE_VERSION" ] || { echo "kubernetes: $n does not report v$KUBE_VERSION" >&2; exit 1; }
done

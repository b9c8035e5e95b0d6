#!/usr/bin/env bash
# Regenerate tools/kube/go.mod + go.sum for another Kubernetes release:
#   tests/k8s/tools/bump-kube.sh v1.37.1
# k8s.io/kubernetes points its k8s.io/* staging modules at ./staging with
# replace directives, which a dependent module cannot use; this pins each one
# to the matching v0.X.Y release instead. Needs network access to the Go module
# proxy. Test tooling only.
set -euo pipefail
ver=${1:?usage: $0 v1.X.Y}
[[ $ver =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || { echo "error: version must look like v1.37.1" >&2; exit 2; }
staging=v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}
dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/kube" && pwd)
export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=mod
gomod=$(cd /tmp && go mod download -json "k8s.io/kubernetes@$ver" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
[[ -r $gomod ]] || { echo "error: cannot fetch k8s.io/kubernetes@$ver" >&2; exit 1; }
mods=$(grep -E '^\s+k8s\.io/\S+ => \./staging/' "$gomod" | awk '{print $1}')
{
	echo "// Test tooling only (not part of the product): builds kube-apiserver, kubectl"
	echo "// and the node's parts (kubelet, scheduler, controller manager, kube-proxy) for the"
	echo "// GCR test bed. k8s.io/kubernetes replaces its staging modules with local"
	echo "// paths, so every staging module is pinned here to the matching v0 version."
	echo "// Regenerate with tests/k8s/tools/bump-kube.sh."
	echo "module gcr.test/k8s/tools/kube"
	echo
	echo "go 1.26.0"
	echo
	echo "tool ("
	echo "	k8s.io/kubernetes/cmd/kube-apiserver"
	echo "	k8s.io/kubernetes/cmd/kubectl"
	for c in kubelet kube-controller-manager kube-scheduler kube-proxy; do echo "	k8s.io/kubernetes/cmd/$c"; done
	echo ")"
	echo
	echo "require k8s.io/kubernetes $ver"
	echo
	echo "replace ("
	for m in $mods; do echo "	$m => $m $staging"; done
	echo ")"
} >"$dir/go.mod"
rm -f "$dir/go.sum"
(cd "$dir" && go mod tidy)
echo "updated $dir/go.mod for Kubernetes $ver (staging $staging)"

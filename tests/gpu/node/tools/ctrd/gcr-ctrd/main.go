// gcr-ctrd: containerd and ctr in one binary for the GPU node of tests/gpu/node (test tooling,
// not product), each from the package its upstream main() calls, at the release the CI test bed
// pins (tests/k8s/tools/containerd, ../../gen-gomod.sh). Dispatched on the name it is run as (a
// symlink per command) or on its first argument: containerd, ctr.
//
// Not the runc shim: a shim loads every plugin registered in its process, and containerd's own
// (the content store, ...) fail there ("failed to load plugin io.containerd.content.v1.content"),
// so it is built alone from this module (pack.sh; the go.mod's tool line keeps its packages).
package main

import (
	"fmt"
	"os"
	"path/filepath"

	_ "github.com/containerd/containerd/v2/cmd/containerd/builtins"
	"github.com/containerd/containerd/v2/cmd/containerd/command"
	"github.com/containerd/containerd/v2/cmd/ctr/app"
)

func run(name string) int {
	switch name {
	case "containerd":
		if err := command.App().Run(os.Args); err != nil {
			fmt.Fprintf(os.Stderr, "containerd: %s\n", err)
			return 1
		}
	case "ctr":
		if err := app.New().Run(os.Args); err != nil {
			fmt.Fprintf(os.Stderr, "ctr: %s\n", err)
			return 1
		}
	default:
		fmt.Fprintln(os.Stderr, "usage: gcr-ctrd containerd|ctr [ARGS] (or through a symlink of that name)")
		return 2
	}
	return 0
}

func main() {
	name := filepath.Base(os.Args[0])
	switch {
	case name == "containerd" || name == "ctr":
	case len(os.Args) > 1:
		name = os.Args[1]
		os.Args = append([]string{name}, os.Args[2:]...)
	}
	os.Exit(run(name))
}

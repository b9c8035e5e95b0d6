// gcr-ctrd: containerd, its runc shim and ctr in one binary for the GPU node of tests/gpu/node
// (test tooling, not product), each from the package its upstream main() calls, at the release
// the CI test bed pins (tests/k8s/tools/containerd, ../../gen-gomod.sh). Dispatched on the name
// it is run as (a symlink per command) or on its first argument: containerd,
// containerd-shim-runc-v2, ctr.
//
// The runc shim starts its long-lived copy by running os.Executable() (this binary's own path,
// not the symlink) with its own flags, so a first argument "-namespace" is the shim.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/manager"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/task/plugin"
	_ "github.com/containerd/containerd/v2/cmd/containerd/builtins"
	"github.com/containerd/containerd/v2/cmd/containerd/command"
	"github.com/containerd/containerd/v2/cmd/ctr/app"
	"github.com/containerd/containerd/v2/pkg/shim"
)

func run(name string) int {
	switch name {
	case "containerd":
		if err := command.App().Run(os.Args); err != nil {
			fmt.Fprintf(os.Stderr, "containerd: %s\n", err)
			return 1
		}
	case "containerd-shim-runc-v2":
		shim.RunShim(context.Background(), manager.NewShimManager("io.containerd.runc.v2"))
	case "ctr":
		if err := app.New().Run(os.Args); err != nil {
			fmt.Fprintf(os.Stderr, "ctr: %s\n", err)
			return 1
		}
	default:
		fmt.Fprintln(os.Stderr, "usage: gcr-ctrd containerd|containerd-shim-runc-v2|ctr [ARGS] (or through a symlink of that name)")
		return 2
	}
	return 0
}

func main() {
	name := filepath.Base(os.Args[0])
	switch {
	case name == "containerd" || name == "containerd-shim-runc-v2" || name == "ctr":
	case len(os.Args) > 1 && os.Args[1] == "-namespace":
		name = "containerd-shim-runc-v2"
	case len(os.Args) > 1:
		name = os.Args[1]
		os.Args = append([]string{name}, os.Args[2:]...)
	}
	os.Exit(run(name))
}

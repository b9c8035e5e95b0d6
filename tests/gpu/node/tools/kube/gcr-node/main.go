// gcr-node: one binary for the GPU node of tests/gpu/node (test tooling, not product).
//
// The programs the node runs, each from the package its upstream main() calls, at the releases
// the CI test bed pins (go.mod, ../gen-gomod.sh): Kubernetes' kube-apiserver,
// kube-controller-manager, kube-scheduler, kubelet and kubectl (cmd/*/app), etcd (etcdmain) and
// Helm's install/upgrade (helm.go, on pkg/action); plus three small tools of the GPU node's own:
// a test device plugin for nvidia.com/gpu, the network set-up the node needs on a machine
// without `ip`, and its certificates on a machine without openssl. One binary instead of seven:
// they share most of their code (gRPC, protobuf, client-go, ...), so together they are much
// smaller than their sum, and that is what has to travel to the GPU machine (tests/gpu/node/
// pack.sh measures both). containerd is a binary of its own (../ctrd): its CRI is built on an
// older CRI API (k8s.io/cri-api v0.36) than the kubelet's (v0.37), and one build cannot hold both.
//
// Dispatched on the name it is run as (a symlink per command) or on its first argument:
//
//	kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl, etcd, helm
//	gcr-test-nvidia-dp  the test device plugin (deviceplugin.go)
//	gcr-node-net        bridge and addresses (net.go)
//	gcr-node-pki        certificates and keys (pki.go)
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	_ "time/tzdata" // CronJob time zones (kube-controller-manager, kube-apiserver)

	"go.etcd.io/etcd/server/v3/etcdmain"

	_ "k8s.io/client-go/plugin/pkg/client/auth"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

// Each command as its upstream main() runs it, returning the exit status.
var commands = map[string]func() int{
	"kube-apiserver":          func() int { return cli.Run(apiserver.NewAPIServerCommand()) },
	"kube-controller-manager": func() int { return cli.Run(controllermanager.NewControllerManagerCommand()) },
	"kube-scheduler":          func() int { return cli.Run(scheduler.NewSchedulerCommand()) },
	"kubelet":                 func() int { return cli.Run(kubelet.NewKubeletCommand(context.Background())) },
	"kubectl": func() int {
		logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) // nolint:errcheck
		if err := cli.RunNoErrOutput(kubectlcmd.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
		return 0
	},
	"etcd":               func() int { etcdmain.Main(os.Args); return 0 },
	"helm":               helmMain,
	"gcr-test-nvidia-dp": devicePluginMain,
	"gcr-node-net":       netMain,
	"gcr-node-pki":       pkiMain,
}

func usage() {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(os.Stderr, "usage: gcr-node COMMAND [ARGS] (or run it as COMMAND through a symlink)\n"+
		"commands: %s\n", strings.Join(names, ", "))
}

func main() {
	name := filepath.Base(os.Args[0])
	if _, ok := commands[name]; !ok {
		if len(os.Args) < 2 {
			usage()
			os.Exit(2)
		}
		name = os.Args[1]
		if _, ok := commands[name]; !ok {
			usage()
			os.Exit(2)
		}
		// The command sees itself as argv[0], as when run through its symlink.
		os.Args = append([]string{name}, os.Args[2:]...)
	}
	os.Exit(commands[name]())
}

// helm: the Helm commands the GPU node's run uses, on Helm's own library (helm.sh/helm/v3's
// pkg/action, the code `helm install` runs; its cobra front end, package main, cannot be
// imported). Test tooling: a subset of helm's flags, with helm's meaning.
//
//	helm install NAME CHART [flags]     helm upgrade NAME CHART [--reset-values] [flags]
//	helm uninstall NAME [-n NS] [--wait] [--timeout D]
//	helm get values NAME [-n NS] [--all]      helm list [-n NS]
//
// flags: -n/--namespace NS, --create-namespace, --set K=V, --set-string K=V, -f/--values FILE,
// --wait, --timeout DURATION (default 5m0s). KUBECONFIG as for helm.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/cli"
	"helm.sh/helm/v3/pkg/cli/values"
	"helm.sh/helm/v3/pkg/getter"
	"sigs.k8s.io/yaml"
)

type helmArgs struct {
	pos             []string
	namespace       string
	createNamespace bool
	wait            bool
	all             bool
	resetValues     bool
	timeout         time.Duration
	vals            values.Options
}

func helmParse(args []string) (*helmArgs, error) {
	a := &helmArgs{namespace: "default", timeout: 5 * time.Minute}
	for i := 0; i < len(args); i++ {
		arg := args[i]
		name, val, hasVal := strings.Cut(arg, "=")
		next := func() (string, error) {
			if hasVal {
				return val, nil
			}
			if i+1 >= len(args) {
				return "", fmt.Errorf("%s needs a value", name)
			}
			i++
			return args[i], nil
		}
		var err error
		var v string
		switch name {
		case "-n", "--namespace":
			a.namespace, err = next()
		case "--set":
			v, err = next()
			a.vals.Values = append(a.vals.Values, v)
		case "--set-string":
			v, err = next()
			a.vals.StringValues = append(a.vals.StringValues, v)
		case "-f", "--values":
			v, err = next()
			a.vals.ValueFiles = append(a.vals.ValueFiles, v)
		case "--timeout":
			v, err = next()
			if err == nil {
				a.timeout, err = time.ParseDuration(v)
			}
		case "--create-namespace":
			a.createNamespace = true
		case "--wait":
			a.wait = true
		case "--all", "-a":
			a.all = true
		case "--reset-values":
			a.resetValues = true
		default:
			if strings.HasPrefix(arg, "-") {
				return nil, fmt.Errorf("flag %s is not supported by this helm (tests/gpu/node/README.md)", arg)
			}
			a.pos = append(a.pos, arg)
		}
		if err != nil {
			return nil, err
		}
	}
	return a, nil
}

func helmMain() int {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: helm install|upgrade|uninstall|get values|list ... (see helm.go)")
		return 2
	}
	verb, rest := os.Args[1], os.Args[2:]
	if verb == "version" {
		fmt.Println("helm library applet of gcr-node (helm.sh/helm/v3 pkg/action)")
		return 0
	}
	if verb == "get" && len(rest) > 0 && rest[0] == "values" {
		verb, rest = "get-values", rest[1:]
	}
	a, err := helmParse(rest)
	if err != nil {
		fmt.Fprintf(os.Stderr, "Error: %v\n", err)
		return 2
	}
	settings := cli.New()
	settings.SetNamespace(a.namespace)
	cfg := new(action.Configuration)
	logf := func(format string, v ...interface{}) {
		if settings.Debug {
			log.Printf(format, v...)
		}
	}
	if err := cfg.Init(settings.RESTClientGetter(), a.namespace, os.Getenv("HELM_DRIVER"), logf); err != nil {
		fmt.Fprintf(os.Stderr, "Error: %v\n", err)
		return 1
	}
	if err := helmRun(verb, a, settings, cfg); err != nil {
		fmt.Fprintf(os.Stderr, "Error: %v\n", err)
		return 1
	}
	return 0
}

func helmRun(verb string, a *helmArgs, settings *cli.EnvSettings, cfg *action.Configuration) error {
	need := map[string]int{"install": 2, "upgrade": 2, "uninstall": 1, "get-values": 1, "list": 0}
	n, ok := need[verb]
	if !ok {
		return fmt.Errorf("unknown command %q", verb)
	}
	if len(a.pos) != n {
		return fmt.Errorf("%s takes %d argument(s), got %v", verb, n, a.pos)
	}
	ctx := context.Background()
	switch verb {
	case "install", "upgrade":
		ch, err := loader.Load(a.pos[1])
		if err != nil {
			return err
		}
		vals, err := a.vals.MergeValues(getter.All(settings))
		if err != nil {
			return err
		}
		if verb == "install" {
			in := action.NewInstall(cfg)
			in.ReleaseName, in.Namespace, in.CreateNamespace = a.pos[0], a.namespace, a.createNamespace
			in.Wait, in.Timeout = a.wait, a.timeout
			rel, err := in.RunWithContext(ctx, ch, vals)
			if err != nil {
				return err
			}
			fmt.Printf("NAME: %s\nNAMESPACE: %s\nSTATUS: %s\nREVISION: %d\n", rel.Name, rel.Namespace, rel.Info.Status, rel.Version)
			return nil
		}
		up := action.NewUpgrade(cfg)
		up.Namespace, up.Wait, up.Timeout, up.ResetValues = a.namespace, a.wait, a.timeout, a.resetValues
		rel, err := up.RunWithContext(ctx, a.pos[0], ch, vals)
		if err != nil {
			return err
		}
		fmt.Printf("Release %q has been upgraded.\nSTATUS: %s\nREVISION: %d\n", rel.Name, rel.Info.Status, rel.Version)
	case "uninstall":
		un := action.NewUninstall(cfg)
		un.Wait, un.Timeout = a.wait, a.timeout
		if _, err := un.Run(a.pos[0]); err != nil {
			return err
		}
		fmt.Printf("release %q uninstalled\n", a.pos[0])
	case "get-values":
		gv := action.NewGetValues(cfg)
		gv.AllValues = a.all
		v, err := gv.Run(a.pos[0])
		if err != nil {
			return err
		}
		out, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		fmt.Print(string(out))
	case "list":
		l := action.NewList(cfg)
		rels, err := l.Run()
		if err != nil {
			return err
		}
		for _, r := range rels {
			fmt.Printf("%s\t%s\t%d\t%s\t%s\n", r.Name, r.Namespace, r.Version, r.Info.Status, r.Chart.Metadata.Version)
		}
	}
	return nil
}

// gcr-test-nvidia-dp: a test device plugin for nvidia.com/gpu (test tooling, not product, and
// not NVIDIA's k8s-device-plugin, which no package registry here serves). It hands GPUs out
// the way NVIDIA's plugin does with a CDI device-list strategy: the Allocate response names
// CDI devices ("nvidia.com/gpu=<UUID>", from a spec `nvidia-ctk cdi generate` wrote), in the
// CRI's CDI field (strategy cdi-cri, the GPU operator's default since v25.10: containerd
// injects the devices) or as a cdi.k8s.io/ annotation (cdi-annotations: the NVIDIA container
// runtime in CDI mode injects them). No environment, mounts or device nodes of its own: what
// a container gets is what the CDI spec says. --replicas N advertises each GPU N times, as
// NVIDIA's time-slicing does, so that several pods may share one GPU (GCR's overcommit).
//
//	gcr-test-nvidia-dp --cdi-spec FILE --uuid GPU-... [--uuid ...] [--replicas N]
//	                   [--strategy cdi-cri|cdi-annotations] [--resource nvidia.com/gpu]
//	                   [--plugin-dir /var/lib/kubelet/device-plugins]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	dp "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const (
	dpEndpoint    = "gcr-test-nvidia.sock"
	dpCDIKind     = "nvidia.com/gpu"
	dpAnnotPrefix = "cdi.k8s.io/"
	dpReplicaSep  = "::" // NVIDIA's time-slicing device IDs: <uuid>::<replica>
)

type uuidList []string

func (u *uuidList) String() string     { return strings.Join(*u, ",") }
func (u *uuidList) Set(s string) error { *u = append(*u, s); return nil }

type testPlugin struct {
	dp.UnimplementedDevicePluginServer
	resource string
	strategy string
	uuids    []string
	replicas int
	allocs   atomic.Int64
}

func dpLog(format string, a ...any) {
	fmt.Printf("%s gcr-test-nvidia-dp: %s\n", time.Now().UTC().Format("15:04:05.000"), fmt.Sprintf(format, a...))
}

func devicePluginMain() int {
	fs := flag.NewFlagSet("gcr-test-nvidia-dp", flag.ContinueOnError)
	spec := fs.String("cdi-spec", "", "the CDI spec (JSON) naming the GPUs (nvidia-ctk cdi generate --format json)")
	var uuids uuidList
	fs.Var(&uuids, "uuid", "a GPU to advertise (repeatable); must be a device of the spec")
	replicas := fs.Int("replicas", 1, "times each GPU is advertised (time-slicing)")
	strategy := fs.String("strategy", "cdi-cri", "cdi-cri or cdi-annotations")
	resource := fs.String("resource", "nvidia.com/gpu", "resource name")
	dir := fs.String("plugin-dir", dp.DevicePluginPath, "the kubelet's device-plugin directory")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if *spec == "" || len(uuids) == 0 || *replicas < 1 || (*strategy != "cdi-cri" && *strategy != "cdi-annotations") {
		fmt.Fprintln(os.Stderr, "gcr-test-nvidia-dp: --cdi-spec, at least one --uuid, --replicas >= 1 and "+
			"--strategy cdi-cri or cdi-annotations are required")
		return 2
	}
	if err := dpCheckSpec(*spec, uuids); err != nil {
		fmt.Fprintf(os.Stderr, "gcr-test-nvidia-dp: %v\n", err)
		return 1
	}
	p := &testPlugin{resource: *resource, strategy: *strategy, uuids: uuids, replicas: *replicas}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := p.run(ctx, *dir); err != nil {
		fmt.Fprintf(os.Stderr, "gcr-test-nvidia-dp: %v\n", err)
		return 1
	}
	return 0
}

// dpCheckSpec refuses to start unless the spec is of kind nvidia.com/gpu and defines every GPU
// named: a device the kubelet hands out must be one the runtime can inject.
func dpCheckSpec(path string, uuids []string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var s struct {
		Kind    string `json:"kind"`
		Devices []struct {
			Name string `json:"name"`
		} `json:"devices"`
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("%s: not a JSON CDI spec: %v", path, err)
	}
	if s.Kind != dpCDIKind {
		return fmt.Errorf("%s: kind %q, not %q", path, s.Kind, dpCDIKind)
	}
	have := map[string]bool{}
	for _, d := range s.Devices {
		have[d.Name] = true
	}
	for _, u := range uuids {
		if !have[u] {
			return fmt.Errorf("%s defines no device %q", path, u)
		}
	}
	return nil
}

// run serves until ctx ends, and serves again (and registers again) whenever the kubelet
// removes the socket, as it does when it restarts.
func (p *testPlugin) run(ctx context.Context, dir string) error {
	sock := filepath.Join(dir, dpEndpoint)
	for ctx.Err() == nil {
		_ = os.Remove(sock)
		lis, err := net.Listen("unix", sock)
		if err != nil {
			return fmt.Errorf("listen %s: %v", sock, err)
		}
		srv := grpc.NewServer()
		dp.RegisterDevicePluginServer(srv, p)
		go func() { _ = srv.Serve(lis) }()
		if err := p.register(ctx, filepath.Join(dir, "kubelet.sock")); err != nil {
			dpLog("registration failed (retrying in 2 s): %v", err)
			srv.Stop()
			select {
			case <-ctx.Done():
			case <-time.After(2 * time.Second):
			}
			continue
		}
		dpLog("registered %s: %d GPU(s) x %d replica(s), strategy %s", p.resource, len(p.uuids), p.replicas, p.strategy)
		for ctx.Err() == nil {
			if _, err := os.Stat(sock); err != nil {
				dpLog("socket %s gone (kubelet restarted?): serving and registering again", sock)
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
		srv.Stop()
	}
	_ = os.Remove(sock)
	return nil
}

func (p *testPlugin) register(ctx context.Context, kubelet string) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+kubelet, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = dp.NewRegistrationClient(conn).Register(cctx, &dp.RegisterRequest{
		Version:      dp.Version,
		Endpoint:     dpEndpoint,
		ResourceName: p.resource,
		Options:      p.options(), // what the kubelet keeps: it asks GetDevicePluginOptions for nothing
	})
	return err
}

func (p *testPlugin) options() *dp.DevicePluginOptions {
	return &dp.DevicePluginOptions{GetPreferredAllocationAvailable: true}
}

func (p *testPlugin) GetDevicePluginOptions(context.Context, *dp.Empty) (*dp.DevicePluginOptions, error) {
	return p.options(), nil
}

// GetPreferredAllocation spreads a request over distinct GPUs, as NVIDIA's plugin does for
// time-sliced replicas: without it the kubelet may hand a pod asking for two GPUs two replicas
// of one. Each next device is a replica of a GPU the pod has none of yet, the one with the most
// replicas still free; only when every GPU is in the pod does it take a second replica.
func (p *testPlugin) GetPreferredAllocation(_ context.Context, req *dp.PreferredAllocationRequest) (*dp.PreferredAllocationResponse, error) {
	resp := &dp.PreferredAllocationResponse{}
	for _, c := range req.ContainerRequests {
		chosen := append([]string{}, c.MustIncludeDeviceIDs...)
		has := map[string]bool{} // GPUs the pod has a replica of
		for _, id := range chosen {
			u, _, _ := strings.Cut(id, dpReplicaSep)
			has[u] = true
		}
		free := map[string][]string{} // GPU -> its replicas still to give, in order
		for _, id := range c.AvailableDeviceIDs {
			if !slices.Contains(chosen, id) {
				u, _, _ := strings.Cut(id, dpReplicaSep)
				free[u] = append(free[u], id)
			}
		}
		for _, ids := range free {
			slices.Sort(ids)
		}
		for len(chosen) < int(c.AllocationSize) {
			best := ""
			for u, ids := range free {
				b := free[best]
				if len(ids) > 0 && (best == "" || (!has[u] && has[best]) ||
					(has[u] == has[best] && (len(ids) > len(b) || (len(ids) == len(b) && u < best)))) {
					best = u
				}
			}
			if best == "" {
				break // fewer free than asked: the kubelet refuses the pod itself
			}
			chosen, has[best], free[best] = append(chosen, free[best][0]), true, free[best][1:]
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &dp.ContainerPreferredAllocationResponse{DeviceIDs: chosen})
	}
	return resp, nil
}

func (p *testPlugin) devices() []*dp.Device {
	var out []*dp.Device
	for _, u := range p.uuids {
		for r := 0; r < p.replicas; r++ {
			id := u
			if p.replicas > 1 {
				id = fmt.Sprintf("%s%s%d", u, dpReplicaSep, r)
			}
			out = append(out, &dp.Device{ID: id, Health: dp.Healthy})
		}
	}
	return out
}

func (p *testPlugin) ListAndWatch(_ *dp.Empty, s dp.DevicePlugin_ListAndWatchServer) error {
	if err := s.Send(&dp.ListAndWatchResponse{Devices: p.devices()}); err != nil {
		return err
	}
	<-s.Context().Done() // the list never changes: no health checks in a test plugin
	return nil
}

func (p *testPlugin) Allocate(_ context.Context, req *dp.AllocateRequest) (*dp.AllocateResponse, error) {
	resp := &dp.AllocateResponse{}
	known := map[string]bool{}
	for _, d := range p.devices() {
		known[d.ID] = true
	}
	for _, c := range req.ContainerRequests {
		seen := map[string]bool{}
		var names []string
		for _, id := range c.DevicesIds {
			if !known[id] {
				return nil, fmt.Errorf("unknown device %q", id)
			}
			u, _, _ := strings.Cut(id, dpReplicaSep)
			if !seen[u] {
				seen[u] = true
				names = append(names, dpCDIKind+"="+u)
			}
		}
		sort.Strings(names)
		cr := &dp.ContainerAllocateResponse{}
		n := p.allocs.Add(1)
		if p.strategy == "cdi-cri" {
			for _, name := range names {
				cr.CdiDevices = append(cr.CdiDevices, &dp.CDIDevice{Name: name})
			}
		} else {
			// The key form CDI's annotation helpers write: <prefix><plugin>_<device id>.
			key := fmt.Sprintf("%sgcr-test-nvidia-dp_alloc%d", dpAnnotPrefix, n)
			cr.Annotations = map[string]string{key: strings.Join(names, ",")}
		}
		dpLog("allocate #%d: devices %v -> %v (%s)", n, c.DevicesIds, names, p.strategy)
		resp.ContainerResponses = append(resp.ContainerResponses, cr)
	}
	return resp, nil
}

func (p *testPlugin) PreStartContainer(context.Context, *dp.PreStartContainerRequest) (*dp.PreStartContainerResponse, error) {
	return &dp.PreStartContainerResponse{}, nil
}

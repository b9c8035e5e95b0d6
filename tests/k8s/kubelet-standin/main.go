// kubelet-standin: acts like the kubelet towards a device plugin (test tooling only).
// It serves Registration on <dir>/kubelet.sock, accepts the plugin's Register, calls the
// plugin the way the kubelet's device manager does, checks every answer, then restarts
// (kubelet.sock and the plugin's socket deleted, as a starting kubelet does) and expects
// the plugin to register again. Prints PASS/FAIL lines and "N passed, N failed".
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// kubeletSock is the name of the kubelet's socket in the plugin directory.
var kubeletSock = filepath.Base(pluginapi.KubeletSocket)

var (
	dir            = flag.String("dir", "", "device-plugin directory (kubelet.sock is made here)")
	resource       = flag.String("resource", "gpucr.dev/shim", "expected resource name")
	slots          = flag.Int("slots", 4, "expected number of devices")
	shimDir        = flag.String("shim-container-dir", "/opt/gcr/lib", "expected shim dir in the container")
	shimHostDir    = flag.String("shim-host-dir", "", "expected shim dir on the host")
	sockDir        = flag.String("socket-container-dir", "/run/gcr/sock", "expected GCR_SOCKET_DIR")
	socketRoot     = flag.String("socket-root", "", "expected parent of the per-allocation socket dirs")
	agentSock      = flag.String("agent-container-socket", "/run/gcr/agent/agent.sock", "expected GCR_AGENT_SOCKET")
	cdi            = flag.String("cdi-device", "", "expected CDI device name (empty: none)")
	extraEnv       = flag.String("extra-env", "", "expected envs beyond the plugin's own: NAME=VALUE;NAME=VALUE")
	pluginPid      = flag.Int("plugin-pid", 0, "plugin pid: SIGUSR1/SIGUSR2 flip its health (0: skip)")
	dump           = flag.String("dump", "", "write the Allocate responses here as JSON")
	timeout        = flag.Duration("timeout", 10*time.Second, "bound on each wait")
	passed, failed int
)

func check(ok bool, format string, args ...any) bool {
	msg := fmt.Sprintf(format, args...)
	if ok {
		passed++
		fmt.Println("PASS", msg)
	} else {
		failed++
		fmt.Println("FAIL", msg)
	}
	return ok
}

// registration is the kubelet's Registration service: it hands each request to the test.
type registration struct {
	pluginapi.UnimplementedRegistrationServer
	got chan *pluginapi.RegisterRequest
}

func (r *registration) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	r.got <- req
	return &pluginapi.Empty{}, nil
}

// serveKubelet listens on kubelet.sock, as the kubelet's device manager does at start.
func serveKubelet(reg *registration) (*grpc.Server, error) {
	sock := filepath.Join(*dir, kubeletSock)
	os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	s := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(s, reg)
	go s.Serve(l)
	return s, nil
}

func waitRegister(reg *registration, what string) *pluginapi.RegisterRequest {
	start := time.Now()
	select {
	case req := <-reg.got:
		check(true, "%s: Register received after %v", what, time.Since(start).Round(time.Millisecond))
		return req
	case <-time.After(*timeout):
		check(false, "%s: no Register within %v", what, *timeout)
		return nil
	}
}

func checkRegister(req *pluginapi.RegisterRequest) {
	check(req.Version == pluginapi.Version, "Register version %q", req.Version)
	check(req.ResourceName == *resource, "Register resource name %q", req.ResourceName)
	check(req.Endpoint != "" && !strings.Contains(req.Endpoint, "/") && req.Endpoint != kubeletSock,
		"Register endpoint %q is a file name in the plugin dir", req.Endpoint)
	check(req.Options != nil && req.Options.GetPreferredAllocationAvailable,
		"Register options announce GetPreferredAllocation")
}

func dial(endpoint string) (*grpc.ClientConn, pluginapi.DevicePluginClient, error) {
	conn, err := grpc.NewClient("unix://"+filepath.Join(*dir, endpoint),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return conn, pluginapi.NewDevicePluginClient(conn), nil
}

func recvDevices(stream pluginapi.DevicePlugin_ListAndWatchClient) ([]*pluginapi.Device, error) {
	type result struct {
		r   *pluginapi.ListAndWatchResponse
		err error
	}
	ch := make(chan result, 1)
	go func() { r, err := stream.Recv(); ch <- result{r, err} }()
	select {
	case res := <-ch:
		if res.err != nil {
			return nil, res.err
		}
		return res.r.Devices, nil
	case <-time.After(*timeout):
		return nil, fmt.Errorf("no ListAndWatch message within %v", *timeout)
	}
}

func checkDevices(devs []*pluginapi.Device, health string, what string) []string {
	ids := []string{}
	seen := map[string]bool{}
	allHealth := true
	for _, d := range devs {
		if d.Health != health {
			allHealth = false
		}
		if !seen[d.ID] && d.ID != "" {
			seen[d.ID] = true
			ids = append(ids, d.ID)
		}
	}
	check(len(devs) == *slots && len(ids) == *slots, "%s: %d devices with unique ids (want %d)", what, len(devs), *slots)
	check(allHealth, "%s: every device %s", what, health)
	return ids
}

type allocation struct {
	Envs   map[string]string  `json:"envs"`
	Mounts []*pluginapi.Mount `json:"mounts"`
	CDI    []string           `json:"cdi"`
}

func checkAllocation(ctx context.Context, c pluginapi.DevicePluginClient, ids []string, what string) *allocation {
	resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if !check(err == nil && len(resp.ContainerResponses) == 1, "%s: Allocate answers one container (err %v)", what, err) {
		return nil
	}
	r := resp.ContainerResponses[0]
	want := map[string]string{
		"LD_PRELOAD":       *shimDir + "/libgcr.so",
		"GCR_SOCKET_DIR":   *sockDir,
		"GCR_AGENT_SOCKET": *agentSock,
	}
	for _, kv := range strings.Split(*extraEnv, ";") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			want[k] = v
		}
	}
	okEnv := len(r.Envs) == len(want)
	for k, v := range want {
		okEnv = okEnv && r.Envs[k] == v
	}
	check(okEnv, "%s: envs are exactly %v (got %v)", what, want, r.Envs)
	a := &allocation{Envs: r.Envs, Mounts: r.Mounts}
	var shimOK, sockOK bool
	for _, m := range r.Mounts {
		if m.ContainerPath == *shimDir && m.ReadOnly && (*shimHostDir == "" || m.HostPath == *shimHostDir) {
			shimOK = true
		}
		if m.ContainerPath == *sockDir && !m.ReadOnly && (*socketRoot == "" || filepath.Dir(m.HostPath) == filepath.Clean(*socketRoot)) {
			st, err := os.Stat(m.HostPath)
			sockOK = err == nil && st.IsDir()
		}
	}
	check(shimOK, "%s: shim dir mounted read-only at %s", what, *shimDir)
	check(sockOK, "%s: own socket dir (existing, under %s) mounted read-write at %s", what, *socketRoot, *sockDir)
	for _, d := range r.CdiDevices {
		a.CDI = append(a.CDI, d.Name)
	}
	if *cdi == "" {
		check(len(a.CDI) == 0, "%s: no CDI device", what)
	} else {
		check(len(a.CDI) == 1 && a.CDI[0] == *cdi, "%s: CDI device %v", what, a.CDI)
	}
	return a
}

func sockMount(a *allocation) string {
	for _, m := range a.Mounts {
		if m.ContainerPath == *sockDir {
			return m.HostPath
		}
	}
	return ""
}

func run() {
	reg := &registration{got: make(chan *pluginapi.RegisterRequest, 4)}
	srv, err := serveKubelet(reg)
	if !check(err == nil, "serve Registration on %s (err %v)", filepath.Join(*dir, kubeletSock), err) {
		return
	}
	req := waitRegister(reg, "first start")
	if req == nil {
		srv.Stop()
		return
	}
	checkRegister(req)
	conn, c, err := dial(req.Endpoint)
	if !check(err == nil, "dial the plugin (err %v)", err) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4**timeout)
	defer cancel()

	opts, err := c.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	check(err == nil && opts.GetPreferredAllocationAvailable && !opts.PreStartRequired,
		"GetDevicePluginOptions: preferred allocation, no pre-start (err %v)", err)

	lwCtx, lwCancel := context.WithCancel(ctx)
	stream, err := c.ListAndWatch(lwCtx, &pluginapi.Empty{})
	var ids []string
	if check(err == nil, "ListAndWatch opens (err %v)", err) {
		devs, err := recvDevices(stream)
		if check(err == nil, "ListAndWatch first message (err %v)", err) {
			ids = checkDevices(devs, pluginapi.Healthy, "ListAndWatch")
		}
	}
	if len(ids) < 3 {
		check(false, "need at least 3 devices to go on")
		lwCancel()
		conn.Close()
		srv.Stop()
		return
	}

	pref, err := c.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs: ids, MustIncludeDeviceIDs: []string{ids[2]}, AllocationSize: 2}}})
	ok := err == nil && len(pref.ContainerResponses) == 1 && len(pref.ContainerResponses[0].DeviceIDs) == 2 &&
		pref.ContainerResponses[0].DeviceIDs[0] == ids[2]
	check(ok, "GetPreferredAllocation: 2 ids, the required one first (err %v, got %v)", err, pref)
	_, err = c.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs: ids[:1], MustIncludeDeviceIDs: []string{ids[1]}, AllocationSize: 1}}})
	check(status.Code(err) == codes.InvalidArgument, "GetPreferredAllocation: required id not available is refused (%v)", err)

	a := checkAllocation(ctx, c, []string{ids[0]}, "allocation A")
	b := checkAllocation(ctx, c, []string{ids[1]}, "allocation B")
	if a != nil && b != nil {
		check(sockMount(a) != "" && sockMount(a) != sockMount(b), "allocations A and B get different socket dirs (%s, %s)", sockMount(a), sockMount(b))
		if *dump != "" {
			data, _ := json.MarshalIndent(map[string]*allocation{"A": a, "B": b}, "", "  ")
			check(os.WriteFile(*dump, data, 0o644) == nil, "Allocate responses written to %s", *dump)
		}
	}
	multi, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{ids[0]}}, {DevicesIds: []string{ids[1], ids[2]}}}})
	check(err == nil && len(multi.ContainerResponses) == 2, "Allocate: two containers, two answers (err %v)", err)

	bad := map[string]*pluginapi.AllocateRequest{
		"unknown device id":  {ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"nvidia0"}}}},
		"no container":       {},
		"container, no ids":  {ContainerRequests: []*pluginapi.ContainerAllocateRequest{{}}},
		"repeated device id": {ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{ids[0], ids[0]}}}},
		"over-long id":       {ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{strings.Repeat("x", 5000)}}}},
	}
	for what, r := range bad {
		_, err := c.Allocate(ctx, r)
		check(status.Code(err) == codes.InvalidArgument, "Allocate refuses %s (%v)", what, err)
	}

	_, err = c.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: []string{ids[0]}})
	check(err == nil, "PreStartContainer (err %v)", err)

	if *pluginPid > 0 && stream != nil {
		syscall.Kill(*pluginPid, syscall.SIGUSR1)
		devs, err := recvDevices(stream)
		if check(err == nil, "ListAndWatch update after health change (err %v)", err) {
			checkDevices(devs, pluginapi.Unhealthy, "ListAndWatch after SIGUSR1")
		}
		syscall.Kill(*pluginPid, syscall.SIGUSR2)
		devs, err = recvDevices(stream)
		if check(err == nil, "ListAndWatch update after recovery (err %v)", err) {
			checkDevices(devs, pluginapi.Healthy, "ListAndWatch after SIGUSR2")
		}
	}
	lwCancel()
	conn.Close()

	// Kubelet restarts: its server goes and kubelet.sock comes back; a starting kubelet
	// also empties the plugin directory, so the second restart removes the plugin's socket.
	for _, removePlugin := range []bool{false, true} {
		srv = restart(srv, reg, req.Endpoint, removePlugin, ctx)
		if srv == nil {
			return
		}
	}
	srv.Stop()
}

func restart(srv *grpc.Server, reg *registration, endpoint string, removePlugin bool, ctx context.Context) *grpc.Server {
	what := "after kubelet restart (plugin socket kept)"
	if removePlugin {
		what = "after kubelet restart (plugin dir emptied)"
	}
	srv.Stop()
	os.Remove(filepath.Join(*dir, kubeletSock))
	if removePlugin {
		os.Remove(filepath.Join(*dir, endpoint))
	}
	time.Sleep(300 * time.Millisecond)
	srv, err := serveKubelet(reg)
	if !check(err == nil, "%s: kubelet.sock re-created (err %v)", what, err) {
		return nil
	}
	req := waitRegister(reg, what)
	if req == nil {
		return srv
	}
	checkRegister(req)
	conn, c, err := dial(req.Endpoint)
	if !check(err == nil, "%s: dial the plugin again (err %v)", what, err) {
		return srv
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := c.ListAndWatch(sctx, &pluginapi.Empty{})
	if err == nil {
		var devs []*pluginapi.Device
		devs, err = recvDevices(s)
		if err == nil {
			checkDevices(devs, pluginapi.Healthy, "ListAndWatch "+what)
		}
	}
	check(err == nil, "%s: ListAndWatch (err %v)", what, err)
	return srv
}

func main() {
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "kubelet-standin: -dir is required")
		os.Exit(2)
	}
	run()
	fmt.Printf("%d passed, %d failed\n", passed, failed)
	if failed > 0 || passed == 0 {
		os.Exit(1)
	}
}

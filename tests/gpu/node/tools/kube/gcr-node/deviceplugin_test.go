package main

import (
	"context"
	"strings"
	"testing"

	dp "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// The preferred allocation spreads over distinct GPUs first (a TP pod asking for two gets two
// GPUs, not two replicas of one), the least used GPU first, and takes a second replica of a GPU
// only when every GPU is in the pod already.
func TestPreferredAllocation(t *testing.T) {
	p := &testPlugin{uuids: []string{"GPU-a", "GPU-b"}, replicas: 3}
	if !p.options().GetPreferredAllocationAvailable {
		t.Fatal("the registration does not offer GetPreferredAllocation: the kubelet would never ask")
	}
	all := []string{}
	for _, d := range p.devices() {
		all = append(all, d.ID)
	}
	ask := func(avail, must []string, n int32) []string {
		r, err := p.GetPreferredAllocation(context.Background(), &dp.PreferredAllocationRequest{
			ContainerRequests: []*dp.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: avail,
				MustIncludeDeviceIDs: must, AllocationSize: n}}})
		if err != nil {
			t.Fatal(err)
		}
		return r.ContainerResponses[0].DeviceIDs
	}
	gpus := func(ids []string) string {
		var u []string
		for _, id := range ids {
			g, _, _ := strings.Cut(id, dpReplicaSep)
			u = append(u, g)
		}
		return strings.Join(u, ",")
	}
	if got := gpus(ask(all, nil, 2)); got != "GPU-a,GPU-b" && got != "GPU-b,GPU-a" {
		t.Errorf("two of six replicas on two GPUs: got %s", got)
	}
	// GPU-a has one replica left, GPU-b three: one device comes from GPU-b.
	if got := gpus(ask([]string{"GPU-a::2", "GPU-b::0", "GPU-b::1", "GPU-b::2"}, nil, 1)); got != "GPU-b" {
		t.Errorf("one device: the least used GPU, got %s", got)
	}
	if got := ask(all, []string{"GPU-a::1"}, 2); gpus(got) != "GPU-a,GPU-b" || got[0] != "GPU-a::1" {
		t.Errorf("must-include kept, the other GPU added: got %v", got)
	}
	if got := gpus(ask(all, nil, 3)); strings.Count(got, "GPU-a")+strings.Count(got, "GPU-b") != 3 ||
		!strings.Contains(got, "GPU-a") || !strings.Contains(got, "GPU-b") {
		t.Errorf("three devices: both GPUs, one twice: got %s", got)
	}
	if got := ask([]string{"GPU-a::0"}, nil, 2); len(got) != 1 {
		t.Errorf("fewer free than asked: what there is, got %v", got)
	}
}

// gcr-node-net: the GPU node's network set-up through netlink, for a machine with no `ip`
// binary (test tooling). The node's bridge carries the pods and the node's own address, where
// the API server and the kubelet listen; the `kubernetes` Service's ClusterIP is a second
// address of the same bridge, so pods reach the API server at it without kube-proxy (which
// needs iptables or nft, absent there): tests/gpu/node/README.md.
//
//	gcr-node-net up BRIDGE CIDR...   make BRIDGE (refused if it exists), give it each address, up
//	gcr-node-net down BRIDGE         delete BRIDGE (its addresses and routes go with it)
//	gcr-node-net show                links, addresses and routes, for the logs
package main

import (
	"fmt"
	"net"
	"os"

	"github.com/vishvananda/netlink"
)

func netMain() int {
	args := os.Args[1:]
	var err error
	switch {
	case len(args) >= 3 && args[0] == "up":
		err = netUp(args[1], args[2:])
	case len(args) == 2 && args[0] == "down":
		err = netDown(args[1])
	case len(args) == 1 && args[0] == "show":
		err = netShow()
	default:
		fmt.Fprintln(os.Stderr, "usage: gcr-node-net up BRIDGE CIDR... | down BRIDGE | show")
		return 2
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "gcr-node-net: %v\n", err)
		return 1
	}
	return 0
}

func netUp(name string, cidrs []string) error {
	if _, err := netlink.LinkByName(name); err == nil {
		return fmt.Errorf("%s exists already: another node runs here (run.sh down first)", name)
	}
	addrs := make([]*netlink.Addr, 0, len(cidrs))
	for _, c := range cidrs {
		a, err := netlink.ParseAddr(c)
		if err != nil {
			return fmt.Errorf("address %q: %v", c, err)
		}
		addrs = append(addrs, a)
	}
	// A MAC of its own: a bridge without one takes its lowest port's, which changes as pods come
	// and go, and pods keep sending to the old one for seconds (their ARP entry): the kubelet's
	// probes of GCR's pods timed out after every pod start (runs 68-74; the stand-in rehearsal).
	mac := net.HardwareAddr{0x02, 0x67, 0x63, 0x72, 0x00, 0x03}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name, HardwareAddr: mac}}
	if err := netlink.LinkAdd(br); err != nil {
		return fmt.Errorf("creating bridge %s: %v", name, err)
	}
	link, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("bridge %s made but not found: %v", name, err)
	}
	for _, a := range addrs {
		if err := netlink.AddrAdd(link, a); err != nil {
			_ = netlink.LinkDel(link)
			return fmt.Errorf("adding %s to %s: %v (bridge removed)", a.IPNet, name, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		_ = netlink.LinkDel(link)
		return fmt.Errorf("setting %s up: %v (bridge removed)", name, err)
	}
	fmt.Printf("gcr-node-net: %s up with %v\n", name, cidrs)
	return nil
}

func netDown(name string) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		if _, ok := err.(netlink.LinkNotFoundError); ok {
			return nil
		}
		return err
	}
	return netlink.LinkDel(link)
}

func netShow() error {
	links, err := netlink.LinkList()
	if err != nil {
		return err
	}
	for _, l := range links {
		a := l.Attrs()
		master := ""
		if a.MasterIndex != 0 {
			if m, err := netlink.LinkByIndex(a.MasterIndex); err == nil {
				master = " master " + m.Attrs().Name
			}
		}
		fmt.Printf("%d: %s %s %s mtu %d%s\n", a.Index, a.Name, l.Type(), a.OperState, a.MTU, master)
		addrs, _ := netlink.AddrList(l, netlink.FAMILY_ALL)
		for _, ad := range addrs {
			fmt.Printf("    inet %s\n", ad.IPNet)
		}
	}
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return err
	}
	for _, r := range routes {
		dev := ""
		if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
			dev = l.Attrs().Name
		}
		dst := "default"
		if r.Dst != nil {
			dst = r.Dst.String()
		}
		gw := ""
		if r.Gw != nil && !r.Gw.Equal(net.IPv4zero) {
			gw = " via " + r.Gw.String()
		}
		fmt.Printf("route %s%s dev %s\n", dst, gw, dev)
	}
	return nil
}

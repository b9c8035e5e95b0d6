// gcr-node-pki: the node's certificates and keys, the set testbed.sh makes with openssl (which
// the GPU machine may not have): a CA, the API server's serving certificate, client
// certificates for the admin, the controller manager, the scheduler, the node and the API
// server's kubelet client, the kubelet's serving certificate, and the service-account key pair.
// ECDSA P-256, PKCS#8 keys, PEM files named as testbed.sh names them (test tooling).
//
//	gcr-node-pki DIR NODE-NAME NODE-IP [API-SAN...]   API-SAN: an IP or a DNS name
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

const pkiValidity = 7 * 24 * time.Hour

type pkiCert struct {
	name   string
	org    string
	cn     string
	server bool
	ips    []net.IP
	dns    []string
}

func pkiMain() int {
	if len(os.Args) < 4 {
		fmt.Fprintln(os.Stderr, "usage: gcr-node-pki DIR NODE-NAME NODE-IP [API-SAN...]")
		return 2
	}
	dir, node, nodeIP := os.Args[1], os.Args[2], net.ParseIP(os.Args[3])
	if nodeIP == nil {
		fmt.Fprintf(os.Stderr, "gcr-node-pki: %q is not an IP address\n", os.Args[3])
		return 2
	}
	api := pkiCert{name: "apiserver", cn: "kube-apiserver", server: true,
		ips: []net.IP{net.ParseIP("127.0.0.1"), nodeIP}, dns: []string{"localhost"}}
	for _, s := range os.Args[4:] {
		if ip := net.ParseIP(s); ip != nil {
			api.ips = append(api.ips, ip)
		} else {
			api.dns = append(api.dns, s)
		}
	}
	certs := []pkiCert{
		api,
		{name: "admin", org: "system:masters", cn: "admin"},
		{name: "controller-manager", cn: "system:kube-controller-manager"},
		{name: "scheduler", cn: "system:kube-scheduler"},
		{name: "node", org: "system:nodes", cn: "system:node:" + node},
		{name: "apiserver-kubelet-client", org: "system:masters", cn: "kube-apiserver-kubelet-client"},
		{name: "kubelet", cn: node, server: true, ips: []net.IP{nodeIP}, dns: []string{node}},
	}
	if err := pkiMake(dir, certs); err != nil {
		fmt.Fprintf(os.Stderr, "gcr-node-pki: %v\n", err)
		return 1
	}
	return 0
}

func pkiMake(dir string, certs []pkiCert) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	now := time.Now().Add(-time.Hour) // a little slack for clocks read in other processes
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          pkiSerial(),
		Subject:               pkix.Name{CommonName: "gcr-testbed-ca"},
		NotBefore:             now,
		NotAfter:              now.Add(pkiValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	if err := pkiWrite(dir, "ca", caDER, caKey); err != nil {
		return err
	}
	for _, c := range certs {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: pkiSerial(),
			Subject:      pkix.Name{CommonName: c.cn},
			NotBefore:    now,
			NotAfter:     now.Add(pkiValidity),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			IPAddresses:  c.ips,
			DNSNames:     c.dns,
		}
		if c.org != "" {
			tmpl.Subject.Organization = []string{c.org}
		}
		if c.server {
			tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		} else {
			tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return fmt.Errorf("%s: %v", c.name, err)
		}
		if err := pkiWrite(dir, c.name, der, key); err != nil {
			return err
		}
	}
	// The service-account token key pair.
	sa, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	if err := pkiWriteKey(filepath.Join(dir, "sa.key"), sa); err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600)
}

func pkiSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // the system's random source failing is not something to go on from
	}
	return n
}

func pkiWrite(dir, name string, der []byte, key *ecdsa.PrivateKey) error {
	if err := os.WriteFile(filepath.Join(dir, name+".crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return err
	}
	return pkiWriteKey(filepath.Join(dir, name+".key"), key)
}

func pkiWriteKey(path string, key *ecdsa.PrivateKey) error {
	b, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: b}), 0o600)
}

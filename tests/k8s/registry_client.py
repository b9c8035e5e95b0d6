"""The node's checkpoint-image registry as containerd reaches it, for the real-node tiers.

The agent writes containerd's registry host configuration for 127.0.0.1:PORT at its start
(hosts.toml, the CA, the client certificate: docs/install.md, "The image registry") into
CERTS_DIR/127.0.0.1_PORT_; request() speaks to the registry with exactly those files, as
containerd does: TLS, the server's certificate checked for 127.0.0.1 against that CA, the client
certificate shown. Test tooling, not product.
"""
import http.client
import os
import re
import socket
import ssl

CERTS_DIR = "/etc/containerd/certs.d"  # the chart's eviction.restore.certsDir, the test bed's config_path


def hosts_dir(port, root=""):
    """The host directory containerd reads for 127.0.0.1:port (root: a node's mount namespace
    seen from the host, e.g. the second node's private root)."""
    return f"{root}{CERTS_DIR}/127.0.0.1_{port}_"


def hosts_toml(port, root=""):
    with open(os.path.join(hosts_dir(port, root), "hosts.toml")) as f:
        return f.read()


def generation(port, root=""):
    """The directory (absolute) of the files hosts.toml names now."""
    m = re.search(r'^ca = "([^/"]+)/ca\.pem"$', hosts_toml(port, root), re.M)
    if not m:
        raise AssertionError(f"hosts.toml of 127.0.0.1:{port} names no CA")
    return os.path.join(hosts_dir(port, root), m.group(1))


def context(port, root="", client_cert=True, cafile=None):
    """An SSL context as containerd's: the agent's CA only (or cafile), the hostname (127.0.0.1)
    checked, the client certificate when client_cert."""
    gen = generation(port, root)
    ctx = ssl.create_default_context(cafile=cafile or os.path.join(gen, "ca.pem"))
    if client_cert:
        ctx.load_cert_chain(os.path.join(gen, "client.pem"), os.path.join(gen, "client-key.pem"))
    return ctx


def request(port, path, method="GET", accept=None, root="", client_cert=True, timeout=30):
    """(status, headers, body) of one request to the registry over TLS."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context(port, root, client_cert), timeout=timeout)
    try:
        conn.request(method, path, headers={"Accept": accept} if accept else {})
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def plain(port, path, timeout=10):
    """The raw answer to a plain-HTTP GET (what containerd without hosts.toml would send)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        out = b""
        while True:
            b = s.recv(65536)
            if not b:
                return out
            out += b
    except OSError:
        return out
    finally:
        s.close()

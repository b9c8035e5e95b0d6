#!/usr/bin/env python3
# Writes OCI image layers and OCI image-layout archives (test tooling, python3 stdlib only): what
# `ctr images import` reads, with no Docker engine and no registry.
#
#   oci.py layer SRC BLOB [--owner UID:GID] [--mtime EPOCH]
#       SRC, a directory or an uncompressed tar, as a gzip layer BLOB, and BLOB.json
#       ({"digest", "diffID", "size"}). Ownership, modes, symlinks and hard links are kept;
#       device nodes, FIFOs and sockets are left out. --owner forces every entry's owner;
#       --mtime clamps modification times (reproducible layers from a build tree).
#   oci.py image OUT --name NAME --layer BLOB... [--entrypoint JSON] [--cmd JSON]
#       [--env K=V]... [--user U] [--workdir DIR] [--label K=V]... [--mtime EPOCH]
#       An OCI image-layout tar (oci-layout, index.json, blobs/sha256/...) holding one
#       linux/amd64 image; prints its full name (docker.io/ added as Kubernetes would).
#   oci.py derive IN OUT --name NAME [--entrypoint JSON] [--cmd JSON] [--env K=V]... [--user U]
#       The image of archive IN, same layers, under another name with those settings changed
#       (check.sh: a shell entrypoint, a non-root user; ctr 1.6 run has no --entrypoint/--user).
#   oci.py plain IN OUT
#       The same image with its gzip layers stored uncompressed (media type ...layer.v1.tar; the
#       config and its diff_ids unchanged), for a transfer that compresses the whole archive better
#       than gzip did layer by layer (tests/gpu/node/pack.sh). Prints its full name.
#
# The name: containerd 1.6's importer (client/import.go, imageName) stores an index entry under
# its io.containerd.image.name annotation verbatim, else under org.opencontainers.image.ref.name;
# the CRI plugin then finds it under the normalized reference the kubelet asks for. So the entry
# carries the full normalized name in io.containerd.image.name and the tag in ref.name, as
# `ctr images export` writes them.
import argparse
import gzip
import hashlib
import io
import json
import os
import stat
import sys
import tarfile
import time

MT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
MT_LAYER_PLAIN = "application/vnd.oci.image.layer.v1.tar"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class HashWriter:
    """A write-only file that hashes and counts what passes through to `out` (None: discard)."""

    def __init__(self, out):
        self.out, self.sha, self.size = out, hashlib.sha256(), 0

    def write(self, b):
        self.sha.update(b)
        self.size += len(b)
        if self.out is not None:
            self.out.write(b)
        return len(b)

    def flush(self):
        if self.out is not None:
            self.out.flush()


def clean_name(name):
    """A tar member name without a leading ./ or /; '' for the root itself."""
    name = os.path.normpath(name.lstrip("/"))
    return "" if name == "." else name


def fix_member(ti, owner, mtime):
    # (A source tar's PAX records would override the fields set here.)
    if owner is not None:
        ti.uid, ti.gid = owner
        ti.uname = ti.gname = ""
        for k in ("uid", "gid", "uname", "gname"):
            ti.pax_headers.pop(k, None)
    if mtime is not None and ti.mtime > mtime:
        ti.mtime = mtime
        ti.pax_headers.pop("mtime", None)
    return ti


def keep(ti):
    """Regular files, directories, symlinks and hard links; no devices, FIFOs or sockets."""
    return ti.isreg() or ti.isdir() or ti.issym() or ti.islnk()


def layer_from_dir(tar, src, owner, mtime):
    # Sorted walk, so the same tree gives the same bytes; tar.gettarinfo tracks inodes, so a
    # second name of a file becomes a hard link. os.walk does not follow directory symlinks.
    for top, dirs, files in os.walk(src):
        dirs.sort()
        for name in sorted(dirs) + sorted(files):
            path = os.path.join(top, name)
            arc = os.path.relpath(path, src)
            st = os.lstat(path)
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                print(f"oci: {path}: not a file, directory or symlink; left out", file=sys.stderr)
                continue
            ti = fix_member(tar.gettarinfo(path, arc), owner, mtime)
            if ti.isreg():
                with open(path, "rb") as f:
                    tar.addfile(ti, f)
            else:
                tar.addfile(ti)


def layer_from_tar(tar, src, owner, mtime):
    with tarfile.open(src, "r|") as inp:
        for ti in inp:
            if not keep(ti):
                continue
            ti.name = clean_name(ti.name)
            if ti.name == "":
                continue
            if ti.islnk():
                ti.linkname = clean_name(ti.linkname)
            fix_member(ti, owner, mtime)
            tar.addfile(ti, inp.extractfile(ti) if ti.isreg() else None)


def cmd_layer(a):
    owner = tuple(int(x) for x in a.owner.split(":")) if a.owner else None
    with open(a.blob + ".tmp", "wb") as out:
        blob = HashWriter(out)
        # mtime=0 in the gzip header: the blob digest depends on the content only.
        with gzip.GzipFile(fileobj=blob, mode="wb", compresslevel=6, mtime=0) as gz:
            diff = HashWriter(gz)
            with tarfile.open(fileobj=diff, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                if os.path.isdir(a.src):
                    layer_from_dir(tar, a.src, owner, a.mtime)
                else:
                    layer_from_tar(tar, a.src, owner, a.mtime)
    os.replace(a.blob + ".tmp", a.blob)
    meta = {"digest": "sha256:" + blob.sha.hexdigest(), "diffID": "sha256:" + diff.sha.hexdigest(),
            "size": blob.size}
    with open(a.blob + ".json", "w") as f:
        json.dump(meta, f)
        f.write("\n")


def normalize(name):
    """The reference the kubelet's CRI client would use: gcr-test/x:1 -> docker.io/gcr-test/x:1."""
    if "@" in name:
        sys.exit(f"oci: {name}: digests are not supported, give a tag")
    first, _, rest = name.partition("/")
    if not rest:
        name = "docker.io/library/" + name
    elif "." not in first and ":" not in first and first != "localhost":
        name = "docker.io/" + name
    if ":" not in name.rsplit("/", 1)[1]:
        name += ":latest"
    return name


def json_bytes(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def add_bytes(tar, name, data, mtime):
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode, ti.mtime = len(data), 0o644, mtime
    tar.addfile(ti, io.BytesIO(data))


def image_config(conf, a):
    """Applies the --entrypoint, --cmd, --env, --user, --workdir and --label options to conf."""
    if a.entrypoint is not None:
        conf["Entrypoint"] = json.loads(a.entrypoint)
    if a.cmd is not None:
        conf["Cmd"] = json.loads(a.cmd)
    env = conf.get("Env", []) + list(a.env)
    if not any(e.startswith("PATH=") for e in env):
        env.insert(0, "PATH=" + DEFAULT_PATH)
    conf["Env"] = env
    if a.user:
        conf["User"] = a.user
    if a.workdir:
        conf["WorkingDir"] = a.workdir
    if a.label:
        conf.setdefault("Labels", {}).update(kv.split("=", 1) for kv in a.label)
    return conf


def write_archive(out, full, config, layers, when):
    """An image-layout tar at OUT: config (bytes), layers [(descriptor, open_blob)], named FULL."""
    config_desc = {"mediaType": MT_CONFIG, "digest": "sha256:" + hashlib.sha256(config).hexdigest(),
                   "size": len(config)}
    manifest = json_bytes({"schemaVersion": 2, "mediaType": MT_MANIFEST, "config": config_desc,
                           "layers": [d for d, _ in layers]})
    index = json_bytes({
        "schemaVersion": 2, "mediaType": MT_INDEX,
        "manifests": [{
            "mediaType": MT_MANIFEST, "digest": "sha256:" + hashlib.sha256(manifest).hexdigest(),
            "size": len(manifest), "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": full,
                            "org.opencontainers.image.ref.name": full.rsplit(":", 1)[1]},
        }],
    })
    tmp = out + ".tmp"
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        add_bytes(tar, "oci-layout", json_bytes({"imageLayoutVersion": "1.0.0"}), when)
        add_bytes(tar, "index.json", index, when)
        for dirname in ("blobs", "blobs/sha256"):
            ti = tarfile.TarInfo(dirname)
            ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, when
            tar.addfile(ti)
        for data in (config, manifest):
            add_bytes(tar, "blobs/sha256/" + hashlib.sha256(data).hexdigest(), data, when)
        seen = set()
        for desc, open_blob in layers:
            if desc["digest"] in seen:
                continue
            seen.add(desc["digest"])
            ti = tarfile.TarInfo("blobs/sha256/" + desc["digest"].split(":", 1)[1])
            ti.size, ti.mode, ti.mtime = desc["size"], 0o644, when
            with open_blob() as f:
                tar.addfile(ti, f)
    os.replace(tmp, out)


def cmd_image(a):
    full = normalize(a.name)
    when = a.mtime if a.mtime is not None else int(time.time())
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
    layers, diff_ids = [], []
    for blob in a.layer:
        with open(blob + ".json") as f:
            m = json.load(f)
        layers.append(({"mediaType": MT_LAYER, "digest": m["digest"], "size": m["size"]},
                       lambda blob=blob: open(blob, "rb")))
        diff_ids.append(m["diffID"])
    config = json_bytes({
        "created": created, "architecture": "amd64", "os": "linux", "config": image_config({}, a),
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created": created, "created_by": "tests/k8s/images/build.sh: " + os.path.basename(b)}
                    for b in a.layer],
    })
    write_archive(a.out, full, config, layers, when)
    print(full)


def cmd_derive(a):
    """The image in archive IN with the same layers, another name and changed settings."""
    with tarfile.open(a.src) as inp:
        def blob(digest):
            return inp.extractfile("blobs/sha256/" + digest.split(":", 1)[1])

        index = json.load(inp.extractfile("index.json"))
        if len(index["manifests"]) != 1:
            sys.exit(f"oci: {a.src}: expected one image, found {len(index['manifests'])}")
        manifest = json.load(blob(index["manifests"][0]["digest"]))
        config = json.load(blob(manifest["config"]["digest"]))
        image_config(config.setdefault("config", {}), a)
        full = normalize(a.name)
        layers = [(d, lambda d=d: blob(d["digest"])) for d in manifest["layers"]]
        when = int(time.mktime(time.strptime(config["created"][:19], "%Y-%m-%dT%H:%M:%S")))
        write_archive(a.out, full, json_bytes(config), layers, when)
    print(full)


def cmd_plain(a):
    """The image in archive IN with every gzip layer stored uncompressed, under the same name."""
    work = a.out + ".layers"
    os.makedirs(work, exist_ok=True)
    try:
        with tarfile.open(a.src) as inp:
            def blob(digest):
                return inp.extractfile("blobs/sha256/" + digest.split(":", 1)[1])

            index = json.load(inp.extractfile("index.json"))
            if len(index["manifests"]) != 1:
                sys.exit(f"oci: {a.src}: expected one image, found {len(index['manifests'])}")
            entry = index["manifests"][0]
            manifest = json.load(blob(entry["digest"]))
            config = blob(manifest["config"]["digest"]).read()
            diff_ids = json.loads(config)["rootfs"]["diff_ids"]
            layers = []
            for d, diff_id in zip(manifest["layers"], diff_ids):
                if d["mediaType"] != MT_LAYER:
                    sys.exit(f"oci: {a.src}: layer {d['digest']} is {d['mediaType']}, not gzip")
                path = os.path.join(work, diff_id.split(":", 1)[1])
                with gzip.GzipFile(fileobj=blob(d["digest"])) as gz, open(path, "wb") as out:
                    w = HashWriter(out)
                    while True:
                        b = gz.read(1 << 20)
                        if not b:
                            break
                        w.write(b)
                if "sha256:" + w.sha.hexdigest() != diff_id:
                    sys.exit(f"oci: {a.src}: layer {d['digest']} does not unpack to its diff_id {diff_id}")
                layers.append(({"mediaType": MT_LAYER_PLAIN, "digest": diff_id, "size": w.size},
                               lambda path=path: open(path, "rb")))
            full = entry["annotations"]["io.containerd.image.name"]
            when = int(time.mktime(time.strptime(json.loads(config)["created"][:19], "%Y-%m-%dT%H:%M:%S")))
            write_archive(a.out, full, config, layers, when)
    finally:
        for f in os.listdir(work):
            os.unlink(os.path.join(work, f))
        os.rmdir(work)
    print(full)


def main():
    p = argparse.ArgumentParser(description="OCI layers and image-layout archives")
    sub = p.add_subparsers(dest="action", required=True)
    pl = sub.add_parser("layer")
    pl.add_argument("src")
    pl.add_argument("blob")
    pl.add_argument("--owner")
    pl.add_argument("--mtime", type=int)
    pi = sub.add_parser("image")
    pi.add_argument("out")
    pi.add_argument("--name", required=True)
    pi.add_argument("--layer", action="append", default=[], required=True)
    pi.add_argument("--mtime", type=int)
    pd = sub.add_parser("derive")
    pd.add_argument("src")
    pd.add_argument("out")
    pd.add_argument("--name", required=True)
    pp = sub.add_parser("plain")
    pp.add_argument("src")
    pp.add_argument("out")
    for pp in (pi, pd):
        pp.add_argument("--entrypoint")
        pp.add_argument("--cmd")
        pp.add_argument("--env", action="append", default=[])
        pp.add_argument("--user")
        pp.add_argument("--workdir")
        pp.add_argument("--label", action="append", default=[])
    a = p.parse_args()
    {"layer": cmd_layer, "image": cmd_image, "derive": cmd_derive, "plain": cmd_plain}[a.action](a)


if __name__ == "__main__":
    main()

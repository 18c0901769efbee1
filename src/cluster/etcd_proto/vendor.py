#!/usr/bin/env python3
"""Vendors etcd v3's gRPC API protos (etcd 3.4, as Debian's etcd-server) for the
C++ build: gogoproto options and google.api.http annotations, which only the Go
code generator and the HTTP gateway read, are stripped; the wire format is
unchanged. Source: Debian's golang-etcd-server-dev package.

  apt-get download golang-etcd-server-dev && dpkg -x golang-etcd-server-dev_*.deb x
  src/cluster/etcd_proto/vendor.py x/usr/share/gocode/src/go.etcd.io/etcd
"""

import pathlib
import re
import sys

FILES = {
    "etcdserver/etcdserverpb/rpc.proto": "etcdserverpb/rpc.proto",
    "mvcc/mvccpb/kv.proto": "mvccpb/kv.proto",
    "auth/authpb/auth.proto": "authpb/auth.proto",
}


def strip(text: str) -> str:
    # Nested braces (additional_bindings): drop up to the block's closing "};".
    text = re.sub(r'\n\s*option \(google\.api\.http\) = \{.*?\n\s*\};', "", text, flags=re.DOTALL)
    text = re.sub(r'\n(import "gogoproto/gogo\.proto"|import "google/api/annotations\.proto"|option \(gogoproto\.[^\n]*);', "", text)
    text = re.sub(r'\s*\[\(gogoproto\.[^\]]*\]', "", text)
    text = text.replace('import "etcd/mvcc/mvccpb/kv.proto"', 'import "mvccpb/kv.proto"')
    text = text.replace('import "etcd/auth/authpb/auth.proto"', 'import "authpb/auth.proto"')
    return text


def main() -> None:
    src = pathlib.Path(sys.argv[1])
    here = pathlib.Path(__file__).parent
    for s, d in FILES.items():
        out = here / d
        out.parent.mkdir(parents=True, exist_ok=True)
        header = "// Vendored from etcd 3.4.23 (" + s + ") by vendor.py: Go-only options stripped.\n"
        out.write_text(header + strip((src / s).read_text()))


if __name__ == "__main__":
    main()

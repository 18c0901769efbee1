#!/bin/bash
# Regenerates the Python gRPC stubs of api/warren/v1/warren.proto into
# sdk/python/warren/_proto/ (committed). Needs grpcio-tools in the Python that
# runs it (default: .venv/bin/python). The generated grpc module's absolute
# import "from warren.v1 import warren_pb2" would clash with the SDK package
# `warren`, so it is rewritten to a package-relative import.
# After regenerating, keep sdk/python/pyproject.toml's grpcio/protobuf lower
# bounds >= the versions printed at the end.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
out=$root/sdk/python/warren/_proto
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$py" -m grpc_tools.protoc --proto_path="$root/api" \
  --python_out="$tmp" --pyi_out="$tmp" --grpc_python_out="$tmp" \
  "$root/api/warren/v1/warren.proto" "$root/api/warren/v1/fncall.proto" "$root/api/warren/v1/process.proto" "$root/api/warren/v1/image.proto" \
  "$root/api/warren/v1/desktop.proto" "$root/api/warren/v1/project.proto"

mkdir -p "$out"
cp "$tmp/warren/v1/warren_pb2.py" "$tmp/warren/v1/warren_pb2.pyi" "$out/"
sed -e 's/^from warren\.v1 import warren_pb2 as /from . import warren_pb2 as /' \
  "$tmp/warren/v1/warren_pb2_grpc.py" > "$out/warren_pb2_grpc.py"
# fncall.proto (issue 5) imports warren.proto: same rewrite in its modules.
for f in fncall_pb2.py fncall_pb2_grpc.py; do
  sed -e 's/^from warren\.v1 import \(warren_pb2\|fncall_pb2\) as /from . import \1 as /' \
    "$tmp/warren/v1/$f" > "$out/$f"
done
cp "$tmp/warren/v1/fncall_pb2.pyi" "$out/"
# process.proto (issue 3) imports warren.proto: same rewrite.
for f in process_pb2.py process_pb2_grpc.py; do
  sed -e 's/^from warren\.v1 import \(warren_pb2\|process_pb2\) as /from . import \1 as /' \
    "$tmp/warren/v1/$f" > "$out/$f"
done
cp "$tmp/warren/v1/process_pb2.pyi" "$out/"
# image.proto imports warren.proto: same rewrite.
for f in image_pb2.py image_pb2_grpc.py; do
  sed -e 's/^from warren\.v1 import \(warren_pb2\|image_pb2\) as /from . import \1 as /' \
    "$tmp/warren/v1/$f" > "$out/$f"
done
cp "$tmp/warren/v1/image_pb2.pyi" "$out/"
# desktop.proto imports warren.proto: same rewrite.
for f in desktop_pb2.py desktop_pb2_grpc.py; do
  sed -e 's/^from warren\.v1 import \(warren_pb2\|desktop_pb2\) as /from . import \1 as /' \
    "$tmp/warren/v1/$f" > "$out/$f"
done
cp "$tmp/warren/v1/desktop_pb2.pyi" "$out/"
# project.proto imports nothing of warren's: only its grpc module's import.
cp "$tmp/warren/v1/project_pb2.py" "$tmp/warren/v1/project_pb2.pyi" "$out/"
sed -e 's/^from warren\.v1 import project_pb2 as /from . import project_pb2 as /' \
  "$tmp/warren/v1/project_pb2_grpc.py" > "$out/project_pb2_grpc.py"
if grep -q '^from warren\.v1' "$out/warren_pb2_grpc.py" "$out/fncall_pb2.py" "$out/fncall_pb2_grpc.py" \
    "$out/process_pb2.py" "$out/process_pb2_grpc.py" "$out/image_pb2.py" "$out/image_pb2_grpc.py" \
    "$out/desktop_pb2.py" "$out/desktop_pb2_grpc.py" "$out/project_pb2_grpc.py"; then
  echo "$0: import rewrite failed" >&2
  exit 1
fi
[[ -e "$out/__init__.py" ]] || echo '"""Generated gRPC stubs of api/warren/v1/warren.proto (scripts/gen-proto-py.sh)."""' > "$out/__init__.py"
"$py" -c 'import grpc_tools, grpc, google.protobuf as p; from importlib.metadata import version as v; print("generated with grpcio-tools", v("grpcio-tools"), "protobuf", p.__version__)'

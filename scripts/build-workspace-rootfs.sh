#!/bin/bash
# Builds the rootfs dir of a "workspace/<project>@<version>" layer: the source
# distribution of a real open-source Python project (from PyPI, pinned by
# version and sha256) with its own test suite, unpacked at /w/<project> as a
# git repository (one commit, fixed author and date, so `git diff`/`git
# apply` work inside a sandbox). Its test suite is run once here with the
# host's python3 -m pytest (Debian 12's, the same as toolset/python's): a
# failure stops the build, and the byte code it leaves (__pycache__, also
# pytest's rewritten test modules) ships in the layer so that rollouts do not
# compile it again.
#
# Usage: build-workspace-rootfs.sh DEST PROJECT VERSION SHA256
# Idempotent: does nothing if DEST.complete exists; a partial DEST is rebuilt.
set -euo pipefail
if [[ $# -ne 4 ]]; then
  echo "usage: $0 DEST PROJECT VERSION SHA256" >&2
  exit 2
fi
dest=${1%/}
project=$2
version=$3
sha=$4
if [[ -e "$dest.complete" ]]; then
  echo "$dest already complete; nothing to do"
  exit 0
fi
command -v git >/dev/null || { echo "$0: git is missing" >&2; exit 1; }
/usr/bin/python3 -c "import pytest" 2>/dev/null || { echo "$0: python3-pytest is missing on the host" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The sdist's URL from the package index's simple JSON API (PEP 691; no
# build backend runs here). PIP_INDEX_URL overrides the index.
index=${PIP_INDEX_URL:-https://pypi.org/simple}
url=$(curl -sSfL --retry 3 -H "Accept: application/vnd.pypi.simple.v1+json" "${index%/}/$project/" |
  /usr/bin/python3 -c '
import json, sys
want = sys.argv[1]
urls = [f["url"] for f in json.load(sys.stdin)["files"] if f["filename"] == want]
if len(urls) != 1:
    sys.exit(f"{want}: {len(urls)} files of that name on the index")
print(urls[0])' "$project-$version.tar.gz")
mkdir -p "$tmp/dl"
sdist="$tmp/dl/${url##*/}"
curl -sSfL --retry 3 -o "$sdist" "$url"
got=$(sha256sum "$sdist" | cut -d' ' -f1)
if [[ "$got" != "$sha" ]]; then
  echo "$0: sha256 of $(basename "$sdist") is $got, pinned $sha" >&2
  exit 1
fi
rm -rf --one-file-system "$dest" "$dest.tmp"
repo="$dest.tmp/w/$project"
mkdir -p "$repo"
tar -C "$repo" --strip-components=1 --no-same-owner -xf "$sdist"
(
  cd "$repo"
  export GIT_AUTHOR_NAME=warren GIT_AUTHOR_EMAIL=setup@warren.invalid
  export GIT_COMMITTER_NAME=warren GIT_COMMITTER_EMAIL=setup@warren.invalid
  export GIT_AUTHOR_DATE="2000-01-01T00:00:00Z" GIT_COMMITTER_DATE="2000-01-01T00:00:00Z"
  git -c init.defaultBranch=main init -q .
  printf '__pycache__/\n*.pyc\n.pytest_cache/\n' >> .git/info/exclude
  git add -A
  git -c safe.directory='*' commit -q -m "$project $version (sdist, sha256 $sha)"
  echo "$0: running the test suite of $project $version once"
  env -u PYTHONDONTWRITEBYTECODE /usr/bin/python3 -m pytest -q -p no:cacheprovider -x tests >"$tmp/pytest.log" 2>&1 ||
    { tail -30 "$tmp/pytest.log" >&2; echo "$0: the test suite of $project failed" >&2; exit 1; }
  tail -1 "$tmp/pytest.log"
  /usr/bin/python3 -m compileall -q "$project" "${project//-/_}" >/dev/null 2>&1 || true
)
mv "$dest.tmp" "$dest"
touch "$dest.complete"
echo "$dest: $(du -sh "$dest" | cut -f1)"

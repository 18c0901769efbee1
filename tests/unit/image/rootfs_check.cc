// Usage: image_rootfs_check ROOTFS_DIR
// Builds ROOTFS_DIR into a throw-away layer store under /tmp (mkfs.erofs +
// verify against the source tree), prints build time and image size, then
// removes the store.
#include <chrono>
#include <cstdio>

#include "image/fs_util.h"
#include "image/layer_store.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s ROOTFS_DIR\n", argv[0]);
    return 2;
  }
  char tmpl[] = "/tmp/warren-rootfs-check-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  std::string dir = tmpl;
  int rc = 1;
  {
    auto store = warren::image::LayerStore::Open(dir);
    if (!store.ok()) {
      fprintf(stderr, "%s\n", store.status().ToString().c_str());
    } else {
      auto t0 = std::chrono::steady_clock::now();
      auto info = (*store)->BuildFromDir("base/rootfs-check@1", argv[1]);
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!info.ok()) {
        fprintf(stderr, "build failed after %.1f s: %s\n", s, info.status().ToString().c_str());
      } else {
        printf("built+verified %s in %.1f s: %s, %.1f MiB\n", argv[1], s, info->digest.c_str(),
               static_cast<double>(info->size_bytes) / (1 << 20));
        rc = 0;
      }
    }
  }
  auto st = warren::image::RemoveTree(dir);
  if (!st.ok()) fprintf(stderr, "cleanup: %s\n", st.ToString().c_str());
  return rc;
}

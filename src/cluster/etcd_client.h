// A small etcd v3 client over etcd's gRPC API (the vendored etcd_proto/):
// the key-value and lease calls membership needs. Endpoints are tried in
// order; a call that finds its endpoint unreachable moves to the next one.
//
// Thread-safe. Every call is bounded by the options' timeout: etcd being
// unreachable is an UNAVAILABLE (or DEADLINE_EXCEEDED) Status, never a hang.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/status.h"

namespace etcdserverpb {
class TxnRequest;
}  // namespace etcdserverpb

namespace warren::cluster {

struct EtcdOptions {
  // "http://HOST:PORT" or "https://HOST:PORT" (or bare HOST:PORT = http).
  std::vector<std::string> endpoints;
  std::chrono::milliseconds timeout{2000};
  // TLS for https endpoints: PEM files; empty ca = the system's roots,
  // empty cert/key = no client certificate.
  std::string ca_file, cert_file, key_file;
  // etcd auth: when user is set, every call carries a token from
  // Authenticate(user, password).
  std::string user, password;
};

struct EtcdKv {
  std::string key;
  std::string value;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

class EtcdClient {
 public:
  // Parses the endpoints (InvalidArgument naming a bad one) and, with auth,
  // authenticates. Does not otherwise contact etcd.
  static StatusOr<std::unique_ptr<EtcdClient>> New(EtcdOptions options);
  ~EtcdClient();

  // A lease of `ttl_s` seconds; its id.
  StatusOr<int64_t> Grant(int64_t ttl_s);
  // Renews `lease`: the TTL granted, NotFound when the lease has expired.
  StatusOr<int64_t> KeepAlive(int64_t lease);
  // Revokes `lease`, deleting its keys.
  Status Revoke(int64_t lease);
  // Puts key=value attached to `lease` (0 = none).
  Status Put(const std::string& key, const std::string& value, int64_t lease);
  // Every key starting with `prefix`, in key order; `revision` (if given)
  // receives the store's revision the answer is of.
  StatusOr<std::vector<EtcdKv>> RangePrefix(const std::string& prefix, int64_t* revision = nullptr);
  Status Delete(const std::string& key);
  // What a guarded put watches: the one key `key`, or (`prefix`) every key
  // starting with it.
  struct Guard {
    std::string key;
    bool prefix = true;
  };
  // Puts each of `puts` (key=value under its lease; mod_revision unused),
  // in one transaction, only when no key a guard covers changed after
  // `revision` (none written or created since a read at that revision).
  // Whether it did.
  StatusOr<bool> PutIfUnchanged(const std::vector<Guard>& guards, int64_t revision, const std::vector<EtcdKv>& puts);
  // Creates key=value only when the key does not exist and, if
  // `must_exist` is not empty, that key does. Whether it did.
  StatusOr<bool> PutIfAbsent(const std::string& key, const std::string& value, const std::string& must_exist);

 private:
  struct Endpoint;
  explicit EtcdClient(EtcdOptions options);
  void PrepareContext(grpc::ClientContext* ctx) const;
  // Runs `call(endpoint)` on the current endpoint, moving to the next on
  // UNAVAILABLE until each was tried once.
  template <typename Call>
  grpc::Status WithFailover(Call call);
  Status Authenticate();
  StatusOr<bool> Txn(const etcdserverpb::TxnRequest& req, const std::string& what);

  const EtcdOptions options_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  std::atomic<size_t> current_{0};
  std::string token_;  // set once by New, read-only after
};

// grpc::Status as a Status (same code numbering), naming `what`.
Status FromGrpc(const grpc::Status& s, const std::string& what);

}  // namespace warren::cluster

#include "cluster/etcd_client.h"

#include "common/file_util.h"
#include "etcdserverpb/rpc.grpc.pb.h"

namespace warren::cluster {

namespace pb = ::etcdserverpb;

namespace {

// The prefix with its last byte incremented: as a range end, every key
// beginning with the prefix (etcd's "prefix" convention).
std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty() && static_cast<unsigned char>(end.back()) == 0xff) end.pop_back();
  if (end.empty()) return std::string(1, '\0');
  end.back() = static_cast<char>(end.back() + 1);
  return end;
}

}  // namespace

struct EtcdClient::Endpoint {
  std::string url;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Lease::Stub> lease;
  std::unique_ptr<pb::Auth::Stub> auth;
};

Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return Status(static_cast<absl::StatusCode>(s.error_code()), what + ": " + s.error_message());
}

EtcdClient::EtcdClient(EtcdOptions options) : options_(std::move(options)) {}
EtcdClient::~EtcdClient() = default;

StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::New(EtcdOptions options) {
  if (options.endpoints.empty()) return absl::InvalidArgumentError("etcd: no endpoint given");
  std::unique_ptr<EtcdClient> c(new EtcdClient(std::move(options)));
  const EtcdOptions& opts = c->options_;  // `options` is moved from: read the client's own copy
  std::shared_ptr<grpc::ChannelCredentials> tls;
  for (const std::string& url : opts.endpoints) {
    std::string hostport = url;
    bool https = false;
    if (url.rfind("http://", 0) == 0) {
      hostport = url.substr(7);
    } else if (url.rfind("https://", 0) == 0) {
      hostport = url.substr(8);
      https = true;
    } else if (url.find("://") != std::string::npos) {
      return absl::InvalidArgumentError("etcd endpoint \"" + url + "\": scheme must be http or https");
    }
    while (!hostport.empty() && hostport.back() == '/') hostport.pop_back();
    if (hostport.empty() || hostport.find('/') != std::string::npos || hostport.find(':') == std::string::npos) {
      return absl::InvalidArgumentError("etcd endpoint \"" + url + "\" must be [http[s]://]HOST:PORT");
    }
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
    if (https) {
      if (tls == nullptr) {
        grpc::SslCredentialsOptions so;
        if (!opts.ca_file.empty()) {
          ASSIGN_OR_RETURN(so.pem_root_certs, ReadSmallFile(opts.ca_file));
        }
        if (!opts.cert_file.empty()) {
          ASSIGN_OR_RETURN(so.pem_cert_chain, ReadSmallFile(opts.cert_file));
        }
        if (!opts.key_file.empty()) {
          ASSIGN_OR_RETURN(so.pem_private_key, ReadSmallFile(opts.key_file));
        }
        tls = grpc::SslCredentials(so);
      }
      creds = tls;
    }
    auto e = std::make_unique<Endpoint>();
    e->url = url;
    e->channel = grpc::CreateChannel(hostport, creds);
    e->kv = pb::KV::NewStub(e->channel);
    e->lease = pb::Lease::NewStub(e->channel);
    e->auth = pb::Auth::NewStub(e->channel);
    c->endpoints_.push_back(std::move(e));
  }
  if (!opts.user.empty()) RETURN_IF_ERROR(c->Authenticate());
  return c;
}

void EtcdClient::PrepareContext(grpc::ClientContext* ctx) const {
  ctx->set_deadline(std::chrono::system_clock::now() + options_.timeout);
  if (!token_.empty()) ctx->AddMetadata("token", token_);
}

template <typename Call>
grpc::Status EtcdClient::WithFailover(Call call) {
  // No endpoint would otherwise "succeed" with empty answers (Grant → lease 0).
  grpc::Status st(grpc::StatusCode::UNAVAILABLE, "no etcd endpoint configured");
  const size_t start = current_.load();
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    const size_t at = (start + i) % endpoints_.size();
    grpc::ClientContext ctx;
    PrepareContext(&ctx);
    st = call(*endpoints_[at], &ctx);
    if (st.error_code() != grpc::StatusCode::UNAVAILABLE && st.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      current_.store(at);
      return st;
    }
  }
  std::string urls;
  for (const auto& e : endpoints_) urls += (urls.empty() ? "" : ",") + e->url;
  return grpc::Status(st.error_code(), "etcd unreachable at " + urls + ": " + st.error_message());
}

Status EtcdClient::Authenticate() {
  pb::AuthenticateRequest req;
  req.set_name(options_.user);
  req.set_password(options_.password);
  pb::AuthenticateResponse resp;
  grpc::Status st =
      WithFailover([&](Endpoint& e, grpc::ClientContext* ctx) { return e.auth->Authenticate(ctx, req, &resp); });
  RETURN_IF_ERROR(FromGrpc(st, "etcd Authenticate(" + options_.user + ")"));
  token_ = resp.token();
  return absl::OkStatus();
}

StatusOr<int64_t> EtcdClient::Grant(int64_t ttl_s) {
  pb::LeaseGrantRequest req;
  req.set_ttl(ttl_s);
  pb::LeaseGrantResponse resp;
  grpc::Status st =
      WithFailover([&](Endpoint& e, grpc::ClientContext* ctx) { return e.lease->LeaseGrant(ctx, req, &resp); });
  RETURN_IF_ERROR(FromGrpc(st, "etcd LeaseGrant(ttl=" + std::to_string(ttl_s) + ")"));
  if (!resp.error().empty()) return absl::UnavailableError("etcd LeaseGrant: " + resp.error());
  return resp.id();
}

StatusOr<int64_t> EtcdClient::KeepAlive(int64_t lease) {
  pb::LeaseKeepAliveResponse resp;
  bool got = false;
  grpc::Status st = WithFailover([&](Endpoint& e, grpc::ClientContext* ctx) {
    auto stream = e.lease->LeaseKeepAlive(ctx);
    pb::LeaseKeepAliveRequest req;
    req.set_id(lease);
    got = stream->Write(req) && stream->Read(&resp);
    stream->WritesDone();
    if (got) ctx->TryCancel();  // the one answer is all we wait for
    grpc::Status fin = stream->Finish();
    return got ? grpc::Status::OK : fin;
  });
  RETURN_IF_ERROR(FromGrpc(st, "etcd LeaseKeepAlive(" + std::to_string(lease) + ")"));
  if (!got) return absl::UnavailableError("etcd LeaseKeepAlive: no answer");
  if (resp.ttl() <= 0) return absl::NotFoundError("etcd lease " + std::to_string(lease) + " has expired");
  return resp.ttl();
}

Status EtcdClient::Revoke(int64_t lease) {
  pb::LeaseRevokeRequest req;
  req.set_id(lease);
  pb::LeaseRevokeResponse resp;
  grpc::Status st =
      WithFailover([&](Endpoint& e, grpc::ClientContext* ctx) { return e.lease->LeaseRevoke(ctx, req, &resp); });
  return FromGrpc(st, "etcd LeaseRevoke(" + std::to_string(lease) + ")");
}

Status EtcdClient::Put(const std::string& key, const std::string& value, int64_t lease) {
  pb::PutRequest req;
  req.set_key(key);
  req.set_value(value);
  req.set_lease(lease);
  pb::PutResponse resp;
  grpc::Status st = WithFailover([&](Endpoint& e, grpc::ClientContext* ctx) { return e.kv->Put(ctx, req, &resp); });
  return FromGrpc(st, "etcd Put(" + key + ")");
}

StatusOr<std::vector<EtcdKv>> EtcdClient::RangePrefix(const std::string& prefix, int64_t* revision) {
  pb::RangeRequest req;
  req.set_key(prefix);
  req.set_range_end(PrefixEnd(prefix));
  pb::RangeResponse resp;
  grpc::Status st = WithFailover([&](Endpoint& e, grpc::ClientContext* ctx) { return e.kv->Range(ctx, req, &resp); });
  RETURN_IF_ERROR(FromGrpc(st, "etcd Range(" + prefix + "*)"));
  if (revision != nullptr) *revision = resp.header().revision();
  std::vector<EtcdKv> out;
  out.reserve(resp.kvs_size());
  for (const auto& kv : resp.kvs()) out.push_back(EtcdKv{kv.key(), kv.value(), kv.mod_revision(), kv.lease()});
  return out;
}

Status EtcdClient::Delete(const std::string& key) {
  pb::DeleteRangeRequest req;
  req.set_key(key);
  pb::DeleteRangeResponse resp;
  grpc::Status st =
      WithFailover([&](Endpoint& e, grpc::ClientContext* ctx) { return e.kv->DeleteRange(ctx, req, &resp); });
  return FromGrpc(st, "etcd DeleteRange(" + key + ")");
}

StatusOr<bool> EtcdClient::Txn(const etcdserverpb::TxnRequest& req, const std::string& what) {
  pb::TxnResponse resp;
  grpc::Status st = WithFailover([&](Endpoint& e, grpc::ClientContext* ctx) { return e.kv->Txn(ctx, req, &resp); });
  RETURN_IF_ERROR(FromGrpc(st, "etcd Txn(" + what + ")"));
  return resp.succeeded();
}

StatusOr<bool> EtcdClient::PutIfUnchanged(const std::vector<Guard>& guards, int64_t revision,
                                          const std::vector<EtcdKv>& puts) {
  if (puts.empty()) return absl::InvalidArgumentError("etcd: a guarded put of no keys");
  if (guards.empty()) return absl::InvalidArgumentError("etcd: a guarded put with no guard");
  pb::TxnRequest req;
  std::string watched;
  for (const Guard& g : guards) {
    pb::Compare* c = req.add_compare();
    c->set_result(pb::Compare::LESS);
    c->set_target(pb::Compare::MOD);
    c->set_key(g.key);
    if (g.prefix) c->set_range_end(PrefixEnd(g.key));
    c->set_mod_revision(revision + 1);
    watched += (watched.empty() ? "" : ", ") + g.key + (g.prefix ? "*" : "");
  }
  std::string keys;
  for (const EtcdKv& kv : puts) {
    pb::PutRequest* put = req.add_success()->mutable_request_put();
    put->set_key(kv.key);
    put->set_value(kv.value);
    put->set_lease(kv.lease);
    keys += (keys.empty() ? "" : ", ") + kv.key;
  }
  return Txn(req, keys + " if " + watched + " unchanged since " + std::to_string(revision));
}

StatusOr<bool> EtcdClient::PutIfAbsent(const std::string& key, const std::string& value,
                                       const std::string& must_exist) {
  pb::TxnRequest req;
  pb::Compare* absent = req.add_compare();
  absent->set_result(pb::Compare::EQUAL);
  absent->set_target(pb::Compare::CREATE);
  absent->set_key(key);
  absent->set_create_revision(0);
  if (!must_exist.empty()) {
    pb::Compare* present = req.add_compare();
    present->set_result(pb::Compare::GREATER);
    present->set_target(pb::Compare::CREATE);
    present->set_key(must_exist);
    present->set_create_revision(0);
  }
  pb::PutRequest* put = req.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  return Txn(req, key + " if absent");
}

}  // namespace warren::cluster

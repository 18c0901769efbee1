#include "cluster/membership.h"

#include "common/log.h"

namespace warren::cluster {

Membership::Membership(EtcdClient* etcd, MembershipOptions options, Facts facts)
    : etcd_(etcd), options_(std::move(options)), facts_(std::move(facts)) {}

StatusOr<std::unique_ptr<Membership>> Membership::Join(EtcdClient* etcd, MembershipOptions options, Facts facts) {
  if (options.lease_s < 2) return absl::InvalidArgumentError("cluster lease must be at least 2 s");
  if (options.refresh.count() <= 0 || options.refresh >= std::chrono::seconds(options.lease_s)) {
    return absl::InvalidArgumentError("cluster refresh (" + std::to_string(options.refresh.count()) +
                                      " ms) must be positive and shorter than the lease (" +
                                      std::to_string(options.lease_s) + " s)");
  }
  std::unique_ptr<Membership> m(new Membership(etcd, std::move(options), std::move(facts)));
  RETURN_IF_ERROR(m->Register());
  if (Status s = m->ReadView(); !s.ok()) {
    (void)etcd->Revoke(m->lease_);
    return s;
  }
  m->thread_ = std::thread([p = m.get()] { p->Loop(); });
  return m;
}

Membership::~Membership() { Leave(); }

Status Membership::Register() {
  NodeRecord r = facts_();
  self_ = r.id;
  ASSIGN_OR_RETURN(int64_t lease, etcd_->Grant(options_.lease_s));
  if (Status s = etcd_->Put(options_.prefix + r.id, ToJson(r), lease); !s.ok()) {
    (void)etcd_->Revoke(lease);
    return s;
  }
  lease_ = lease;
  return absl::OkStatus();
}

Status Membership::ReadView() {
  ASSIGN_OR_RETURN(std::vector<EtcdKv> kvs, etcd_->RangePrefix(options_.prefix));
  auto view = std::make_shared<std::vector<NodeRecord>>();
  view->reserve(kvs.size());
  for (const EtcdKv& kv : kvs) {
    StatusOr<NodeRecord> r = NodeRecordFromJson(kv.value);
    if (!r.ok()) {
      Log(spdlog::level::warn, "cluster: ignoring a malformed node record",
          {{"key", kv.key}, {"error", r.status().ToString()}});
      continue;
    }
    r->mod_revision = kv.mod_revision;
    view->push_back(*std::move(r));
  }
  std::lock_guard<std::mutex> l(mu_);
  view_ = std::move(view);
  return absl::OkStatus();
}

Status Membership::Refresh() {
  StatusOr<int64_t> ttl = etcd_->KeepAlive(lease_);
  if (ttl.status().code() == absl::StatusCode::kNotFound) {
    // Out of touch for longer than the lease: our record is gone. Come back.
    Log(spdlog::level::warn, "cluster: lease expired; registering again", {{"node", self_}});
    RETURN_IF_ERROR(Register());
  } else if (!ttl.ok()) {
    return ttl.status();
  } else {
    RETURN_IF_ERROR(etcd_->Put(options_.prefix + self_, ToJson(facts_()), lease_));
  }
  return ReadView();
}

void Membership::Loop() {
  bool failing = false;
  std::unique_lock<std::mutex> l(mu_);
  while (true) {
    cv_.wait_for(l, options_.refresh, [this] { return stop_ || poked_; });
    if (stop_) break;
    poked_ = false;
    ++started_;
    l.unlock();
    Status s = Refresh();
    if (s.ok() && options_.after_refresh) options_.after_refresh(lease_.load());
    if (!s.ok() && !failing) {
      Log(spdlog::level::warn, "cluster: refresh failed; retrying", {{"error", s.ToString()}});
    } else if (s.ok() && failing) {
      Log(spdlog::level::info, "cluster: refresh works again");
    }
    failing = !s.ok();
    l.lock();
    last_ = s;
    ++finished_;
    done_cv_.notify_all();
  }
  done_cv_.notify_all();
}

Status Membership::RefreshNow(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu_);
  if (stop_) return absl::UnavailableError("cluster: this node has left");
  // The refresh to wait for is the next one to begin: one already running
  // may have read this node's facts before the caller changed them.
  const uint64_t want = started_ + 1;
  poked_ = true;
  cv_.notify_all();
  if (!done_cv_.wait_for(l, timeout, [&] { return stop_ || finished_ >= want; })) {
    return absl::DeadlineExceededError("cluster: no refresh within " + std::to_string(timeout.count()) + " ms");
  }
  if (finished_ < want) return absl::UnavailableError("cluster: this node has left");
  return last_;
}

void Membership::Leave() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (Status s = etcd_->Revoke(lease_); !s.ok()) {
    Log(spdlog::level::warn, "cluster: could not withdraw; the record goes when its lease expires",
        {{"error", s.ToString()}});
  } else {
    Log(spdlog::level::info, "cluster: left", {{"node", self_}});
  }
}

std::shared_ptr<const std::vector<NodeRecord>> Membership::Nodes() const {
  std::lock_guard<std::mutex> l(mu_);
  return view_;
}

}  // namespace warren::cluster

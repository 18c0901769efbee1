#include "cluster/placement.h"

#include <algorithm>

namespace warren::cluster {
namespace {

// What a create's 0 resources become on the node (node/admission/validate.cc).
constexpr int64_t kDefaultCpuMillis = 1000;
constexpr int64_t kDefaultMemoryMb = 2048;

uint32_t RecentIn(const std::map<std::string, uint32_t>& recent, const NodeRecord& n) {
  auto it = recent.find(n.id);
  return it == recent.end() ? 0 : it->second;
}

// Free slots after this entry's own recent placements.
int64_t EffectiveFree(const NodeRecord& n, uint32_t recent) { return static_cast<int64_t>(n.free_slots) - recent; }

// Whether `n` may take `r` with `recent` creates sent since its record; when
// not and `why` is set, why not.
bool Eligible(const NodeRecord& n, const PlacementRequest& r, uint32_t recent, std::string* why) {
  auto no = [why](auto&&... parts) {
    if (why != nullptr) *why = (std::string(parts) + ...);
    return false;
  };
  if (n.drain) return no("draining");
  if (!r.backend.empty() && std::find(n.backends.begin(), n.backends.end(), r.backend) == n.backends.end()) {
    return no("no backend ", r.backend);
  }
  if (EffectiveFree(n, recent) <= 0) return no("no free sandbox slot");
  if (r.cpu_millis > static_cast<uint64_t>(n.cpus) * 1000) {
    return no("has ", std::to_string(n.cpus), " cpus, the request asks ", std::to_string(r.cpu_millis), " millicpus");
  }
  const QosRecord& q = n.qos[r.qos == 1 ? 1 : 0];
  if (q.bounded) {
    // The node admits by its class's bound (node/admission): what it would
    // refuse is filtered here, with the node defaults a 0 stands for.
    const char* cls = r.qos == 1 ? "best-effort" : "latency";
    const int64_t cpu = r.cpu_millis != 0 ? r.cpu_millis : kDefaultCpuMillis;
    const int64_t mem = r.memory_mb != 0 ? r.memory_mb : kDefaultMemoryMb;
    if (q.free_cpu_millis < cpu) {
      return no("qos class ", cls, " has ", std::to_string(q.free_cpu_millis), " millicpus free, the request asks ",
                std::to_string(cpu));
    }
    if (q.free_memory_mb < mem) {
      return no("qos class ", cls, " has ", std::to_string(q.free_memory_mb), " MiB free, the request asks ",
                std::to_string(mem));
    }
    return true;
  }
  if (r.memory_mb > 0 && n.free_memory_mb < static_cast<int64_t>(r.memory_mb)) {
    return no("has ", std::to_string(n.free_memory_mb), " MiB of memory free, the request asks ",
              std::to_string(r.memory_mb), " MiB");
  }
  return true;
}

}  // namespace

bool HoldsLayers(const NodeRecord& node, const PlacementRequest& request) {
  for (const std::string& want : request.layers) {
    const bool versioned = want.find('@') != std::string::npos;
    bool found = false;
    for (const std::string& have : node.layers) {
      if (have == want || (!versioned && have.rfind(want + "@", 0) == 0)) {
        found = true;
        break;
      }
    }
    if (!found) return false;
  }
  return true;
}

Candidates::Candidates(const std::vector<NodeRecord>& nodes, const PlacementRequest& request, RecentCount recent,
                       std::mt19937_64& rng, const PlacementOptions& options)
    : nodes_(nodes),
      request_(request),
      recent_(std::move(recent)),
      rng_(rng),
      k_(static_cast<size_t>(std::max(1, options.k))) {}

bool Candidates::Look(uint32_t i, Cand* out) const {
  const NodeRecord& n = nodes_[i];
  const uint32_t recent = recent_ ? recent_(n) : 0;
  if (!Eligible(n, request_, recent, nullptr)) return false;
  *out = Cand{&n, EffectiveFree(n, recent), HoldsLayers(n, request_)};
  return true;
}

bool Candidates::Better(const Cand& a, const Cand& b) {
  if (a.free != b.free) return a.free > b.free;
  if (a.layers != b.layers) return a.layers;
  return a.node->free_memory_mb > b.node->free_memory_mb;
}

void Candidates::Draw() {
  // A partial Fisher-Yates shuffle until k nodes pass the filter: the same
  // draw as shuffling every candidate and taking the first k.
  idx_.resize(nodes_.size());
  for (uint32_t i = 0; i < idx_.size(); ++i) idx_[i] = i;
  order_.reserve(k_);
  while (order_.size() < k_ && drawn_end_ < idx_.size()) {
    std::uniform_int_distribution<size_t> pick(drawn_end_, idx_.size() - 1);
    std::swap(idx_[drawn_end_], idx_[pick(rng_)]);
    Cand c{};
    if (Look(idx_[drawn_end_++], &c)) order_.push_back(c);
  }
  std::stable_sort(order_.begin(), order_.end(), Better);
}

void Candidates::OrderRest() {
  std::vector<Cand> rest;
  rest.reserve(idx_.size() - drawn_end_);
  for (size_t j = drawn_end_; j < idx_.size(); ++j) {
    Cand c{};
    if (Look(idx_[j], &c)) rest.push_back(c);
  }
  std::stable_sort(rest.begin(), rest.end(), Better);
  order_ = std::move(rest);
  next_ = 0;
}

const NodeRecord* Candidates::Next() {
  if (phase_ == 0) {
    Draw();
    phase_ = 1;
  }
  if (next_ == order_.size() && phase_ == 1) {
    OrderRest();
    phase_ = 2;
  }
  return next_ < order_.size() ? order_[next_++].node : nullptr;
}

std::vector<std::string> Place(const std::vector<NodeRecord>& nodes, const PlacementRequest& request,
                               const std::map<std::string, uint32_t>& recent, std::mt19937_64& rng,
                               const PlacementOptions& options) {
  Candidates c(
      nodes, request, [&recent](const NodeRecord& n) { return RecentIn(recent, n); }, rng, options);
  std::vector<std::string> order;
  while (const NodeRecord* n = c.Next()) order.push_back(n->id);
  return order;
}

std::string ExplainNoCandidate(const std::vector<NodeRecord>& nodes, const PlacementRequest& request,
                               const std::map<std::string, uint32_t>& recent) {
  if (nodes.empty()) return "no node is registered";
  std::string out;
  for (const NodeRecord& n : nodes) {
    if (!out.empty()) out += "; ";
    std::string why;
    out += n.id + ": " + (Eligible(n, request, RecentIn(recent, n), &why) ? "eligible" : why);
  }
  return out;
}

}  // namespace warren::cluster

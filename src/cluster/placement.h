// Placement: which nodes a create should try, in order. Pure: no I/O, no
// clock; the caller (router.h) owns the view, the counts and the random
// source.
//
// Filter: a node is a candidate when it is not draining, offers the backend,
// has a free sandbox slot after the placements this entry node already sent
// it since its last record, has the cpus for the request (capacity, as node
// admission clamps; cpu is over-committed) and the memory free of what its
// sandboxes asked for. Choice: power of k choices: k candidates drawn at
// random, the one with the most free slots (ties: the one holding every
// requested layer, then the more memory) first, the other drawn ones next,
// then the rest by the same order. The first node's admission is final; a
// refusal moves to the next.
//
// Lazily (Candidates): a decision looks at the k nodes it draws (a partial
// Fisher-Yates shuffle that skips the ones the filter drops), not at every
// node; the rest are filtered and ordered only when every drawn node
// refused. The power of k choices is Mitzenmacher's ("The Power of Two
// Choices in Randomized Load Balancing", 2001); sampling instead of scanning
// is what Sparrow's schedulers do (Ousterhout et al., SOSP 2013).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cluster/node_record.h"

namespace warren::cluster {

struct PlacementRequest {
  std::string backend;  // "" = any node (its default backend)
  uint32_t cpu_millis = 0;
  uint32_t memory_mb = 0;
  int qos = 0;                      // index of NodeRecord::qos: 0 latency, 1 best-effort
  std::vector<std::string> layers;  // as the create names them ("kind/name" or "kind/name@version")
};

struct PlacementOptions {
  int k = 2;
};

// How many creates this entry node sent `node` since its record (the one
// passed) was written. Called for the nodes a decision looks at only.
using RecentCount = std::function<uint32_t(const NodeRecord& node)>;

// The nodes a create should try, best first, produced on demand: the first
// Next() costs O(k) record checks (plus O(n) when the filter drops most
// nodes), a Next() past the k drawn ones filters and sorts the rest once.
// `nodes`, `request` and `rng` are borrowed for the object's life (no
// temporaries: those constructors are deleted); `recent`
// is read when a node is looked at, so a count raised by a refusal in
// between (Router: "full until its next record") keeps that node out of the
// rest. Not thread-safe (one per decision).
class Candidates {
 public:
  Candidates(const std::vector<NodeRecord>& nodes, const PlacementRequest& request, RecentCount recent,
             std::mt19937_64& rng, const PlacementOptions& options = {});
  Candidates(std::vector<NodeRecord>&&, const PlacementRequest&, RecentCount, std::mt19937_64&,
             const PlacementOptions& = {}) = delete;
  Candidates(const std::vector<NodeRecord>&, PlacementRequest&&, RecentCount, std::mt19937_64&,
             const PlacementOptions& = {}) = delete;

  // The next node to try, borrowed from `nodes`; nullptr when none is left.
  const NodeRecord* Next();

 private:
  struct Cand {
    const NodeRecord* node;
    int64_t free;
    bool layers;
  };
  // The better first: more free slots, then holding the layers, then more memory.
  static bool Better(const Cand& a, const Cand& b);
  // Cand of nodes_[i] when the filter keeps it.
  bool Look(uint32_t i, Cand* out) const;
  void Draw();
  void OrderRest();

  const std::vector<NodeRecord>& nodes_;
  const PlacementRequest& request_;
  const RecentCount recent_;
  std::mt19937_64& rng_;
  const size_t k_;
  std::vector<uint32_t> idx_;  // a permutation of nodes_' indexes; [0, drawn_end_) drawn
  size_t drawn_end_ = 0;
  std::vector<Cand> order_;  // what Next() returns, in order, from next_ on
  size_t next_ = 0;
  int phase_ = 0;  // 0: nothing drawn, 1: the drawn ones, 2: the rest
};

// Node ids to try, best first (Candidates drained); empty when no node
// passes the filter. `recent`: per node id, creates this entry node sent it
// since the record in `nodes` was written.
std::vector<std::string> Place(const std::vector<NodeRecord>& nodes, const PlacementRequest& request,
                               const std::map<std::string, uint32_t>& recent, std::mt19937_64& rng,
                               const PlacementOptions& options = {});

// Why no node passed the filter, one phrase per node ("n1: draining").
std::string ExplainNoCandidate(const std::vector<NodeRecord>& nodes, const PlacementRequest& request,
                               const std::map<std::string, uint32_t>& recent);

// Whether `node` caches every layer of `request` (a name without @version
// matches any version).
bool HoldsLayers(const NodeRecord& node, const PlacementRequest& request);

}  // namespace warren::cluster

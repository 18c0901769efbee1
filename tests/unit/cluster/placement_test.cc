#include "cluster/placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace warren::cluster {
namespace {

NodeRecord Node(const std::string& id, uint32_t free_slots) {
  NodeRecord n;
  n.id = id;
  n.address = "127.0.0.1:1";
  n.backends = {"container", "fncall"};
  n.cpus = 2;
  n.memory_mb = 8192;
  n.max_sandboxes = free_slots;
  n.free_slots = free_slots;
  n.free_memory_mb = 8192;
  n.mod_revision = 1;
  return n;
}

TEST(PlacementTest, FilterDropsDrainedFullWrongBackendAndTooBig) {
  std::vector<NodeRecord> nodes = {Node("ok", 10), Node("drain", 10), Node("full", 0), Node("vm", 10),
                                   Node("small", 10)};
  nodes[1].drain = true;
  nodes[3].backends = {"microvm"};
  nodes[4].free_memory_mb = 100;
  PlacementRequest r;
  r.backend = "container";
  r.memory_mb = 512;
  std::mt19937_64 rng(1);
  EXPECT_EQ(Place(nodes, r, {}, rng), std::vector<std::string>{"ok"});
  const std::string why = ExplainNoCandidate(nodes, r, {});
  EXPECT_NE(why.find("drain: draining"), std::string::npos) << why;
  EXPECT_NE(why.find("full: no free sandbox slot"), std::string::npos) << why;
  EXPECT_NE(why.find("vm: no backend container"), std::string::npos) << why;
  EXPECT_NE(why.find("small: has 100 MiB of memory free, the request asks 512 MiB"), std::string::npos) << why;
  r.cpu_millis = 4000;  // more than any node's 2 cpus
  EXPECT_TRUE(Place(nodes, r, {}, rng).empty());
}

TEST(PlacementTest, BoundedClassesFilterByTheirOwnFreeCapacity) {
  // "be-full": its best-effort class is at its bound, latency has room;
  // "lat-full" the other way round. "unbounded" counts no class.
  std::vector<NodeRecord> nodes = {Node("be-full", 10), Node("lat-full", 10), Node("unbounded", 10)};
  for (NodeRecord* n : {&nodes[0], &nodes[1]}) {
    for (QosRecord& q : n->qos) {
      q.overcommit = 1;
      q.bounded = true;
      q.free_cpu_millis = 2000;
      q.free_memory_mb = 8192;
    }
  }
  nodes[0].qos[1].free_cpu_millis = 500;
  nodes[1].qos[0].free_memory_mb = 100;
  nodes[2].free_memory_mb = -4096;  // over-committed, but no class bound: a request without memory passes
  std::mt19937_64 rng(3);
  PlacementRequest be;
  be.qos = 1;
  be.cpu_millis = 1000;
  std::vector<std::string> order = Place(nodes, be, {}, rng);
  std::sort(order.begin(), order.end());
  EXPECT_EQ(order, (std::vector<std::string>{"lat-full", "unbounded"}));
  PlacementRequest lat;  // 0 = the node defaults (1000 millicpus, 2048 MiB)
  order = Place(nodes, lat, {}, rng);
  std::sort(order.begin(), order.end());
  EXPECT_EQ(order, (std::vector<std::string>{"be-full", "unbounded"}));
  const std::string why = ExplainNoCandidate(nodes, lat, {});
  EXPECT_NE(why.find("lat-full: qos class latency has 100 MiB free, the request asks 2048"), std::string::npos) << why;
  EXPECT_NE(ExplainNoCandidate(nodes, be, {}).find("be-full: qos class best-effort has 500 millicpus free"),
            std::string::npos);
}

TEST(PlacementTest, NodeRecordKeepsItsClassesThroughJson) {
  NodeRecord n = Node("a", 4);
  n.qos[1] = QosRecord{4, true, 3, 3000, 1536, 5000, 31232};
  n.core_scheduling = "absent: test";
  StatusOr<NodeRecord> back = NodeRecordFromJson(ToJson(n));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->qos[0].bounded);
  EXPECT_EQ(back->qos[1].overcommit, 4);
  EXPECT_TRUE(back->qos[1].bounded);
  EXPECT_EQ(back->qos[1].sandboxes, 3u);
  EXPECT_EQ(back->qos[1].cpu_millis, 3000u);
  EXPECT_EQ(back->qos[1].memory_mb, 1536u);
  EXPECT_EQ(back->qos[1].free_cpu_millis, 5000);
  EXPECT_EQ(back->qos[1].free_memory_mb, 31232);
  EXPECT_EQ(back->core_scheduling, "absent: test");
}

TEST(PlacementTest, RecentPlacementsCountAgainstFreeSlots) {
  std::vector<NodeRecord> nodes = {Node("a", 3), Node("b", 3)};
  std::mt19937_64 rng(7);
  // a was sent 3 creates since its record: it is full for this entry.
  EXPECT_EQ(Place(nodes, {}, {{"a", 3}}, rng), std::vector<std::string>{"b"});
  // With 2 sent to a, b (3 free) beats a (1 free) whichever is drawn first.
  for (int i = 0; i < 20; ++i) EXPECT_EQ(Place(nodes, {}, {{"a", 2}}, rng).front(), "b");
}

TEST(PlacementTest, EveryCandidateIsListedOnceBestDrawnFirst) {
  std::vector<NodeRecord> nodes;
  nodes.reserve(8);
  for (int i = 0; i < 8; ++i) nodes.push_back(Node("n" + std::to_string(i), 10 + i));
  std::mt19937_64 rng(3);
  for (int i = 0; i < 50; ++i) {
    std::vector<std::string> order = Place(nodes, {}, {}, rng);
    ASSERT_EQ(order.size(), nodes.size());
    EXPECT_EQ(std::set<std::string>(order.begin(), order.end()).size(), nodes.size());
    // The first is the better of two distinct drawn nodes: n0, with the
    // fewest free slots, loses to any other.
    EXPECT_NE(order.front(), "n0");
  }
}

TEST(PlacementTest, LayerHolderWinsTies) {
  std::vector<NodeRecord> nodes = {Node("cold", 10), Node("warm", 10)};
  nodes[1].layers = {"base/debian-12@1", "tools/python@3"};
  PlacementRequest r;
  r.layers = {"base/debian-12", "tools/python@3"};
  EXPECT_TRUE(HoldsLayers(nodes[1], r));
  EXPECT_FALSE(HoldsLayers(nodes[0], r));
  std::mt19937_64 rng(5);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(Place(nodes, r, {}, rng).front(), "warm");
}

TEST(PlacementTest, FirstChoiceLooksAtTheDrawnNodesOnly) {
  std::vector<NodeRecord> nodes;
  nodes.reserve(160);
  for (int i = 0; i < 160; ++i) nodes.push_back(Node("n" + std::to_string(i), 10 + i % 7));
  std::mt19937_64 rng(13);
  int looked = 0;
  std::map<std::string, uint32_t> recent;
  const PlacementRequest any;
  Candidates c(
      nodes, any,
      [&](const NodeRecord& n) {
        ++looked;
        auto it = recent.find(n.id);
        return it == recent.end() ? 0u : it->second;
      },
      rng);
  const NodeRecord* first = c.Next();
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(looked, 2);  // k = 2: two nodes drawn, none of the other 158 looked at
  const NodeRecord* second = c.Next();
  ASSERT_NE(second, nullptr);
  EXPECT_GE(first->free_slots, second->free_slots);  // the better of the two drawn first
  EXPECT_EQ(looked, 2);
  // Past the drawn ones the rest is filtered once, with the counts as they
  // are then: a node that became full in between is left out.
  const NodeRecord* full = nullptr;
  for (const NodeRecord& n : nodes) {
    if (&n != first && &n != second) full = &n;
  }
  recent[full->id] = 1000;
  std::set<std::string> seen = {first->id, second->id};
  while (const NodeRecord* n = c.Next()) {
    EXPECT_NE(n, full);
    EXPECT_TRUE(seen.insert(n->id).second) << n->id << " twice";
  }
  EXPECT_EQ(seen.size(), nodes.size() - 1);
  EXPECT_EQ(looked, 160);
}

TEST(PlacementTest, DrawSkipsNodesTheFilterDrops) {
  // 158 of 160 drained: the draw goes on past them and finds the 2 left.
  std::vector<NodeRecord> nodes;
  nodes.reserve(160);
  for (int i = 0; i < 160; ++i) {
    nodes.push_back(Node("n" + std::to_string(i), 10));
    nodes.back().drain = i != 17 && i != 99;
  }
  for (uint64_t seed = 0; seed < 20; ++seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::string> order = Place(nodes, {}, {}, rng);
    std::sort(order.begin(), order.end());
    EXPECT_EQ(order, (std::vector<std::string>{"n17", "n99"}));
  }
}

// 10,000 creates from one entry over 160 equal nodes, each node's record
// refreshed (its free slots updated, its recent count reset) every 100
// placements: max/min share <= 1.1. Prints the decision rate and p99.
TEST(PlacementTest, SpreadAndSpeedOver160Nodes) {
  constexpr int kNodes = 160, kCreates = 10000, kRefreshEvery = 100;
  std::vector<NodeRecord> nodes;
  nodes.reserve(kNodes);
  for (int i = 0; i < kNodes; ++i) nodes.push_back(Node("n" + std::to_string(i), 1000));
  std::map<std::string, uint32_t> recent;
  std::map<std::string, int> placed;
  std::mt19937_64 rng(11);
  std::vector<double> us;
  us.reserve(kCreates);
  const auto t0 = std::chrono::steady_clock::now();
  for (int c = 0; c < kCreates; ++c) {
    const auto a = std::chrono::steady_clock::now();
    // What the entry does: the first candidate (the rest only on a refusal).
    const PlacementRequest any;
    Candidates cands(
        nodes, any,
        [&recent](const NodeRecord& n) {
          auto it = recent.find(n.id);
          return it == recent.end() ? 0u : it->second;
        },
        rng);
    const NodeRecord* first = cands.Next();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
    ASSERT_NE(first, nullptr);
    ++recent[first->id];
    ++placed[first->id];
    if ((c + 1) % kRefreshEvery == 0) {
      for (NodeRecord& n : nodes) n.free_slots = 1000 - placed[n.id];
      recent.clear();
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int lo = kCreates, hi = 0;
  for (const NodeRecord& n : nodes) {
    lo = std::min(lo, placed[n.id]);
    hi = std::max(hi, placed[n.id]);
  }
  std::sort(us.begin(), us.end());
  std::printf("placement: %d creates over %d nodes: max/min share %d/%d = %.3f; %.0f decisions/s; p99 %.1f us\n",
              kCreates, kNodes, hi, lo, static_cast<double>(hi) / lo, kCreates / secs, us[us.size() * 99 / 100]);
  EXPECT_LE(static_cast<double>(hi) / lo, 1.1);
  EXPECT_LT(us[us.size() * 99 / 100], 1000.0);
}

}  // namespace
}  // namespace warren::cluster

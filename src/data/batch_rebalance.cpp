// transformers 5's train_sampling_strategy "batch_rebalance" (trainer_pt_utils.BatchRebalanceSampler):
// each global batch sorted longest first and cut into world x grad_accum contiguous groups whose
// padded cost bs * max_len + 0.001 * bs * max_len^2 is balanced by a hill climb over the group
// sizes; the costliest `world` groups form every rank's first micro-batch, the next `world` the
// second, and so on. Written to give the reference's groups exactly: the same double arithmetic,
// Python's stable sorts and first-of-equals min / max, its cycle detection and best-spread snapshot,
// and the order in which it walks a set of group numbers (CPython's table order, below), because
// that order decides which group is topped up first when a slot is frozen.
#include <algorithm>
#include <limits>
#include <set>
#include <utility>

#include "alpaca/data/sampler.h"
#include "alpaca/util/error.h"

namespace alpaca::data {
namespace {

using Pair = std::pair<int64_t, int64_t>;  // (example index, length), longest first

constexpr double kQuadraticCostCoef = 0.001;  // BatchRebalanceSampler.QUADRATIC_COST_COEF

// bs * max_len + QUADRATIC_COST_COEF * bs * max_len * max_len, evaluated as Python does: an int
// product plus ((0.001 * bs) * max_len) * max_len in doubles.
double rebalance_cost(int64_t bs, int64_t max_len) {
  const double quad = kQuadraticCostCoef * static_cast<double>(bs) * static_cast<double>(max_len) *
                      static_cast<double>(max_len);
  return static_cast<double>(bs * max_len) + quad;
}

// Each group's cost for the contiguous groups `counts` cut from `sorted` (a group's first row is
// its longest).
std::vector<double> group_costs(const std::vector<int64_t>& counts, const std::vector<Pair>& sorted) {
  std::vector<double> costs;
  costs.reserve(counts.size());
  int64_t start = 0;
  for (int64_t c : counts) {
    costs.push_back(c == 0 ? 0.0 : rebalance_cost(c, sorted[static_cast<size_t>(start)].second));
    start += c;
  }
  return costs;
}

// The order CPython iterates set(values) for distinct small non-negative ints (hash(i) == i):
// their slots in setobject.c's open-addressed table (8 slots to start; from slot hash & mask, 10
// entries probed linearly while they fit, then i = i * 5 + 1 + (perturb >>= 5); the table is
// rebuilt at 4 x used entries once 3/5 full, re-inserting in slot order). Python does not promise
// this order, but the sampler's result depends on it, and it has been this since 3.7 (the venv's 3.11).
std::vector<int64_t> python_int_set_order(const std::vector<int64_t>& values) {
  auto insert = [](std::vector<int64_t>& table, int64_t key) {
    const size_t mask = table.size() - 1;
    size_t perturb = static_cast<size_t>(key);
    size_t i = static_cast<size_t>(key) & mask;
    for (;;) {
      const size_t probes = i + 9 <= mask ? 9 : 0;
      for (size_t j = i; j <= i + probes; ++j)
        if (table[j] < 0) {
          table[j] = key;
          return;
        }
      perturb >>= 5;
      i = (i * 5 + 1 + perturb) & mask;
    }
  };
  std::vector<int64_t> table(8, -1);
  size_t used = 0;
  for (int64_t v : values) {
    ALPACA_CHECK(v >= 0, "python_int_set_order: negative value " << v);
    if (std::find(table.begin(), table.end(), v) != table.end()) continue;
    insert(table, v);
    ++used;
    if (used * 5 >= (table.size() - 1) * 3) {
      size_t size = 8;
      while (size <= used * 4) size <<= 1;
      std::vector<int64_t> grown(size, -1);
      for (int64_t k : table)
        if (k >= 0) insert(grown, k);
      table = std::move(grown);
    }
  }
  std::vector<int64_t> order;
  for (int64_t k : table)
    if (k >= 0) order.push_back(k);
  return order;
}

// The groups sharing `pivot`'s slot: by cost, descending (stable), the dp-wide band holding it.
std::vector<int64_t> slot_groups(const std::vector<double>& costs, int64_t pivot, int64_t dp) {
  const int64_t k = static_cast<int64_t>(costs.size());
  std::vector<int64_t> ranking(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) ranking[static_cast<size_t>(i)] = i;
  std::stable_sort(ranking.begin(), ranking.end(), [&](int64_t a, int64_t b) { return costs[a] > costs[b]; });
  const int64_t at = std::find(ranking.begin(), ranking.end(), pivot) - ranking.begin();
  const int64_t start = at / dp * dp, end = std::min(start + dp, k);
  return python_int_set_order(std::vector<int64_t>(ranking.begin() + start, ranking.begin() + end));
}

// _relieve_and_freeze: before the slot freezes, its other groups take rows from the cheapest groups
// outside it (those with more than one row) while their cost stays within the slot's peak.
void relieve_and_freeze(std::vector<int64_t>& counts, const std::vector<int64_t>& members, int64_t pivot,
                        std::set<int64_t>& frozen, const std::vector<Pair>& sorted, double cap) {
  const int64_t k = static_cast<int64_t>(counts.size());
  const auto in_slot = [&](int64_t i) { return std::find(members.begin(), members.end(), i) != members.end(); };
  for (int64_t gi : members) {
    if (frozen.count(gi) || gi == pivot) continue;
    for (;;) {
      const std::vector<double> costs = group_costs(counts, sorted);
      int64_t start = 0;
      for (int64_t i = 0; i < gi; ++i) start += counts[i];
      const int64_t max_len = counts[gi] > 0 ? sorted[static_cast<size_t>(start)].second : 0;
      if (rebalance_cost(counts[gi] + 1, max_len) > cap) break;
      int64_t donor = -1;
      for (int64_t i = 0; i < k; ++i)
        if (!frozen.count(i) && !in_slot(i) && counts[i] > 1 && (donor < 0 || costs[i] < costs[donor])) donor = i;
      if (donor < 0) break;
      ++counts[gi];
      --counts[donor];
    }
  }
  frozen.insert(members.begin(), members.end());
}

// _balance_groups: the group sizes (K = dp x grad_accum contiguous groups of `sorted`).
std::vector<int64_t> balance_group_sizes(const std::vector<Pair>& sorted, int64_t dp, int64_t grad_accum,
                                         int64_t effective) {
  const int64_t n = static_cast<int64_t>(sorted.size());
  const int64_t k = dp * grad_accum;
  ALPACA_CHECK(n >= k, "batch_rebalance: " << n << " examples cannot fill " << k << " micro-batches");
  std::vector<int64_t> counts(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) counts[static_cast<size_t>(i)] = n / k + (i < n % k ? 1 : 0);
  std::set<int64_t> frozen;
  std::set<std::vector<int64_t>> seen;
  double best_spread = std::numeric_limits<double>::infinity();
  std::vector<int64_t> best = counts;
  for (int64_t iter = 0; iter < std::max(k * 30, effective); ++iter) {
    if (!seen.insert(counts).second) break;  // a cycle: no improving move left
    const std::vector<double> costs = group_costs(counts, sorted);
    std::vector<int64_t> active;
    for (int64_t i = 0; i < k; ++i)
      if (!frozen.count(i)) active.push_back(i);
    if (active.size() <= 1) break;
    int64_t hi = active[0], lo = active[0];  // the first maximum and the first minimum, as max() / min()
    for (int64_t i : active) {
      if (costs[i] > costs[hi]) hi = i;
      if (costs[i] < costs[lo]) lo = i;
    }
    const double spread = costs[hi] - costs[lo];
    if (spread < best_spread) {
      best_spread = spread;
      best = counts;
    }
    if (costs[hi] == costs[lo]) break;
    std::vector<int64_t> candidates = active;
    std::stable_sort(candidates.begin(), candidates.end(), [&](int64_t a, int64_t b) { return costs[a] < costs[b]; });
    bool moved = false;
    for (int64_t c : candidates) {
      if (c == hi || costs[c] == costs[hi]) continue;
      if (counts[hi] > 1) {
        --counts[hi];
        ++counts[c];
        moved = true;
        break;
      }
    }
    if (moved) continue;
    if (counts[hi] > 1) break;
    relieve_and_freeze(counts, slot_groups(costs, hi, dp), hi, frozen, sorted, costs[hi]);
  }
  return best;
}

}  // namespace

std::vector<std::vector<std::vector<int64_t>>> rebalance_global_batch(const std::vector<int64_t>& indices,
                                                                      const std::vector<int64_t>& lengths,
                                                                      int64_t world, int64_t grad_accum,
                                                                      int64_t effective) {
  ALPACA_CHECK(world > 0 && grad_accum > 0, "batch_rebalance: world and grad_accum must be positive");
  std::vector<Pair> sorted;
  sorted.reserve(indices.size());
  for (int64_t i : indices) {
    ALPACA_CHECK(i >= 0 && i < static_cast<int64_t>(lengths.size()), "batch_rebalance: example " << i
                                                                         << " has no length");
    sorted.emplace_back(i, lengths[static_cast<size_t>(i)]);
  }
  std::stable_sort(sorted.begin(), sorted.end(), [](const Pair& a, const Pair& b) { return a.second > b.second; });
  const std::vector<int64_t> counts = balance_group_sizes(sorted, world, grad_accum, effective);
  const std::vector<double> costs = group_costs(counts, sorted);
  std::vector<int64_t> by_cost(counts.size());
  for (size_t i = 0; i < by_cost.size(); ++i) by_cost[i] = static_cast<int64_t>(i);
  std::stable_sort(by_cost.begin(), by_cost.end(), [&](int64_t a, int64_t b) { return costs[a] > costs[b]; });
  std::vector<int64_t> starts(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) starts[i] = starts[i - 1] + counts[i - 1];
  std::vector<std::vector<std::vector<int64_t>>> out(static_cast<size_t>(world),
                                                     std::vector<std::vector<int64_t>>(static_cast<size_t>(grad_accum)));
  for (int64_t slot = 0; slot < grad_accum; ++slot)
    for (int64_t r = 0; r < world; ++r) {
      const int64_t g = by_cost[static_cast<size_t>(slot * world + r)];
      auto& mb = out[static_cast<size_t>(r)][static_cast<size_t>(slot)];
      for (int64_t j = 0; j < counts[g]; ++j) mb.push_back(sorted[static_cast<size_t>(starts[g] + j)].first);
    }
  return out;
}

}  // namespace alpaca::data

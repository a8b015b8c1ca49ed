// The speculative-tree case of the pool benchmark (benches/pool.cpp, `make bench`'s pool section):
// at Qwen3.5-35B-A3B dims (benches/pool_cases.h), one draft tree of 16, 32 or 64 nodes on a slot
// of a pool of 8, verified two ways:
//   tree    one mlxk_gated_delta_verify_tree_pool call (each leaf's path gathered and verified
//           packed from the slot: P = the sum of the leaves' depths tokens through the kernel)
//   chains  the same nodes as separate mlxk_gated_delta_verify_pool calls, one per node on its
//           path (root .. node) from the slot, all evaluated in one mx::eval (the sum of the
//           nodes' depths tokens)
// Before timing, every node's y of the tree call is compared bit for bit with the last y of its
// chain call (documented). The trees: `width` nodes a level over `depth` levels, each node's
// parent a random node of the level above (fixed seed).

#ifndef MLXKERN_BENCH_TREE_CASES_H
#define MLXKERN_BENCH_TREE_CASES_H

#include "pool_cases.h"

namespace pool_cases {

struct TreeConfig {
  int width = 4, depth = 4, rounds = 20, slots = 8, slot = 5;
  unsigned seed = 31;
};

struct TreeRow {
  std::string name;
  double tokens = 0;  // tokens through the kernel per verify
  std::vector<double> s;
};

struct TreeResult {
  TreeConfig cfg;
  int nodes = 0, leaves = 0;
  std::vector<TreeRow> rows;
  std::vector<Check> checks;
  bool ok = true;
};

// The tree's parents (level order) and each node's path.
inline std::vector<std::int32_t> level_tree(const TreeConfig& cfg) {
  std::mt19937 rng(cfg.seed + static_cast<unsigned>(cfg.width * 16 + cfg.depth));
  std::vector<std::int32_t> parents;
  for (int level = 0; level < cfg.depth; ++level)
    for (int i = 0; i < cfg.width; ++i)
      parents.push_back(level == 0 ? -1
                                   : (level - 1) * cfg.width +
                                         static_cast<std::int32_t>(rng() % cfg.width));
  return parents;
}

inline std::vector<std::int32_t> tree_path(const std::vector<std::int32_t>& parents, int j) {
  std::vector<std::int32_t> path{j};
  while (parents[static_cast<std::size_t>(path.back())] >= 0)
    path.push_back(parents[static_cast<std::size_t>(path.back())]);
  return {path.rbegin(), path.rend()};
}

inline TreeResult run_tree(const TreeConfig& cfg) {
  TreeResult r;
  r.cfg = cfg;
  const std::vector<std::int32_t> parents = level_tree(cfg);
  const int n = static_cast<int>(parents.size());
  r.nodes = n;
  std::vector<bool> inner(parents.size(), false);
  for (std::int32_t p : parents)
    if (p >= 0) inner[static_cast<std::size_t>(p)] = true;
  double leaf_tokens = 0, node_tokens = 0;
  std::vector<std::vector<std::int32_t>> paths;
  for (int j = 0; j < n; ++j) {
    paths.push_back(tree_path(parents, j));
    node_tokens += static_cast<double>(paths.back().size());
    if (!inner[static_cast<std::size_t>(j)]) {
      ++r.leaves;
      leaf_tokens += static_cast<double>(paths.back().size());
    }
  }
  const Gates g;
  const Acts x = random_acts(1, n, 4000 + static_cast<std::uint64_t>(n));
  const mx::array pool_mx = normal({cfg.slots, kHv, kD, kD}, mx::float32, 0.05f, 77);
  mx::eval(pool_mx);
  const mlxk::Array pool = mlxk::Array::from_mlx(pool_mx);
  const std::vector<std::int32_t> cu{0, n}, slots{cfg.slot};
  // Each node's path as its own window [1, depth, ...], made and evaluated before timing.
  std::vector<Acts> chains;
  for (const auto& path : paths) {
    const mx::array idx(path.data(), {static_cast<int>(path.size())}, mx::int32);
    std::vector<mx::array> parts;
    for (const mx::array& a : x.arrays) parts.push_back(mx::take(a, idx, 1));
    chains.push_back(acts_of(std::move(parts)));
  }
  auto tree_call = [&]() {
    return mlxk::gated_delta_verify_tree_pool(x[0], x[1], x[2], x[3], x[4], g.h_a_log,
                                              g.h_dt_bias, pool, cu, parents, slots)
        .to_mlx();
  };
  auto chain_calls = [&]() {
    std::vector<mx::array> ys;
    for (const Acts& c : chains)
      ys.push_back(mlxk::gated_delta_verify_pool(c[0], c[1], c[2], c[3], c[4], g.h_a_log,
                                                 g.h_dt_bias, pool, slots)
                       .to_mlx());
    return ys;
  };
  // The check: node j's y against the last token of its chain's.
  {
    mx::array y = tree_call();
    std::vector<mx::array> ys = chain_calls();
    mx::eval(y);
    mx::eval(ys);
    std::vector<mx::array> lasts;
    for (const mx::array& c : ys) {
      const int t = c.shape(1);
      lasts.push_back(mx::slice(c, {0, t - 1, 0, 0}, {1, t, kHv, kD}));
    }
    r.checks.push_back(compare("tree verify: every node's y vs its chain verify", y,
                               mx::concatenate(lasts, 1), true));
    r.ok = r.checks.back().ok;
  }
  TreeRow tree{"tree", leaf_tokens, {}}, chain{"chains", node_tokens, {}};
  for (int round = 0; round < cfg.rounds; ++round) {
    auto t0 = Clock::now();
    mx::array y = tree_call();
    mx::eval(y);
    tree.s.push_back(seconds_since(t0));
    t0 = Clock::now();
    std::vector<mx::array> ys = chain_calls();
    mx::eval(ys);
    chain.s.push_back(seconds_since(t0));
  }
  r.rows = {tree, chain};
  return r;
}

}  // namespace pool_cases

#endif  // MLXKERN_BENCH_TREE_CASES_H

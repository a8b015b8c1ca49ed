// Tests of the tree calls of include/mlxkern_pool.hpp (gated_delta_verify_tree_pool,
// gated_delta_commit_tree_pool): on random draft trees (shared prefixes, a chain, a star, a
// single node, several trees with a padding one), every node's y equals the last y of
// gated_delta_verify_pool on the chain of its path, and each tree's commit equals
// gated_delta_state_pool on that chain, bit for bit; the wrapper refuses host arrays of the
// wrong length before the library reads them, and the library's messages come through. Built
// and run by scripts/test/cpp.sh beside test_mlxkern_hpp.cpp (strict warnings, ASan + UBSan).
#include "mlxkern.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "checks.hpp"

namespace {

using Ints = std::vector<std::int32_t>;

std::size_t at(std::int64_t i) { return static_cast<std::size_t>(i); }
std::int32_t i32(std::size_t n) { return static_cast<std::int32_t>(n); }

std::vector<float> random_floats(std::mt19937 &rng, std::size_t n, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> out(n);
  for (float &value : out) value = normal(rng);
  return out;
}

// A random tree of `size` nodes: each node's parent an earlier node or -1.
Ints random_tree(std::mt19937 &rng, std::size_t size) {
  Ints parents;
  for (std::size_t j = 0; j < size; ++j)
    parents.push_back(j == 0 || rng() % 8 == 0 ? -1 : i32(rng() % j));
  return parents;
}

// The path root -> node j.
std::vector<std::size_t> path_to(const Ints &parents, std::size_t j) {
  std::vector<std::size_t> path{j};
  while (parents[path.back()] >= 0) path.push_back(at(parents[path.back()]));
  return {path.rbegin(), path.rend()};
}

// Host tokens of one call: q, k [T, Hk, Dk], v [T, Hv, Dv], a, b [T, Hv] as floats.
struct Tokens {
  std::size_t hk, hv, dk, dv;
  std::vector<float> q, k, v, a, b;

  // The arrays of tokens `pick` (in that order) as one row: q, k, v bfloat16, a, b float32.
  std::vector<mlxk::Array> arrays(const std::vector<std::size_t> &pick) const {
    auto take = [&](const std::vector<float> &x, std::size_t per) {
      std::vector<float> out;
      for (std::size_t t : pick)
        for (std::size_t e = t * per; e < (t + 1) * per; ++e) out.push_back(x[e]);
      return out;
    };
    const std::int32_t n = i32(pick.size());
    std::vector<mlxk::Array> out;
    out.push_back(mlxk::Array::from_bf16(take(q, hk * dk), {1, n, i32(hk), i32(dk)}));
    out.push_back(mlxk::Array::from_bf16(take(k, hk * dk), {1, n, i32(hk), i32(dk)}));
    out.push_back(mlxk::Array::from_bf16(take(v, hv * dv), {1, n, i32(hv), i32(dv)}));
    out.push_back(mlxk::Array::from_f32(take(a, hv), {1, n, i32(hv)}));
    out.push_back(mlxk::Array::from_f32(take(b, hv), {1, n, i32(hv)}));
    return out;
  }
};

bool same_bits(const std::vector<float> &x, std::size_t xi, const std::vector<float> &y,
               std::size_t yi, std::size_t n) {
  return x.size() >= xi + n && y.size() >= yi + n &&
         std::memcmp(x.data() + xi, y.data() + yi, n * sizeof(float)) == 0;
}

void test_trees(std::mt19937 &rng, const std::vector<Ints> &trees) {
  const std::size_t hk = 1, hv = 2, dk = 32, dv = 8, n = trees.size() + 2;
  Ints cu{0}, parents;
  for (const Ints &t : trees) {
    cu.push_back(cu.back() + i32(t.size()));
    parents.insert(parents.end(), t.begin(), t.end());
  }
  const std::size_t total = parents.size(), state = hv * dv * dk;
  Tokens x{hk, hv, dk, dv, random_floats(rng, total * hk * dk, 0.2f),
           random_floats(rng, total * hk * dk, 0.2f), random_floats(rng, total * hv * dv, 1.0f),
           random_floats(rng, total * hv, 2.0f), random_floats(rng, total * hv, 2.0f)};
  mlxk::Array a_log = mlxk::Array::from_f32(random_floats(rng, hv, 0.5f), {i32(hv)});
  mlxk::Array dt_bias = mlxk::Array::from_f32(random_floats(rng, hv, 0.5f), {i32(hv)});
  const std::vector<float> pool_host = random_floats(rng, n * state, 0.5f);
  const mlxk::Shape pool_shape{i32(n), i32(hv), i32(dv), i32(dk)};
  mlxk::Array pool = mlxk::Array::from_f32(pool_host, pool_shape);
  Ints slots;
  std::vector<std::uint8_t> fresh;
  for (std::size_t i = 0; i < trees.size(); ++i) {
    slots.push_back(i == 1 && trees.size() > 2 ? -1 : i32((i * 3 + 1) % n));
    fresh.push_back(static_cast<std::uint8_t>(rng() % 3 == 0));
  }
  std::vector<std::size_t> all(total);
  for (std::size_t i = 0; i < total; ++i) all[i] = i;
  const std::vector<mlxk::Array> in = x.arrays(all);
  const std::vector<float> y =
      mlxk::gated_delta_verify_tree_pool(in[0], in[1], in[2], in[3], in[4], a_log, dt_bias, pool,
                                         cu, parents, slots, fresh)
          .to_floats();
  CHECK(y.size() == total * hv * dv);
  const std::size_t tok = hv * dv;
  bool nodes_ok = true;
  Ints lengths, accepted;
  std::vector<std::vector<std::size_t>> paths;
  for (std::size_t i = 0; i < trees.size(); ++i) {
    const std::size_t c0 = at(cu[i]);
    for (std::size_t j = 0; j < trees[i].size(); ++j) {
      if (slots[i] < 0) {
        for (std::size_t e = 0; e < tok; ++e) nodes_ok = nodes_ok && y[(c0 + j) * tok + e] == 0.0f;
        continue;
      }
      std::vector<std::size_t> path = path_to(trees[i], j);
      for (std::size_t &p : path) p += c0;
      const std::vector<mlxk::Array> c = x.arrays(path);
      const std::vector<float> chain =
          mlxk::gated_delta_verify_pool(c[0], c[1], c[2], c[3], c[4], a_log, dt_bias, pool,
                                        Ints{slots[i]}, mlxk::Span<std::uint8_t>(&fresh[i], 1))
              .to_floats();
      nodes_ok = nodes_ok && same_bits(y, (c0 + j) * tok, chain, (path.size() - 1) * tok, tok);
    }
    std::vector<std::size_t> path;
    if (!trees[i].empty()) path = path_to(trees[i], rng() % trees[i].size());
    lengths.push_back(i32(path.size()));
    for (std::size_t p : path) accepted.push_back(i32(p));
    for (std::size_t &p : path) p += c0;
    paths.push_back(path);
  }
  CHECK(nodes_ok);
  const std::vector<float> committed =
      mlxk::gated_delta_commit_tree_pool(in[1], in[2], in[3], in[4], a_log, dt_bias, pool, cu,
                                         parents, slots, lengths, accepted, fresh)
          .to_floats();
  bool commit_ok = committed.size() == n * state;
  for (std::size_t i = 0; i < trees.size(); ++i) {
    if (slots[i] < 0) continue;
    const std::vector<mlxk::Array> c = x.arrays(paths[i]);
    const std::vector<float> chain =
        mlxk::gated_delta_state_pool(c[1], c[2], c[3], c[4], a_log, dt_bias, pool,
                                     Ints{slots[i]}, Ints{lengths[i]},
                                     mlxk::Span<std::uint8_t>(&fresh[i], 1))
            .to_floats();
    const std::size_t s = at(slots[i]) * state;
    commit_ok = commit_ok && same_bits(committed, s, chain, s, state);
  }
  CHECK(commit_ok);
  // The pool the caller kept is unchanged.
  CHECK(same_bits(pool.to_floats(), 0, pool_host, 0, n * state));
}

void test_errors() {
  const std::size_t hv = 2, dk = 32, dv = 4;
  std::mt19937 rng(7);
  Tokens x{1, hv, dk, dv, random_floats(rng, 3 * dk, 0.2f), random_floats(rng, 3 * dk, 0.2f),
           random_floats(rng, 3 * hv * dv, 1.0f), random_floats(rng, 3 * hv, 1.0f),
           random_floats(rng, 3 * hv, 1.0f)};
  const std::vector<mlxk::Array> in = x.arrays({0, 1, 2});
  mlxk::Array a_log = mlxk::Array::from_f32(random_floats(rng, hv, 0.5f), {i32(hv)});
  mlxk::Array dt_bias = mlxk::Array::from_f32(random_floats(rng, hv, 0.5f), {i32(hv)});
  mlxk::Array pool = mlxk::Array::zeros({3, i32(hv), i32(dv), i32(dk)}, mlxk::Dtype::Float32);
  auto message = [](mlxk_status want, auto &&call) -> std::string {
    try {
      call();
    } catch (const mlxk::Error &error) {
      check_at(error.status() == want, "the expected status", __LINE__);
      return error.message();
    }
    check_at(false, "no exception", __LINE__);
    return {};
  };
  // One slot for two trees: the wrapper's own refusal (the library would read two).
  std::string m = message(MLXK_ERR_INVALID_ARGUMENT, [&] {
    (void)mlxk::gated_delta_verify_tree_pool(in[0], in[1], in[2], in[3], in[4], a_log, dt_bias,
                                             pool, {0, 2, 3}, {-1, 0, -1}, {0});
  });
  CHECK(m.find("slots: 1 values for 2 trees") != std::string::npos);
  m = message(MLXK_ERR_INVALID_ARGUMENT, [&] {
    (void)mlxk::gated_delta_commit_tree_pool(in[1], in[2], in[3], in[4], a_log, dt_bias, pool,
                                             {0, 2, 3}, {-1, 0, -1}, {0, 1}, {1}, {0});
  });
  CHECK(m.find("accepted_lengths: 1 values for 2 slots") != std::string::npos);
  // The library's: a parent after its node, a path that skips a node.
  m = message(MLXK_ERR_INVALID_ARGUMENT, [&] {
    (void)mlxk::gated_delta_verify_tree_pool(in[0], in[1], in[2], in[3], in[4], a_log, dt_bias,
                                             pool, {0, 3}, {-1, 2, 0}, {1});
  });
  CHECK(m.find("mlxk_gated_delta_verify_tree_pool: parents[1] is 2") == 0);
  m = message(MLXK_ERR_INVALID_ARGUMENT, [&] {
    (void)mlxk::gated_delta_commit_tree_pool(in[1], in[2], in[3], in[4], a_log, dt_bias, pool,
                                             {0, 3}, {-1, 0, 1}, {1}, {2}, {0, 2});
  });
  CHECK(m.find("accepted_paths[1] is node 2") != std::string::npos);
}

}  // namespace

int main() {
  try {
    const char *fixed = std::getenv("MLXK_TEST_SEED");
    const unsigned seed = fixed != nullptr ? static_cast<unsigned>(std::strtoul(fixed, nullptr, 10))
                                           : std::random_device{}();
    std::printf("tree tests: MLXK_TEST_SEED=%u\n", seed);
    std::mt19937 rng(seed);
    Ints star{-1};
    for (int i = 0; i < 7; ++i) star.push_back(0);
    Ints chain;
    for (int i = 0; i < 8; ++i) chain.push_back(i - 1);
    test_trees(rng, {Ints{-1}});
    test_trees(rng, {chain});
    test_trees(rng, {star, Ints{-1, 0}, random_tree(rng, 6)});
    for (int round = 0; round < 4; ++round) {
      std::vector<Ints> trees;
      for (std::size_t i = 0; i < 1 + rng() % 3; ++i) trees.push_back(random_tree(rng, 1 + rng() % 12));
      test_trees(rng, trees);
    }
    test_trees(rng, {Ints{}, chain, Ints{}});
    test_errors();
  } catch (const std::exception &error) {
    std::fprintf(stderr, "FAIL: unexpected exception: %s\n", error.what());
    return 1;
  }
  std::printf("%d checks passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

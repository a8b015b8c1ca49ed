// `make bench-cuda`'s rows of the kernels at engine dims (bench_cuda.h): decode, replay, head
// split, gated norm, the decode layer's split and update, prefill, and the backward pass.

#include "bench_cuda.h"

namespace bench_cuda {

void decode(int batch, int warmup, int iters) {
  auto ls = layers(batch, 1);
  const std::string name = "decode B=" + std::to_string(batch) + " (30 layers)";
  Build build_floor = state_floor(ls);
  Build build = [&] {
    std::vector<mx::array> outs;
    for (auto& x : ls) {
      auto h = [](const mx::array& a) { return mlxk::Array::from_mlx(a); };
      auto st = h(x.state);
      auto r = mlxk::gated_delta_update(h(x.q), h(x.k), h(x.v), h(x.a), h(x.b), h(x.a_log),
                                        h(x.dt_bias), &st);
      outs.push_back(r.y.to_mlx());
      outs.push_back(r.state.to_mlx());
    }
    return outs;
  };
  Build fast = [&] {
    std::vector<mx::array> outs;
    for (auto& x : ls) {
      auto [g, beta] = gates(x);
      auto r = mx::fast::gated_delta_update(x.q, x.k, x.v, g, beta, x.state);
      outs.insert(outs.end(), r.begin(), r.end());
    }
    return outs;
  };
  const double bytes = update_bytes(batch, 1);
  const double f = graph_us(build_floor, warmup, iters);
  row("decode", name, impl("mlx floor"), f, kLayers, double(batch) * kHv * kD * kD * 8, 0);
  if (batch == 1 && !pipelined) {
    // Where a step's time goes: building the 30 nodes on the host (no eval).
    row("decode", name, "mlxkern build", time_us([&] { (void)build(); }, warmup, iters),
        kLayers, 0, 0);
    row("decode", name, "floor build", time_us([&] { (void)build_floor(); }, warmup, iters),
        kLayers, 0, 0);
  }
  row("decode", name, impl("mlxkern"), graph_us(build, warmup, iters), kLayers, bytes, f);
  if (!pipelined) row("decode", name, "mlx fast", graph_us(fast, warmup, iters), kLayers, bytes, f);
}

void replay(int batch, int warmup, int iters) {
  auto ls = layers(batch, 8);
  const std::string name = "replay T=8 B=" + std::to_string(batch) + " (30 layers)";
  std::vector<std::int32_t> lengths(batch, 8);
  Build floor = state_floor(ls);
  Build ours = [&] {
    std::vector<mx::array> outs;
    for (auto& x : ls) {
      auto h = [](const mx::array& a) { return mlxk::Array::from_mlx(a); };
      auto st = h(x.state);
      auto r = mlxk::gated_delta_state(h(x.k), h(x.v), h(x.a), h(x.b), h(x.a_log), h(x.dt_bias),
                                       &st, mlxk::Span<std::int32_t>(lengths));
      outs.push_back(r.to_mlx());
    }
    return outs;
  };
  const double f = graph_us(floor, warmup, iters);
  row("replay", name, impl("mlx floor"), f, kLayers, double(batch) * kHv * kD * kD * 8, 0);
  row("replay", name, impl("mlxkern"), graph_us(ours, warmup, iters), kLayers,
      update_bytes(batch, 8) - double(batch) * 8 * (kHk + kHv) * kD * 2, f);
}

void head_split(int s, int warmup, int iters) {
  const int c = 2 * kHk * kD + kHv * kD;
  std::vector<mx::array> xs;
  for (int l = 0; l < kLayers; ++l) xs.push_back(normal({1, s, c}, mx::bfloat16, 2.0f));
  auto qs = normal({kD}, mx::bfloat16, 1.0f), ks = normal({kD}, mx::bfloat16, 1.0f);
  mx::eval(xs);
  mx::eval({qs, ks});
  const std::string name = "head split S=" + std::to_string(s) + " (30 layers)";
  Build floor = [&] {
    std::vector<mx::array> outs;
    for (auto& x : xs) outs.push_back(mx::negative(x));
    return outs;
  };
  Build ours = [&] {
    std::vector<mx::array> outs;
    auto hq = mlxk::Array::from_mlx(qs), hk = mlxk::Array::from_mlx(ks);
    for (auto& x : xs) {
      auto r = mlxk::silu_rms_heads(mlxk::Array::from_mlx(x), hq, hk, kHk, kHv, kD, 1e-6f);
      outs.push_back(r.q.to_mlx());
      outs.push_back(r.k.to_mlx());
      outs.push_back(r.v.to_mlx());
    }
    return outs;
  };
  const double bytes = double(s) * c * 2 * 2;
  const double f = graph_us(floor, warmup, iters);
  row("split", name, impl("mlx floor"), f, kLayers, bytes, 0);
  row("split", name, impl("mlxkern"), graph_us(ours, warmup, iters), kLayers, bytes, f);
}

// A decode step's head split and update per layer: the two calls (mlxk_silu_rms_heads, then
// mlxk_gated_delta_update on its q, k, v) against mlxk_gated_delta_update_from_conv (one node,
// the same bits), beside the floor op over the same states.
void split_update(int batch, int warmup, int iters) {
  auto ls = layers(batch, 1);
  const int c = 2 * kHk * kD + kHv * kD;
  std::vector<mx::array> xs;
  for (int l = 0; l < kLayers; ++l) xs.push_back(normal({batch, 1, c}, mx::bfloat16, 2.0f));
  mx::eval(xs);
  const SplitConstants split_constants;
  const auto &qs = split_constants.qs, &ks = split_constants.ks;
  const float eps = split_constants.eps;
  const std::string name = "split + update B=" + std::to_string(batch) + " (30 layers)";
  auto h = [](const mx::array& a) { return mlxk::Array::from_mlx(a); };
  Build floor = state_floor(ls);
  Build two = [&] {
    std::vector<mx::array> outs;
    auto hq = h(qs), hk = h(ks);
    for (int l = 0; l < kLayers; ++l) {
      const Layer& x = ls[l];
      auto st = h(x.state);
      auto s = mlxk::silu_rms_heads(h(xs[l]), hq, hk, kHk, kHv, kD, eps);
      auto r = mlxk::gated_delta_update(s.q, s.k, s.v, h(x.a), h(x.b), h(x.a_log),
                                        h(x.dt_bias), &st);
      outs.push_back(r.y.to_mlx());
      outs.push_back(r.state.to_mlx());
    }
    return outs;
  };
  Build one = [&] {
    std::vector<mx::array> outs;
    auto hq = h(qs), hk = h(ks);
    for (int l = 0; l < kLayers; ++l) {
      const Layer& x = ls[l];
      auto st = h(x.state);
      auto r = mlxk::gated_delta_update_from_conv(h(xs[l]), hq, hk, kHk, kHv, kD, eps, h(x.a),
                                                  h(x.b), h(x.a_log), h(x.dt_bias), &st);
      outs.push_back(r.y.to_mlx());
      outs.push_back(r.state.to_mlx());
    }
    return outs;
  };
  const double bytes = update_bytes(batch, 1);
  const double f = graph_us(floor, warmup, iters);
  row("layer", name, impl("mlx floor"), f, kLayers, double(batch) * kHv * kD * kD * 8, 0);
  row("layer", name, impl("split + update"), graph_us(two, warmup, iters), kLayers, bytes, f);
  row("layer", name, impl("from conv"), graph_us(one, warmup, iters), kLayers, bytes, f);
}

void gated_norm(int s, int warmup, int iters) {
  std::vector<mx::array> xs, zs;
  for (int l = 0; l < kLayers; ++l) {
    xs.push_back(normal({s * kHv, kD}, mx::bfloat16, 1.0f));
    zs.push_back(normal({s * kHv, kD}, mx::bfloat16, 2.0f));
  }
  auto w = normal({kD}, mx::bfloat16, 1.0f);
  mx::eval(xs);
  mx::eval(zs);
  mx::eval(w);
  const std::string name = "gated norm S=" + std::to_string(s) + " (30 layers)";
  Build floor = [&] {
    std::vector<mx::array> outs;
    for (int l = 0; l < kLayers; ++l) outs.push_back(mx::add(xs[l], zs[l]));
    return outs;
  };
  Build ours = [&] {
    std::vector<mx::array> outs;
    auto hw = mlxk::Array::from_mlx(w);
    for (int l = 0; l < kLayers; ++l) {
      outs.push_back(mlxk::gated_rms_norm(mlxk::Array::from_mlx(xs[l]),
                                          mlxk::Array::from_mlx(zs[l]), hw, 1e-6f)
                         .to_mlx());
    }
    return outs;
  };
  const double bytes = double(s) * kHv * kD * 2 * 3;
  const double f = graph_us(floor, warmup, iters);
  row("norm", name, impl("mlx floor"), f, kLayers, bytes, 0);
  row("norm", name, impl("mlxkern"), graph_us(ours, warmup, iters), kLayers, bytes, f);
}

void prefill(int t, int warmup, int iters) {
  Layer x = layers(1, t).front();
  const std::string name = "prefill T=" + std::to_string(t) + " B=1 (1 layer)";
  auto ours = [&] {
    auto h = [](const mx::array& a) { return mlxk::Array::from_mlx(a); };
    auto st = h(x.state);
    auto r = mlxk::gated_delta_update(h(x.q), h(x.k), h(x.v), h(x.a), h(x.b), h(x.a_log),
                                      h(x.dt_bias), &st);
    mx::eval({r.y.to_mlx(), r.state.to_mlx()});
  };
  auto fast = [&] {
    auto [g, beta] = gates(x);
    auto r = mx::fast::gated_delta_update(x.q, x.k, x.v, g, beta, x.state);
    mx::eval(r);
  };
  // The chunked (WY) form on the GPU: the prep, state and output kernels (kernels/metal/
  // gated_delta_chunked_*.metal), at the default chunk (32) and at 64.
  auto chunked = [&](int chunk) {
    return [&, chunk] {
      auto h = [](const mx::array& a) { return mlxk::Array::from_mlx(a); };
      auto st = h(x.state);
      auto r = mlxk::gated_delta_update_chunked(h(x.q), h(x.k), h(x.v), h(x.a), h(x.b),
                                                h(x.a_log), h(x.dt_bias), &st, nullptr, chunk);
      mx::eval({r.y.to_mlx(), r.state.to_mlx()});
    };
  };
  const double bytes = update_bytes(1, t);
  const bool slow = t > 4096;  // the exact kernel's time grows with T: fewer iterations
  const double o = time_us(ours, slow ? 1 : warmup, slow ? 3 : iters);
  row("prefill", name, "mlxkern", o, 1, bytes, 0);
  // MLXK_CHUNK_STATE_COLUMNS (a narrower state-pass tile than the library's choice) is read
  // once, when the library starts: a run with it set labels its chunked rows with the tile.
  const char* vt = std::getenv("MLXK_CHUNK_STATE_COLUMNS");
  const std::string tile = vt != nullptr && *vt != '\0' ? std::string(" VT=") + vt : "";
  // MLXK_BENCH_CHUNK=<C>: that chunk size alone (for a profiler).
  const char* only_chunk = std::getenv("MLXK_BENCH_CHUNK");
  for (int chunk : {32, 64}) {
    if (only_chunk != nullptr && std::atoi(only_chunk) != chunk) continue;
    const double c = time_us(chunked(chunk), warmup, iters);
    row("prefill", name, "mlxkern chunked C=" + std::to_string(chunk) + tile, c, 1, bytes, 0);
    std::printf("prefill  mlxkern / mlxkern chunked C=%d%s = %.2fx\n", chunk, tile.c_str(),
                o / c);
  }
  if (t > 4096) return;  // mx::fast (MLX CUDA's ops fallback) takes seconds there
  const double m = time_us(fast, 1, 3);
  row("prefill", name, "mlx fast", m, 1, bytes, 0);
  std::printf("prefill  mlx fast / mlxkern = %.1fx\n", m / o);
}

// Forward + backward of one layer over T tokens (B = 1), as a training step evaluates them:
// mlxkern's explicit backward (the GPU backward kernel) after its forward, against mx::vjp of
// mx::fast::gated_delta_update with the same gates (MLX CUDA: the ops fallback's VJP), with
// random cotangents. Peak memory is MLX's (mx::get_peak_memory, reset before each path).
void grad(int t, int warmup, int iters) {
  Layer x = layers(1, t).front();
  auto dy = normal({1, t, kHv, kD}, mx::bfloat16, 1.0f);
  auto ds = normal({1, kHv, kD, kD}, mx::float32, 0.5f);
  mx::eval({dy, ds});
  const std::string name = "fwd+bwd T=" + std::to_string(t) + " B=1 (1 layer)";
  auto h = [](const mx::array& a) { return mlxk::Array::from_mlx(a); };
  auto ours = [&] {
    auto st = h(x.state);
    auto dyh = h(dy), dsh = h(ds);
    auto r = mlxk::gated_delta_update(h(x.q), h(x.k), h(x.v), h(x.a), h(x.b), h(x.a_log),
                                      h(x.dt_bias), &st);
    auto g = mlxk::gated_delta_update_vjp(h(x.q), h(x.k), h(x.v), h(x.a), h(x.b), h(x.a_log),
                                          h(x.dt_bias), &st, nullptr, &dyh, &dsh);
    mx::eval({r.y.to_mlx(), r.state.to_mlx(), g.dq.to_mlx(), g.dk.to_mlx(), g.dv.to_mlx(),
              g.da.to_mlx(), g.db.to_mlx(), g.da_log.to_mlx(), g.dt_bias.to_mlx(),
              g.state.to_mlx()});
  };
  auto fast = [&] {
    auto fun = [&](const std::vector<mx::array>& p) {
      Layer y = x;
      y.a = p[3];
      y.b = p[4];
      y.a_log = p[5];
      y.dt_bias = p[6];
      auto [g, beta] = gates(y);
      return mx::fast::gated_delta_update(p[0], p[1], p[2], g, beta, p[7]);
    };
    auto [outs, grads] =
        mx::vjp(fun, {x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, x.state}, {dy, ds});
    outs.insert(outs.end(), grads.begin(), grads.end());
    mx::eval(outs);
  };
  mx::reset_peak_memory();
  const double o = time_us(ours, warmup, iters);
  const double o_peak = double(mx::get_peak_memory()) / (1 << 20);
  row("grad", name, "mlxkern", o, 1, 0, 0);
  mx::reset_peak_memory();
  const double m = time_us(fast, 1, 3);
  const double m_peak = double(mx::get_peak_memory()) / (1 << 20);
  row("grad", name, "mlx fast vjp", m, 1, 0, 0);
  std::printf("grad     T=%d mlx fast vjp / mlxkern = %.1fx; MLX peak memory %.0f MiB (mlxkern) "
              "vs %.0f MiB (mlx fast vjp)\n", t, m / o, o_peak, m_peak);
  if (json) {
    std::fprintf(json,
                 "{\"group\":\"grad_memory\",\"t\":%d,\"mlxkern_peak_mib\":%.1f,"
                 "\"mlx_fast_vjp_peak_mib\":%.1f}\n",
                 t, o_peak, m_peak);
  }
}

// Forward + backward of one layer over T tokens (B = 1) through the chunked form: the forward
// (mlxk_gated_delta_update_chunked where the GPU runs it, else mlxk_gated_delta_update: the
// row's label says which) and mlxk_gated_delta_update_chunked_vjp, whose GPU backward is the
// chunked kernels (kernels/metal/gated_delta_chunked_backward.metal). The backward's entry is
// looked up at run time: a library without it skips the row with a message.
void grad_chunked(int t, int warmup, int iters) {
  using ChunkedVjp = mlxk_status (*)(
      const mlxk_array*, const mlxk_array*, const mlxk_array*, const mlxk_array*,
      const mlxk_array*, const mlxk_array*, const mlxk_array*, const mlxk_array*,
      const mlxk_array*, int32_t, const mlxk_array*, const mlxk_array*, mlxk_array**,
      mlxk_array**, mlxk_array**, mlxk_array**, mlxk_array**, mlxk_array**, mlxk_array**,
      mlxk_array**);
  const auto vjp = reinterpret_cast<ChunkedVjp>(
      dlsym(RTLD_DEFAULT, "mlxk_gated_delta_update_chunked_vjp"));
  if (!vjp) {
    std::printf("grad     chunked T=%d: skipped (this library has no "
                "mlxk_gated_delta_update_chunked_vjp)\n", t);
    return;
  }
  Layer x = layers(1, t).front();
  auto dy = normal({1, t, kHv, kD}, mx::bfloat16, 1.0f);
  auto ds = normal({1, kHv, kD, kD}, mx::float32, 0.5f);
  mx::eval({dy, ds});
  auto h = [](const mx::array& a) { return mlxk::Array::from_mlx(a); };
  // Which forward runs on the GPU: the chunked one where the library allows it.
  bool chunked_forward = false;
  {
    auto st = h(x.state);
    mlxk_array *y = nullptr, *s = nullptr;
    chunked_forward = mlxk_gated_delta_update_chunked(
                          h(x.q).get(), h(x.k).get(), h(x.v).get(), h(x.a).get(), h(x.b).get(),
                          h(x.a_log).get(), h(x.dt_bias).get(), st.get(), nullptr, 0, &y,
                          &s) == MLXK_OK;
    mlxk::Array yy(y), ss(s);
  }
  const std::string name = "fwd+bwd chunked T=" + std::to_string(t) + " B=1 (1 layer, " +
                           (chunked_forward ? "chunked" : "exact") + " forward)";
  auto ours = [&] {
    auto st = h(x.state);
    auto dyh = h(dy), dsh = h(ds);
    auto q = h(x.q), k = h(x.k), v = h(x.v), a = h(x.a), b = h(x.b), a_log = h(x.a_log),
         dt_bias = h(x.dt_bias);
    mlxk_array *y = nullptr, *s = nullptr;
    const mlxk_status f =
        chunked_forward
            ? mlxk_gated_delta_update_chunked(q.get(), k.get(), v.get(), a.get(), b.get(),
                                              a_log.get(), dt_bias.get(), st.get(), nullptr, 0,
                                              &y, &s)
            : mlxk_gated_delta_update(q.get(), k.get(), v.get(), a.get(), b.get(), a_log.get(),
                                      dt_bias.get(), st.get(), nullptr, &y, &s);
    mlxk::Array yy(y), ss(s);
    if (f != MLXK_OK) throw std::runtime_error("the forward failed");
    mlxk_array* g[8] = {};
    const mlxk_status b_status =
        vjp(q.get(), k.get(), v.get(), a.get(), b.get(), a_log.get(), dt_bias.get(), st.get(),
            nullptr, 0, dyh.get(), dsh.get(), &g[0], &g[1], &g[2], &g[3], &g[4], &g[5], &g[6],
            &g[7]);
    std::vector<mlxk::Array> grads;
    for (auto* raw : g) grads.emplace_back(raw);
    if (b_status != MLXK_OK) {
      throw std::runtime_error("mlxk_gated_delta_update_chunked_vjp failed");
    }
    std::vector<mx::array> outs = {yy.to_mlx(), ss.to_mlx()};
    for (auto& gr : grads) outs.push_back(gr.to_mlx());
    mx::eval(outs);
  };
  // The backward passes alone (the forward's cost apart): the chunked kernels and the exact
  // backward kernel on the same inputs and cotangents.
  auto backward = [&](bool chunked) {
    auto st = h(x.state);
    auto dyh = h(dy), dsh = h(ds);
    auto q = h(x.q), k = h(x.k), v = h(x.v), a = h(x.a), b = h(x.b), a_log = h(x.a_log),
         dt_bias = h(x.dt_bias);
    mlxk_array* g[8] = {};
    const mlxk_status b_status =
        chunked ? vjp(q.get(), k.get(), v.get(), a.get(), b.get(), a_log.get(), dt_bias.get(),
                      st.get(), nullptr, 0, dyh.get(), dsh.get(), &g[0], &g[1], &g[2], &g[3],
                      &g[4], &g[5], &g[6], &g[7])
                : mlxk_gated_delta_update_vjp(q.get(), k.get(), v.get(), a.get(), b.get(),
                                              a_log.get(), dt_bias.get(), st.get(), nullptr,
                                              dyh.get(), dsh.get(), &g[0], &g[1], &g[2], &g[3],
                                              &g[4], &g[5], &g[6], &g[7]);
    std::vector<mlxk::Array> grads;
    for (auto* raw : g) grads.emplace_back(raw);
    if (b_status != MLXK_OK) throw std::runtime_error("a backward call failed");
    std::vector<mx::array> outs;
    for (auto& gr : grads) outs.push_back(gr.to_mlx());
    mx::eval(outs);
  };
  mx::reset_peak_memory();
  const double o = time_us(ours, warmup, iters);
  const double o_peak = double(mx::get_peak_memory()) / (1 << 20);
  row("grad", name, "mlxkern", o, 1, 0, 0);
  const double bc = time_us([&] { backward(true); }, warmup, iters);
  row("grad", "bwd chunked T=" + std::to_string(t) + " B=1 (1 layer)", "mlxkern", bc, 1, 0, 0);
  const double be = time_us([&] { backward(false); }, warmup, iters);
  row("grad", "bwd exact T=" + std::to_string(t) + " B=1 (1 layer)", "mlxkern", be, 1, 0, 0);
  std::printf("grad     chunked T=%d: forward + backward %.0f us (MLX peak memory %.0f MiB); "
              "backward alone: chunked %.0f us, exact %.0f us\n",
              t, o, o_peak, bc, be);
}

}  // namespace bench_cuda

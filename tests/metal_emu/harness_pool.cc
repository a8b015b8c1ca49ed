// The pool cases of the Metal-text emulation (launches.rs `Kind::Pool`): the recurrence and
// replay texts with MLXK_POOL, fed as src/ops/gated_delta/graph.rs feeds a pool node on a GPU
// (the pool as state_in, the row table as rows), against the CPU pool calls through the C ABI.
// The CPU returns the whole new pool; the kernel writes the written rows only, numbered 0..W-1
// in the order of the table (src/ops/gated_delta/pool.rs, then MLX's scatter puts row w into
// slot written[w]): row w must hold the bits of the CPU pool's slot written[w]. Where nothing
// is written the launch's one state row must stay as MLX leaves it (the 0xFF fill here).

#include "harness.h"

namespace harness {

namespace {

// src/ops/gated_delta/pool.rs `row_table` for a GPU launch (compact numbering), restated: per
// row (tok0, span, len, src, dst); `lengths`: the replay's accepted lengths (else all tokens).
// Returns the table [R, 5] and the written rows' slots in the order of their numbers.
Tensor row_table(const EmuCase& c, bool packed, const int32_t* lengths, bool writes,
                 std::vector<int32_t>* written) {
  const int64_t T = c.dims[1];
  Tensor table = make(MLXK_DTYPE_INT32, {c.n_slots, 5});
  for (int r = 0; r < c.n_slots; ++r) {
    const int32_t slot = c.slots[r];
    const int64_t tok0 = packed ? c.cu_seqlens[r] : r * T;
    const int64_t span = packed ? c.cu_seqlens[r + 1] - c.cu_seqlens[r] : T;
    const int64_t len = slot < 0 ? 0 : lengths != nullptr ? lengths[r] : span;
    const int64_t src = slot < 0 || c.fresh[r] != 0 ? -1 : slot;
    int64_t dst = -1;
    if (slot >= 0 && writes) {
      dst = static_cast<int64_t>(written->size());
      written->push_back(slot);
    }
    const int64_t row[5] = {tok0, span, len, src, dst};
    for (int i = 0; i < 5; ++i) table.set(5 * r + i, static_cast<float>(row[i]));
  }
  return table;
}

bool starts_with(const char* s, const char* prefix) {
  return std::strncmp(s, prefix, std::strlen(prefix)) == 0;
}

}  // namespace

Built build_pool(const EmuCase& c, Rng& rng) {
  const int64_t Hv = c.dims[3], Dk = c.dims[4], Dv = c.dims[5], T = c.dims[1];
  const bool verify = starts_with(c.kind, "pool_verify");
  const bool replay = std::strcmp(c.kind, "pool_replay") == 0;
  const bool packed = std::strcmp(c.kind, "pool_packed") == 0;
  const bool masked = c.masked != 0;
  if (c.n_slots < 1 || (packed && c.n_cu != c.n_slots + 1) ||
      (replay && c.n_lengths != c.n_slots)) {
    die("case %d: %d slots, %d offsets, %d lengths", c.id, c.n_slots, c.n_cu, c.n_lengths);
  }
  // q, k, v, the gates and the mask over the tensors' [B, T] (packed: [1, total_T]).
  RecurrenceDraw x = draw_recurrence(c, rng);
  if (masked && c.n_slots >= 2) {
    for (int64_t t = 0; t < T; ++t) x.mask.set(static_cast<size_t>(t), 0.0f);  // row 0: padding
  }
  const Tensor pool = random(rng, MLXK_DTYPE_FLOAT32, {c.pool_n, Hv, Dv, Dk}, -1.0f, 1.0f);
  Tensor g, beta;
  gates_for_kernel(c, x, &g, &beta);
  std::vector<int32_t> written;
  Tensor table = row_table(c, packed, replay ? c.lengths : nullptr, !verify, &written);

  Built out;
  if (!replay) out.inputs["q"] = x.q;
  out.inputs["k"] = x.k;
  out.inputs["v"] = x.v;
  out.inputs["g"] = g;
  out.inputs["beta"] = beta;
  out.inputs["state_in"] = pool;
  if (masked) out.inputs["mask"] = x.mask;
  out.inputs["rows"] = table;

  // The CPU pool call on the same draws.
  Handle hq(x.q), hk(x.k), hv(x.v), ha(x.a), hb(x.b), ha_log(x.a_log), hdt(x.dt_bias);
  Handle hpool(pool), hmask;  // hmask: NULL when unmasked
  if (masked) {
    std::vector<int32_t> shape(x.mask.shape.begin(), x.mask.shape.end());
    check(mlxk_array_new(x.mask.bytes.data(), shape.data(), shape.size(), x.mask.dtype, &hmask.a),
          "mlxk_array_new");
  }
  std::vector<uint8_t> fresh(c.fresh, c.fresh + c.n_slots);
  const size_t n = static_cast<size_t>(c.n_slots);
  Handle y, new_pool;
  if (replay) {
    check(mlxk_gated_delta_state_pool(hk.a, hv.a, ha.a, hb.a, ha_log.a, hdt.a, hpool.a, c.slots,
                                      fresh.data(), c.lengths, n, &new_pool.a),
          "mlxk_gated_delta_state_pool");
  } else if (packed) {
    check(mlxk_gated_delta_update_packed(hq.a, hk.a, hv.a, ha.a, hb.a, ha_log.a, hdt.a, hpool.a,
                                         c.cu_seqlens, static_cast<size_t>(c.n_cu), c.slots,
                                         fresh.data(), &y.a, &new_pool.a),
          "mlxk_gated_delta_update_packed");
  } else if (verify) {
    check(mlxk_gated_delta_verify_pool(hq.a, hk.a, hv.a, ha.a, hb.a, ha_log.a, hdt.a, hpool.a,
                                       c.slots, fresh.data(), n, hmask.a, &y.a),
          "mlxk_gated_delta_verify_pool");
  } else {
    check(mlxk_gated_delta_update_pool(hq.a, hk.a, hv.a, ha.a, hb.a, ha_log.a, hdt.a, hpool.a,
                                       c.slots, fresh.data(), n, hmask.a, &y.a, &new_pool.a),
          "mlxk_gated_delta_update_pool");
  }
  if (!replay) out.expected["y"] = y.read();
  // The state output: row w holds the CPU pool's slot written[w]; with no row written, its one
  // row keeps the fill (0xFF bytes, NaN: compared as a class, any value written differs).
  const int64_t W = static_cast<int64_t>(written.size());
  Tensor state = make(MLXK_DTYPE_FLOAT32, {std::max<int64_t>(W, 1), Hv, Dv, Dk}, W ? 0 : 0xFF);
  if (W > 0) {
    const Tensor cpu_pool = new_pool.read();
    const size_t row = static_cast<size_t>(Hv * Dv * Dk) * sizeof(float);
    for (int64_t w = 0; w < W; ++w) {
      std::memcpy(state.bytes.data() + w * row, cpu_pool.bytes.data() + written[w] * row, row);
    }
  }
  out.expected["state_out"] = state;
  return out;
}

}  // namespace harness

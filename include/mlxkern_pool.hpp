/*
 * mlxkern_pool.hpp: the C++17 layer over mlxkern.h's calls on a pool of recurrent states
 * (mlxk_gated_delta_update_pool and the calls after it), in the style of mlxkern.hpp, which
 * includes this file (including either one gives both).
 *
 * Engines keep every sequence's state in one pool [N, Hv, Dv, Dk] float32 and name each batch
 * row's (or packed sequence's) state by slot. Slots, fresh flags, offsets and accepted lengths
 * are host integers read during the call. A negative slot is a padding row (y zeros, nothing
 * read or written); two rows may not name one slot. `fresh` (std::nullopt: none) holds one flag
 * per slot: nonzero starts that row from zeros (its slot is then written).
 *
 * In place: assign the returned pool over the old Array before evaluating it; the old handle
 * is freed and the CPU kernel writes the named states into the pool's buffer (B states read
 * and written, never N):
 *
 *   mlxk::PoolUpdate step = mlxk::gated_delta_update_pool(q, k, v, a, b, a_log, dt_bias, pool,
 *                                                         slots, fresh);
 *   pool = std::move(step.pool);
 *   std::vector<float> y = step.y.to_floats();
 *
 * A host array shorter or longer than the slots throws Error (MLXK_ERR_INVALID_ARGUMENT) here,
 * before the library reads it.
 */

#ifndef MLXKERN_POOL_HPP
#define MLXKERN_POOL_HPP

#include "mlxkern.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace mlxk {

/** The results of a pool update. */
struct PoolUpdate {
  Array y;     ///< [B, T, Hv, Dv] ([1, total_T, Hv, Dv] when packed) in q's dtype
  Array pool;  ///< [N, Hv, Dv, Dk] float32: the named slots replaced, every other kept
};

/** One flag per slot (nonzero: the row starts from zeros), or std::nullopt: none fresh. */
using FreshFlags = std::optional<Span<std::uint8_t>>;

namespace detail {

/** The library reads one value per slot from each per-slot host array: check the count first. */
inline void check_per_slot(std::size_t values, std::size_t slots, const char *function,
                           const char *name) {
  if (values != slots) {
    throw Error(MLXK_ERR_INVALID_ARGUMENT,
                std::string(function) + ": " + name + ": " + std::to_string(values) +
                    " values for " + std::to_string(slots) + " slots; expected one per slot");
  }
}

/** The fresh flags to pass (NULL for none), checked against the slot count. */
inline const std::uint8_t *fresh_flags(const FreshFlags &fresh, std::size_t slots,
                                       const char *function) {
  if (!fresh) {
    return nullptr;
  }
  check_per_slot(fresh->size(), slots, function, "fresh");
  return fresh->data();
}

/** A packed call reads cu_seqlens.size() - 1 slots: check that the caller gave that many. */
inline void check_packed_slots(Span<std::int32_t> cu_seqlens, Span<std::int32_t> slots,
                               const char *function) {
  if (cu_seqlens.size() != 0 && slots.size() != cu_seqlens.size() - 1) {
    throw Error(MLXK_ERR_INVALID_ARGUMENT,
                std::string(function) + ": slots: " + std::to_string(slots.size()) +
                    " slots for " + std::to_string(cu_seqlens.size() - 1) +
                    " sequences (cu_seqlens holds N + 1 offsets); expected one per sequence");
  }
}

}  // namespace detail

/** gated_delta_update on a pool: row b starts from pool[slots[b]] (zeros where fresh) and its
 * final state goes back there; bit for bit gathering the rows, gated_delta_update and
 * scattering the states back. q ... dt_bias and mask as gated_delta_update; one slot per batch
 * row. */
[[nodiscard]] inline PoolUpdate gated_delta_update_pool(
    const Array &q, const Array &k, const Array &v, const Array &a, const Array &b,
    const Array &a_log, const Array &dt_bias, const Array &pool, Span<std::int32_t> slots,
    const FreshFlags &fresh = std::nullopt, const Array *mask = nullptr) {
  const std::uint8_t *flags =
      detail::fresh_flags(fresh, slots.size(), "gated_delta_update_pool");
  PoolUpdate r;
  check(mlxk_gated_delta_update_pool(q.get(), k.get(), v.get(), a.get(), b.get(), a_log.get(),
                                     dt_bias.get(), pool.get(), slots.data(), flags,
                                     slots.size(), detail::optional_handle(mask),
                                     OutHandle(r.y), OutHandle(r.pool)));
  return r;
}

/** gated_delta_update_pool in the chunked (WY) form (`chunk_size` as in
 * gated_delta_update_chunked): each row's results equal gated_delta_update_chunked's on the
 * gathered rows, bit for bit, on the CPU and on the GPU. */
[[nodiscard]] inline PoolUpdate gated_delta_update_pool_chunked(
    const Array &q, const Array &k, const Array &v, const Array &a, const Array &b,
    const Array &a_log, const Array &dt_bias, const Array &pool, Span<std::int32_t> slots,
    const FreshFlags &fresh = std::nullopt, const Array *mask = nullptr,
    std::int32_t chunk_size = 0) {
  const std::uint8_t *flags =
      detail::fresh_flags(fresh, slots.size(), "gated_delta_update_pool_chunked");
  PoolUpdate r;
  check(mlxk_gated_delta_update_pool_chunked(
      q.get(), k.get(), v.get(), a.get(), b.get(), a_log.get(), dt_bias.get(), pool.get(),
      slots.data(), flags, slots.size(), detail::optional_handle(mask), chunk_size,
      OutHandle(r.y), OutHandle(r.pool)));
  return r;
}

/** Speculative verify on a pool: gated_delta_update_pool's y over each row's draft window
 * (bit for bit), reading the pool and writing no state. Commit each row's accepted prefix
 * with gated_delta_state_pool on the same k, v and gates. */
[[nodiscard]] inline Array gated_delta_verify_pool(const Array &q, const Array &k, const Array &v,
                                                   const Array &a, const Array &b,
                                                   const Array &a_log, const Array &dt_bias,
                                                   const Array &pool, Span<std::int32_t> slots,
                                                   const FreshFlags &fresh = std::nullopt,
                                                   const Array *mask = nullptr) {
  const std::uint8_t *flags =
      detail::fresh_flags(fresh, slots.size(), "gated_delta_verify_pool");
  Array y;
  check(mlxk_gated_delta_verify_pool(q.get(), k.get(), v.get(), a.get(), b.get(), a_log.get(),
                                     dt_bias.get(), pool.get(), slots.data(), flags,
                                     slots.size(), detail::optional_handle(mask), OutHandle(y)));
  return y;
}

/** Packed variable-length prefill on a pool: q, k [1, total_T, Hk, Dk], v [1, total_T, Hv, Dv],
 * a, b [1, total_T, Hv], the sequences one after another; sequence i owns tokens
 * [cu_seqlens[i], cu_seqlens[i + 1]) (N + 1 offsets: 0, then each end; zero-length sequences
 * allowed) and slot slots[i]. Each sequence's y and state equal one gated_delta_update on it
 * alone, bit for bit. No mask. */
[[nodiscard]] inline PoolUpdate gated_delta_update_packed(
    const Array &q, const Array &k, const Array &v, const Array &a, const Array &b,
    const Array &a_log, const Array &dt_bias, const Array &pool, Span<std::int32_t> cu_seqlens,
    Span<std::int32_t> slots, const FreshFlags &fresh = std::nullopt) {
  detail::check_packed_slots(cu_seqlens, slots, "gated_delta_update_packed");
  const std::uint8_t *flags =
      detail::fresh_flags(fresh, slots.size(), "gated_delta_update_packed");
  PoolUpdate r;
  check(mlxk_gated_delta_update_packed(q.get(), k.get(), v.get(), a.get(), b.get(), a_log.get(),
                                       dt_bias.get(), pool.get(), cu_seqlens.data(),
                                       cu_seqlens.size(), slots.data(), flags, OutHandle(r.y),
                                       OutHandle(r.pool)));
  return r;
}

/** gated_delta_update_packed in the chunked (WY) form (`chunk_size` as in
 * gated_delta_update_chunked): each sequence's results equal gated_delta_update_chunked's on
 * it alone, bit for bit, on the CPU and on the GPU. */
[[nodiscard]] inline PoolUpdate gated_delta_update_packed_chunked(
    const Array &q, const Array &k, const Array &v, const Array &a, const Array &b,
    const Array &a_log, const Array &dt_bias, const Array &pool, Span<std::int32_t> cu_seqlens,
    Span<std::int32_t> slots, const FreshFlags &fresh = std::nullopt,
    std::int32_t chunk_size = 0) {
  detail::check_packed_slots(cu_seqlens, slots, "gated_delta_update_packed_chunked");
  const std::uint8_t *flags =
      detail::fresh_flags(fresh, slots.size(), "gated_delta_update_packed_chunked");
  PoolUpdate r;
  check(mlxk_gated_delta_update_packed_chunked(
      q.get(), k.get(), v.get(), a.get(), b.get(), a_log.get(), dt_bias.get(), pool.get(),
      cu_seqlens.data(), cu_seqlens.size(), slots.data(), flags, chunk_size, OutHandle(r.y),
      OutHandle(r.pool)));
  return r;
}

/** The commit after a speculative verify on a pool (gated_delta_state on a pool): row b
 * replays its first accepted_lengths[b] tokens of the window from pool[slots[b]] (zeros where
 * fresh) and writes the state back into that slot; bit for bit gated_delta_state on the
 * gathered rows, scattered back. A length of 0 leaves the slot as it was (a fresh one becomes
 * zeros). Returns the new pool (in place under the rule above). */
[[nodiscard]] inline Array gated_delta_state_pool(const Array &k, const Array &v, const Array &a,
                                                  const Array &b, const Array &a_log,
                                                  const Array &dt_bias, const Array &pool,
                                                  Span<std::int32_t> slots,
                                                  Span<std::int32_t> accepted_lengths,
                                                  const FreshFlags &fresh = std::nullopt) {
  const char *function = "gated_delta_state_pool";
  detail::check_per_slot(accepted_lengths.size(), slots.size(), function, "accepted_lengths");
  const std::uint8_t *flags = detail::fresh_flags(fresh, slots.size(), function);
  Array pool_out;
  check(mlxk_gated_delta_state_pool(k.get(), v.get(), a.get(), b.get(), a_log.get(),
                                    dt_bias.get(), pool.get(), slots.data(), flags,
                                    accepted_lengths.data(),
                                    slots.size(), OutHandle(pool_out)));
  return pool_out;
}

/** gated_delta_update_from_conv on a pool: the head split of the convolution's output x, then
 * gated_delta_update_pool on its q, k and v (bit for bit those two calls). x ... eps as
 * silu_rms_heads; a ... dt_bias and mask as gated_delta_update; one slot per batch row. */
[[nodiscard]] inline PoolUpdate gated_delta_update_from_conv_pool(
    const Array &x, const Array &q_scale, const Array &k_scale, std::int32_t key_heads,
    std::int32_t value_heads, std::int32_t value_width, float eps, const Array &a,
    const Array &b, const Array &a_log, const Array &dt_bias, const Array &pool,
    Span<std::int32_t> slots, const FreshFlags &fresh = std::nullopt,
    const Array *mask = nullptr) {
  const std::uint8_t *flags =
      detail::fresh_flags(fresh, slots.size(), "gated_delta_update_from_conv_pool");
  PoolUpdate r;
  check(mlxk_gated_delta_update_from_conv_pool(
      x.get(), q_scale.get(), k_scale.get(), key_heads, value_heads, value_width, eps, a.get(),
      b.get(), a_log.get(), dt_bias.get(), pool.get(), slots.data(), flags, slots.size(),
      detail::optional_handle(mask), OutHandle(r.y), OutHandle(r.pool)));
  return r;
}

}  // namespace mlxk

#endif  // MLXKERN_POOL_HPP

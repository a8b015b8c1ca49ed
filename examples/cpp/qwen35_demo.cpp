// The engine layer demo (`make demo`, after the C demo): one Qwen3.5-35B-A3B Gated DeltaNet
// layer (qwen35_gdn.hpp: MLX ops for the projections, conv and out_proj, mlxkern's kernels for
// the rest, one graph and one mx::eval per step) with random weights, batch 1:
//
//   1. a prefill (exact recurrence), then the same prompt through a fresh layer with the chunked
//      recurrence (the CPU's faster prefill), and how far apart their states land;
//   2. decode steps, one token and one eval each;
//   3. a speculative step: a draft window is verified, 2 of its 4 tokens are accepted and the
//      states are rolled back by prefix replay, all in one graph and one eval; then checked
//      against a layer that only ever saw the accepted tokens.
//
//   qwen35_demo [PREFILL_TOKENS [DECODE_STEPS]]      (default 64 and 16)
//
// Timings are wall-clock on whatever runs it; on the CPU MLX's bfloat16 matmul dominates them.
#include "qwen35_gdn.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

namespace {

namespace mx = mlx::core;

double seconds_since(std::chrono::steady_clock::time_point from) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - from).count();
}

// max |a - b| / max |b| (float32).
float relative_diff(const mx::array &a, const mx::array &b) {
  const mx::array fa = mx::astype(a, mx::float32), fb = mx::astype(b, mx::float32);
  const mx::array d = mx::max(mx::abs(mx::subtract(fa, fb)));
  const mx::array m = mx::max(mx::abs(fb));
  mx::eval({d, m});
  return m.item<float>() > 0 ? d.item<float>() / m.item<float>() : d.item<float>();
}

bool identical(const mx::array &a, const mx::array &b) {
  return mx::array_equal(a, b).item<bool>();
}

int run(int argc, char **argv) {
  const int prefill = argc > 1 ? std::atoi(argv[1]) : 64;
  const int decode = argc > 2 ? std::atoi(argv[2]) : 16;
  if (prefill < 1 || decode < 1) {
    std::fprintf(stderr, "usage: %s [PREFILL_TOKENS [DECODE_STEPS]]\n", argv[0]);
    return 2;
  }
  mlxk::check_abi();
  const qwen35::Config config = qwen35::Config::qwen35_35b_a3b();
  const int hidden = config.hidden_size;
  std::printf("engine layer demo: mlxkern %s on MLX %s; Qwen3.5-35B-A3B Gated DeltaNet layer "
              "(hidden %d, Hk %d, Hv %d, Dk = Dv = %d, K %d), random bfloat16 weights, B = 1\n",
              mlxk::version().c_str(), mlxk_mlx_version(), hidden, config.key_heads,
              config.value_heads, config.key_dim, config.conv_kernel);
  std::printf("  per step: MLX matmul x4 + concatenate + conv1d -> "
              "mlxk_gated_delta_update_from_conv (head split + recurrence) -> "
              "mlxk_gated_rms_norm -> MLX matmul; one mx::eval; 0 bytes copied between MLX "
              "and mlxkern\n");

  const qwen35::Weights weights = qwen35::Weights::random(config, 20250601);
  const int drafts = 4, accepted = 2;
  const int total = prefill + decode + drafts;
  const mx::array stream = mx::astype(
      mx::random::normal({1, total, hidden}, mx::float32, mx::random::key(7)), mx::bfloat16);
  mx::eval(stream);
  auto tokens = [&](int from, int count) {
    return mx::slice(stream, {0, from, 0}, {1, from + count, hidden});
  };

  // 1. Prefill, exact and chunked.
  qwen35::GatedDeltaNet layer(config, weights);
  auto start = std::chrono::steady_clock::now();
  mx::array out = layer.forward(tokens(0, prefill));
  mx::eval(layer.step_outputs(out));
  double s = seconds_since(start);
  std::printf("  prefill %4d tokens, exact recurrence:   %8.1f ms, %7.1f tokens/s (1 eval)\n",
              prefill, 1e3 * s, prefill / s);
  qwen35::GatedDeltaNet chunked(config, weights);
  start = std::chrono::steady_clock::now();
  mx::array out_chunked = chunked.forward(tokens(0, prefill), qwen35::Recurrence::Chunked);
  mx::eval(chunked.step_outputs(out_chunked));
  s = seconds_since(start);
  std::printf("  prefill %4d tokens, chunked recurrence: %8.1f ms, %7.1f tokens/s (1 eval); "
              "state within %.1e of the exact one's scale\n",
              prefill, 1e3 * s, prefill / s, relative_diff(chunked.state(), layer.state()));

  // 2. Decode.
  start = std::chrono::steady_clock::now();
  for (int t = 0; t < decode; ++t) {
    out = layer.forward(tokens(prefill + t, 1));
    mx::eval(layer.step_outputs(out));
  }
  s = seconds_since(start);
  std::printf("  decode  %4d steps:                      %8.2f ms/step, %6.1f tokens/s "
              "(1 eval per step)\n",
              decode, 1e3 * s / decode, decode / s);

  // 3. Speculative step: verify 4 drafts, accept 2, roll back (lazy: the replay joins the
  //    verify's graph; an engine may as well leave it to the next step's eval).
  const int at = prefill + decode;
  qwen35::GatedDeltaNet reference(config, weights);  // sees the accepted tokens only
  mx::array ref_out = reference.forward(tokens(0, at + accepted));
  mx::eval(reference.step_outputs(ref_out));
  start = std::chrono::steady_clock::now();
  mx::array verified = layer.verify(tokens(at, drafts));
  layer.accept(accepted);
  mx::eval(layer.step_outputs(verified));
  s = seconds_since(start);
  const bool state_same = identical(layer.state(), reference.state());
  const bool conv_same = identical(layer.conv_state(), reference.conv_state());
  std::printf("  verify  %4d drafts, accept %d, roll back: %7.1f ms (1 eval); recurrent state %s, "
              "conv state %s (against a layer that saw only the accepted tokens)\n",
              drafts, accepted, 1e3 * s, state_same ? "bit-identical" : "DIFFERS",
              conv_same ? "bit-identical" : "DIFFERS");
  return state_same && conv_same ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
  try {
    return run(argc, argv);
  } catch (const mlxk::Error &error) {
    std::fprintf(stderr, "qwen35_demo: mlxkern error %s: %s\n", error.status_name(),
                 error.message().c_str());
  } catch (const std::exception &error) {
    std::fprintf(stderr, "qwen35_demo: %s\n", error.what());
  }
  return 2;
}

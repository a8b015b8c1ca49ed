//! The reductions of the Metal kernels, in their exact order.

/// `simd_sum` over 32 lane partials as the xor butterfly computes it: at offsets 1, 2, 4, 8, 16
/// each lane adds its partner's value. Float addition is commutative, so every lane ends with
/// the same value, which is this pairwise tree over neighbouring lanes.
#[inline(always)]
pub fn simd_sum(partials: &[f32; 32]) -> f32 {
    let mut w = *partials;
    let mut width = 32;
    while width > 1 {
        width /= 2;
        for j in 0..width {
            w[j] = w[2 * j] + w[2 * j + 1];
        }
    }
    w[0]
}

/// The eight partial sums of a dot product, added in order: the last step of the backward
/// pass's dot products on every path (portable and AVX2), so they give the same bits.
#[inline(always)]
pub fn sum_lanes(lanes: [f32; 8]) -> f32 {
    lanes.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The butterfly written literally, lane by lane, as the hardware's shuffles do it.
    fn butterfly(p: &[f32; 32]) -> [f32; 32] {
        let mut x = *p;
        for offset in [1, 2, 4, 8, 16] {
            let before = x;
            for lane in 0..32 {
                x[lane] = before[lane] + before[lane ^ offset];
            }
        }
        x
    }

    #[test]
    fn tree_equals_lane_butterfly_on_every_lane() {
        let mut seed = 0x9E3779B97F4A7C15u64;
        for _ in 0..2000 {
            let mut p = [0f32; 32];
            for v in p.iter_mut() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let mag = ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0;
                let scale = [1e-3f32, 1.0, 1e3][(seed % 3) as usize];
                *v = mag * scale;
            }
            let lanes = butterfly(&p);
            let tree = simd_sum(&p);
            for lane in lanes {
                assert_eq!(lane.to_bits(), tree.to_bits());
            }
        }
    }
}

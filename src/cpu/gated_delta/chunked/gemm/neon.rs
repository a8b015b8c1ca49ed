//! The product kernel with NEON (arm64): tiles of up to `MR` rows × 16 columns, four 4-wide
//! accumulators a row (24 of the 32 vector registers); per step four loads of B and one
//! broadcast of A per row, each multiplied in by `fmla` by element. Per element the chain and
//! the epilogue of the AVX2 and AVX-512 kernels: one fused multiply-add a step, in order from
//! +0 (a triangular A's steps up to the diagonal only), then `rs ·` and `c_scale · C +`
//! (fused). So a product has the bits the x86 kernels give it.

#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::aarch64::*;

use super::*;

pub struct Neon;

/// One R×16 register tile (`block.m` = R rows): 4·R accumulators. `TRI` as `block.tri` (A
/// read by rows).
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn tile<const R: usize, const TRI: bool>(block: Product) {
    let (kc, a, a_rs, a_cs, b, b_rs) = (
        block.kc, block.a, block.a_rs, block.a_cs, block.b, block.b_rs,
    );
    let (c, c_rs, epi) = (block.c, block.c_rs, block.epi);
    let mut acc = [[vdupq_n_f32(0.0); 4]; R];
    let mut bp = b;
    debug_assert!(!TRI || a_cs == 1);
    if a_rs == 1 {
        // A by columns: step p's R values are consecutive, a column apart per step.
        let mut ap = a;
        for _ in 0..kc {
            let bq = [0, 4, 8, 12].map(|o| vld1q_f32(bp.add(o)));
            for r in 0..R {
                let x = *ap.add(r);
                for q in 0..4 {
                    acc[r][q] = vfmaq_n_f32(acc[r][q], bq[q], x);
                }
            }
            ap = ap.add(a_cs);
            bp = bp.add(b_rs);
        }
    } else {
        debug_assert_eq!(a_cs, 1);
        let rows: [*const f32; R] = std::array::from_fn(|r| a.add(r * a_rs));
        for p in 0..kc {
            let bq = [0, 4, 8, 12].map(|o| vld1q_f32(bp.add(o)));
            for r in 0..R {
                let x = *rows[r].add(p);
                for q in 0..4 {
                    acc[r][q] = vfmaq_n_f32(acc[r][q], bq[q], x);
                }
            }
            bp = bp.add(b_rs);
        }
        if TRI {
            // Step kc - 1 + j reaches rows j.. of the block (rows before j: A's zero above the
            // diagonal, never multiplied in).
            for j in 1..R {
                let p = kc - 1 + j;
                let bq = [0, 4, 8, 12].map(|o| vld1q_f32(b.add(p * b_rs + o)));
                for r in j..R {
                    let x = *rows[r].add(p);
                    for q in 0..4 {
                        acc[r][q] = vfmaq_n_f32(acc[r][q], bq[q], x);
                    }
                }
            }
        }
    }
    for r in 0..R {
        let cp = c.add(r * c_rs);
        let mut x = acc[r];
        if !epi.rs.is_null() {
            let rs = *epi.rs.add(r);
            x = x.map(|v| vmulq_n_f32(v, rs));
        }
        for q in 0..4 {
            if epi.load {
                // c_scale · C + x, fused.
                x[q] = vfmaq_n_f32(x[q], vld1q_f32(cp.add(4 * q)), epi.c_scale);
            }
            vst1q_f32(cp.add(4 * q), x[q]);
        }
    }
}

/// `tile` of a product that is not triangular.
#[inline(always)]
unsafe fn tile_full<const R: usize>(block: Product) {
    tile::<R, false>(block)
}

/// `tile` of a triangular product.
#[inline(always)]
unsafe fn tile_tri<const R: usize>(block: Product) {
    tile::<R, true>(block)
}

impl Kernel for Neon {
    const PANELS: usize = 1;

    #[inline(always)]
    unsafe fn gemm(p: Product) {
        for q in 0..p.panels {
            blocks(p.panel(q), |block| match block.tri {
                false => dispatch_rows!(block.m, tile_full, block),
                true => dispatch_rows!(block.m, tile_tri, block),
            })
        }
    }

    /// In 4×4 blocks: four row loads, the register transpose (`trn` of lanes, then of
    /// pairs), four row stores.
    #[inline(always)]
    unsafe fn transpose(
        src: *const f32,
        src_rs: usize,
        dst: *mut f32,
        dst_rs: usize,
        rows: usize,
        cols: usize,
    ) {
        for r0 in (0..rows).step_by(4) {
            for c0 in (0..cols).step_by(4) {
                let x: [float32x4_t; 4] =
                    std::array::from_fn(|i| vld1q_f32(src.add((r0 + i) * src_rs + c0)));
                let t0 = vtrn1q_f32(x[0], x[1]);
                let t1 = vtrn2q_f32(x[0], x[1]);
                let t2 = vtrn1q_f32(x[2], x[3]);
                let t3 = vtrn2q_f32(x[2], x[3]);
                let pairs = |a: float32x4_t, b: float32x4_t, high: bool| {
                    let (a, b) = (vreinterpretq_f64_f32(a), vreinterpretq_f64_f32(b));
                    vreinterpretq_f32_f64(if high {
                        vtrn2q_f64(a, b)
                    } else {
                        vtrn1q_f64(a, b)
                    })
                };
                let y = [
                    pairs(t0, t2, false),
                    pairs(t1, t3, false),
                    pairs(t0, t2, true),
                    pairs(t1, t3, true),
                ];
                for (i, y) in y.into_iter().enumerate() {
                    vst1q_f32(dst.add((c0 + i) * dst_rs + r0), y);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The kernel against its model, bit for bit: each element one `f32::mul_add` chain over
    //! the steps in order from +0, then `rs ·` and `c_scale · C +` fused.

    use super::*;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f32 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn model(
        m: usize,
        kc: usize,
        tri: bool,
        a: &[f32],
        (a_rs, a_cs): (usize, usize),
        b: &[f32],
        b_rs: usize,
        c: &mut [f32],
        c_rs: usize,
        epi: (bool, f32, Option<&[f32]>),
    ) {
        for r in 0..m {
            for j in 0..NR {
                let steps = if tri { (r + 1).min(kc) } else { kc };
                let mut acc = 0f32;
                for p in 0..steps {
                    acc = a[r * a_rs + p * a_cs].mul_add(b[p * b_rs + j], acc);
                }
                let x = match epi.2 {
                    Some(rs) => acc * rs[r],
                    None => acc,
                };
                let at = r * c_rs + j;
                c[at] = if epi.0 { c[at].mul_add(epi.1, x) } else { x };
            }
        }
    }

    #[test]
    fn products_match_their_fused_model_bit_for_bit() {
        let mut rng = Rng(0x1234_5678_9ABC_DEF1);
        let mut cases = 0;
        for m in [1, 2, 3, 5, 6, 7, 9, 13, 16, 32] {
            for kc in [1, 3, 16, 33] {
                for tri in [false, true] {
                    if tri && kc < m {
                        continue;
                    }
                    for by_rows in [false, true] {
                        if tri && !by_rows {
                            continue;
                        }
                        for (load, with_rs) in [(false, false), (true, false), (true, true)] {
                            let (a_rs, a_cs) = if by_rows { (kc + 3, 1) } else { (1, m + 2) };
                            let a: Vec<f32> = (0..m * (kc + 3) + kc * (m + 2))
                                .map(|_| rng.next())
                                .collect();
                            let b_rs = 2 * NR + 5;
                            let b: Vec<f32> = (0..kc * b_rs + 2 * NR).map(|_| rng.next()).collect();
                            let c_rs = 2 * NR + 3;
                            let c0: Vec<f32> = (0..m * c_rs + 2 * NR).map(|_| rng.next()).collect();
                            let rs: Vec<f32> = (0..m).map(|_| rng.next() * 4.0).collect();
                            let c_scale = rng.next() * 2.0;
                            let mut got = c0.clone();
                            let epi = Epi {
                                load,
                                c_scale,
                                rs: if with_rs {
                                    rs.as_ptr()
                                } else {
                                    std::ptr::null()
                                },
                            };
                            // Two panels: B and C 16 columns on.
                            let product = Product {
                                m,
                                kc,
                                tri,
                                a: a.as_ptr(),
                                a_rs,
                                a_cs,
                                b: b.as_ptr(),
                                b_rs,
                                c: got.as_mut_ptr(),
                                c_rs,
                                panels: 2,
                                b_ps: NR,
                                c_ps: NR,
                                epi,
                            };
                            // SAFETY: the buffers hold every row, step and panel addressed.
                            unsafe { Neon::gemm(product) };
                            let mut want = c0.clone();
                            let rs = with_rs.then_some(&rs[..]);
                            for q in 0..2 {
                                let (bq, cq) = (&b[q * NR..], &mut want[q * NR..]);
                                let strides = (a_rs, a_cs);
                                model(
                                    m,
                                    kc,
                                    tri,
                                    &a,
                                    strides,
                                    bq,
                                    b_rs,
                                    cq,
                                    c_rs,
                                    (load, c_scale, rs),
                                );
                            }
                            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                                assert_eq!(
                                    g.to_bits(),
                                    w.to_bits(),
                                    "m {m} kc {kc} tri {tri} by rows {by_rows} load {load} rs \
                                     {with_rs}: element {i}: {g:e} vs {w:e}"
                                );
                            }
                            cases += 1;
                        }
                    }
                }
            }
        }
        assert!(cases > 100);
    }

    #[test]
    fn transpose_moves_every_value() {
        let mut rng = Rng(99);
        for (rows, cols) in [(8, 8), (16, 8), (8, 24), (32, 128)] {
            let (src_rs, dst_rs) = (cols + 4, rows + 8);
            let src: Vec<f32> = (0..rows * src_rs).map(|_| rng.next()).collect();
            let mut dst = vec![0f32; cols * dst_rs];
            // SAFETY: both buffers hold the rows and columns addressed.
            unsafe { Neon::transpose(src.as_ptr(), src_rs, dst.as_mut_ptr(), dst_rs, rows, cols) };
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(dst[c * dst_rs + r].to_bits(), src[r * src_rs + c].to_bits());
                }
            }
        }
    }
}

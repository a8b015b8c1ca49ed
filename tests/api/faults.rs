//! Faults lose nothing through the safe API (docs/serving.md, "Faults"): each pool call, its
//! pool kept or dropped before the evaluation (donated), its node failing at its evaluation or
//! in its task (`testing::fail_cpu_kernel`, this thread's evaluations only), the head split
//! before it failing first: the failed call's new pool holds the pool as given bit for bit,
//! its y reports the failure, and the same call then gives a never-failed call's results.

use crate::support::pool::{PoolCall as Call, POOL_CALLS as CALLS};
use crate::support::*;
use mlxkern::testing::{cpu_kernel_fault_pending, fail_cpu_kernel, Fault};
use mlxkern::{
    Array, Dtype, Error, GatedDelta, GatedDeltaFromConv, PoolSlots, SiluRmsHeads, StateReplay,
};

/// One call's inputs as safe arrays: B rows of T tokens (dense and packed), the head split's
/// inputs, a pool of N random states, slots with a padding row, fresh flags, accepted lengths.
struct Case {
    dense: [Array; 7],
    packed: [Array; 5],
    conv: [Array; 3],
    heads: [usize; 3],
    pool0: Vec<f32>,
    pool_shape: [usize; 4],
    slots: Vec<i32>,
    fresh: Vec<bool>,
    accepted: Vec<usize>,
    cu: Vec<usize>,
}

impl Case {
    fn random(rng: &mut Rng, [b, t, hk, hv, dk, dv]: [usize; 6]) -> Case {
        let f32s = |rng: &mut Rng, n: usize, scale: f32| rng.vec(n, scale);
        let arr = |data: &[f32], shape: &[usize], dtype: Dtype| {
            Array::from_slice(data, shape)
                .and_then(|a| a.astype(dtype))
                .unwrap()
        };
        let (q, k) = (
            heads(rng, b * t * hk * dk, dk, (dk as f32).powf(-0.5)),
            heads(rng, b * t * hk * dk, dk, 1.0),
        );
        let (v, a, bb) = (
            f32s(rng, b * t * hv * dv, 1.0),
            f32s(rng, b * t * hv, 2.0),
            f32s(rng, b * t * hv, 2.0),
        );
        let (a_log, dt_bias) = (f32s(rng, hv, 1.0), f32s(rng, hv, 1.0));
        let per_token = |rows: usize, tokens: usize| {
            [
                arr(&q, &[rows, tokens, hk, dk], Dtype::Bfloat16),
                arr(&k, &[rows, tokens, hk, dk], Dtype::Bfloat16),
                arr(&v, &[rows, tokens, hv, dv], Dtype::Bfloat16),
                arr(&a, &[rows, tokens, hv], Dtype::Bfloat16),
                arr(&bb, &[rows, tokens, hv], Dtype::Float32),
            ]
        };
        let [dq, dk_, dv_, da, db] = per_token(b, t);
        let c = 2 * hk * dk + hv * dv;
        let n = b + 2;
        let mut slots: Vec<i32> = (0..b as i32).map(|s| s + 1).collect();
        slots[rng.below(b as u64) as usize] = -1;
        Case {
            dense: [
                dq,
                dk_,
                dv_,
                da,
                db,
                arr(&a_log, &[hv], Dtype::Float32),
                arr(&dt_bias, &[hv], Dtype::Bfloat16),
            ],
            packed: per_token(1, b * t),
            conv: [
                arr(&f32s(rng, b * t * c, 4.0), &[b, t, c], Dtype::Bfloat16),
                arr(&vec![1.0 / dk as f32; dk], &[dk], Dtype::Bfloat16),
                arr(&vec![(dk as f32).powf(-0.5); dk], &[dk], Dtype::Bfloat16),
            ],
            heads: [hk, hv, dv],
            pool0: f32s(rng, n * hv * dv * dk, 0.5),
            pool_shape: [n, hv, dv, dk],
            slots,
            fresh: (0..b).map(|_| rng.below(3) == 0).collect(),
            accepted: (0..b).map(|_| rng.below(t as u64 + 1) as usize).collect(),
            cu: (0..=b).map(|i| i * t).collect(),
        }
    }

    fn pool(&self) -> Array {
        Array::from_slice(&self.pool0, &self.pool_shape).unwrap()
    }

    /// `which` on `pool`: (y, new pool), None where the call has none.
    fn call(&self, which: Call, pool: &Array) -> mlxkern::Result<(Option<Array>, Option<Array>)> {
        let slots = PoolSlots {
            pool,
            slots: &self.slots,
            fresh: Some(&self.fresh),
        };
        let [a_log, dt_bias] = [&self.dense[5], &self.dense[6]];
        fn step<'a>(x: &'a [Array; 5], a_log: &'a Array, dt_bias: &'a Array) -> GatedDelta<'a> {
            GatedDelta {
                q: &x[0],
                k: &x[1],
                v: &x[2],
                a: &x[3],
                b: &x[4],
                a_log,
                dt_bias,
                state: None,
                mask: None,
            }
        }
        let dense: &[Array; 5] = self.dense[..5].try_into().unwrap();
        let both = |u: mlxkern::PoolUpdate| (Some(u.y), Some(u.pool));
        Ok(match which {
            Call::Update => both(step(dense, a_log, dt_bias).update_pool(slots)?),
            Call::UpdateChunked => {
                both(step(dense, a_log, dt_bias).update_pool_chunked(slots, Some(16))?)
            }
            Call::Verify => (Some(step(dense, a_log, dt_bias).verify_pool(slots)?), None),
            Call::Packed => {
                both(step(&self.packed, a_log, dt_bias).update_packed(slots, &self.cu)?)
            }
            Call::PackedChunked => both(
                step(&self.packed, a_log, dt_bias).update_packed_chunked(slots, &self.cu, None)?,
            ),
            Call::Commit => {
                let replay = StateReplay {
                    k: &dense[1],
                    v: &dense[2],
                    a: &dense[3],
                    b: &dense[4],
                    a_log,
                    dt_bias,
                    state: None,
                    accepted_lengths: &self.accepted,
                };
                (None, Some(replay.commit_pool(slots)?))
            }
            Call::FromConv => {
                let [hk, hv, dv] = self.heads;
                let layer = GatedDeltaFromConv {
                    split: SiluRmsHeads {
                        x: &self.conv[0],
                        q_scale: &self.conv[1],
                        k_scale: &self.conv[2],
                        key_heads: hk,
                        value_heads: hv,
                        value_width: dv,
                        eps: 1e-6,
                    },
                    a: &dense[3],
                    b: &dense[4],
                    a_log,
                    dt_bias,
                    state: None,
                    mask: None,
                };
                both(layer.update_pool(slots)?)
            }
        })
    }
}

/// Float32 values as bit patterns.
fn bits(a: &Array) -> Vec<u32> {
    a.to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

#[test]
fn a_failed_pool_call_leaves_the_pool_as_given_through_the_safe_api() {
    let mut rng = Rng::fresh();
    for dims in [[3, 2, 1, 2, 32, 8], [2, 1, 2, 4, 64, 16]] {
        let case = Case::random(&mut rng, dims);
        let given: Vec<u32> = case.pool0.iter().map(|x| x.to_bits()).collect();
        for which in CALLS {
            let reference = {
                let pool = case.pool();
                let (y, p) = case.call(which, &pool).unwrap();
                (y.map(|y| y.to_bytes().unwrap()), p.map(|p| bits(&p)))
            };
            let nodes_before = usize::from(which == Call::FromConv);
            for fault in [Fault::AtEval, Fault::InTask] {
                for after in 0..=nodes_before {
                    for donated in [false, true] {
                        for y_first in [false, true] {
                            if donated && which == Call::Verify {
                                continue; // a verify only reads its pool
                            }
                            let what = format!(
                                "{which:?}, {fault:?} after {after}, donated {donated}, y first \
                                 {y_first}"
                            );
                            let pool = case.pool();
                            fail_cpu_kernel(Some((after, fault)));
                            let (y, p) = case.call(which, &pool).unwrap();
                            let kept = (!donated).then_some(pool);
                            let failing = match (&y, &p) {
                                (Some(y), _) if y_first || p.is_none() => y,
                                (_, Some(p)) => p,
                                _ => unreachable!(),
                            };
                            let err = failing.eval().expect_err(&what);
                            assert!(matches!(err, Error::Backend(_)), "{what}: {err}");
                            assert!(err.to_string().contains("injected fault"), "{what}: {err}");
                            assert!(!cpu_kernel_fault_pending(), "{what}");
                            if let Some(y) = &y {
                                let err = y.to_bytes().expect_err(&what).to_string();
                                assert!(err.contains("failed earlier"), "{what}: {err}");
                            }
                            if let Some(p) = &p {
                                assert!(bits(p) == given, "{what}: the new pool is the given one");
                            }
                            if let Some(kept) = &kept {
                                assert!(bits(kept) == given, "{what}: the kept pool");
                            }
                            // The same call on what the failed one left.
                            let next = p
                                .as_ref()
                                .or(kept.as_ref())
                                .unwrap_or_else(|| panic!("{what}: a verify keeps its pool"));
                            let (y2, p2) = case.call(which, next).unwrap();
                            assert_eq!(
                                y2.map(|y| y.to_bytes().unwrap()),
                                reference.0,
                                "{what}: y after the fault"
                            );
                            assert!(
                                p2.map(|p| bits(&p)) == reference.1,
                                "{what}: the pool after"
                            );
                        }
                    }
                }
            }
        }
    }
}

//! The safe API's `GatedDelta::vjp_chunked` against `mlxk_gated_delta_update_chunked_vjp` on the
//! same inputs, bit for bit (bf16, f16 and f32 inputs, masks, state or none, cotangents or
//! none), and its chunk-size errors as the C ABI reports them.

use std::ptr::null_mut;

use crate::support::api::*;
use crate::support::vjp_case::vjp;
use crate::support::*;
use mlxkern::Dtype;

#[test]
fn vjp_chunked_matches_the_c_abi() {
    let mut rng = Rng::fresh();
    for case in 0..5 {
        let hk = 1 + rng.below(2) as usize;
        let [b, t, hv, dk, dv] = [
            1 + rng.below(2) as usize,
            1 + rng.below(90) as usize,
            hk * (1 + rng.below(3) as usize),
            [32, 64, 128][rng.below(3) as usize],
            1 + rng.below(20) as usize,
        ];
        let dtype = FLOATS[case % 3];
        let chunk = [None, Some(16), Some(48), Some(128), Some(32)][case];
        let q = Twin::random(&mut rng, &[b, t, hk, dk], (dk as f32).powf(-0.5), dtype);
        let k = Twin::random(&mut rng, &[b, t, hk, dk], (dk as f32).powf(-0.5), dtype);
        let v = Twin::random(&mut rng, &[b, t, hv, dv], 1.0, dtype);
        let a = Twin::random(&mut rng, &[b, t, hv], 2.0, dtype);
        let bb = Twin::random(&mut rng, &[b, t, hv], 2.0, Dtype::Float32);
        let a_log = Twin::random(&mut rng, &[hv], 1.0, Dtype::Float32);
        let dt = Twin::random(&mut rng, &[hv], 1.0, dtype);
        let state =
            (case % 2 == 0).then(|| Twin::random(&mut rng, &[b, hv, dv, dk], 0.5, Dtype::Float32));
        let mask = (case >= 3).then(|| {
            let m: Vec<bool> = (0..b * t).map(|_| rng.below(3) != 0).collect();
            Twin::bools(&m, &[b, t])
        });
        let dy = (case != 1).then(|| Twin::random(&mut rng, &[b, t, hv, dv], 1.0, dtype));
        let ds = (case != 2).then(|| Twin::random(&mut rng, &[b, hv, dv, dk], 1.0, Dtype::Float32));
        let c_in = c_args(
            [&q, &k, &v, &a, &bb, &a_log, &dt],
            [&state, &mask, &dy, &ds],
        );
        let mut outs = [null_mut(); 8];
        ok(vjp(c_in, Some(chunk.unwrap_or(0) as i32), &mut outs));
        let gd = safe_update([&q, &k, &v, &a, &bb, &a_log, &dt], &state, &mask);
        let g = gd.vjp_chunked(chunk, r_opt(&dy), r_opt(&ds)).unwrap();
        let r = grads(&g);
        same_results("mlxk_gated_delta_update_chunked_vjp", &outs, &r);
        assert_eq!(g.dq.dtype().unwrap(), dtype);
        assert_eq!(g.db.dtype().unwrap(), Dtype::Float32);
        // Bad chunk sizes: the C ABI's error, behind its function's name.
        for bad in [8usize, 40, 256] {
            let err = gd
                .vjp_chunked(Some(bad), r_opt(&dy), r_opt(&ds))
                .unwrap_err();
            let mut outs = [null_mut(); 8];
            let status = vjp(c_in, Some(bad as i32), &mut outs);
            let msg = same_error("mlxk_gated_delta_update_chunked_vjp", status, err);
            assert!(msg.contains("chunk_size"), "{msg}");
        }
    }
}

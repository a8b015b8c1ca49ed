//! A decode loop through the safe API: the state carried from step to step is updated in place
//! by the CPU kernel (the old state is dropped before the new one is computed), and the steps
//! give the bits of one call over the whole sequence. Alone in its binary: it counts the
//! process's in-place updates.

#[path = "../support/mod.rs"]
mod support;

use mlxkern::{Array, GatedDelta};
use support::{same_bits, Rng};

#[test]
fn decode_steps_carry_the_state_in_place() {
    let mut rng = Rng::fresh();
    let (b, t, hk, hv, dk, dv) = (2, 9, 2, 4, 64, 16);
    let window = |x: &[f32], inner: usize, t0: usize, t1: usize| -> Vec<f32> {
        (0..b)
            .flat_map(|r| x[(r * t + t0) * inner..(r * t + t1) * inner].to_vec())
            .collect()
    };
    let q = rng.vec(b * t * hk * dk, 0.15);
    let k = rng.vec(b * t * hk * dk, 0.15);
    let v = rng.vec(b * t * hv * dv, 1.0);
    let a = rng.vec(b * t * hv, 2.0);
    let beta = rng.vec(b * t * hv, 2.0);
    let a_log = Array::from_slice(&rng.vec(hv, 1.0), &[hv]).unwrap();
    let dt_bias = Array::from_slice(&rng.vec(hv, 1.0), &[hv]).unwrap();
    let state0 = rng.vec(b * hv * dv * dk, 0.5);
    let call = |t0: usize, t1: usize, state: &Array| {
        let n = t1 - t0;
        let q = Array::from_slice(&window(&q, hk * dk, t0, t1), &[b, n, hk, dk]).unwrap();
        let k = Array::from_slice(&window(&k, hk * dk, t0, t1), &[b, n, hk, dk]).unwrap();
        let v = Array::from_slice(&window(&v, hv * dv, t0, t1), &[b, n, hv, dv]).unwrap();
        let a = Array::from_slice(&window(&a, hv, t0, t1), &[b, n, hv]).unwrap();
        let bb = Array::from_slice(&window(&beta, hv, t0, t1), &[b, n, hv]).unwrap();
        GatedDelta {
            q: &q,
            k: &k,
            v: &v,
            a: &a,
            b: &bb,
            a_log: &a_log,
            dt_bias: &dt_bias,
            state: Some(state),
            mask: None,
        }
        .update()
        .unwrap()
    };

    let before = mlxkern::testing::in_place_updates();
    let mut state = Array::from_slice(&state0, &[b, hv, dv, dk]).unwrap();
    let mut ys = Vec::new();
    for step in 0..t {
        let out = call(step, step + 1, &state);
        state = out.state;
        ys.push(out.y.to_vec::<f32>().unwrap());
    }
    let carried = state.to_vec::<f32>().unwrap();
    let in_place = mlxkern::testing::in_place_updates() - before;
    assert_eq!(in_place, t, "steps that updated the state in place");

    let whole = call(0, t, &Array::from_slice(&state0, &[b, hv, dv, dk]).unwrap());
    let at_once = whole.state.to_vec::<f32>().unwrap();
    assert!(same_bits(&carried, &at_once));
    let y_all = whole.y.to_vec::<f32>().unwrap();
    for (step, y) in ys.iter().enumerate() {
        assert_eq!(
            y,
            &window(&y_all, hv * dv, step, step + 1),
            "y of step {step}"
        );
    }
    // A state still held elsewhere (a shared clone) is not overwritten.
    let kept = state.try_clone().unwrap();
    let before = mlxkern::testing::in_place_updates();
    let out = call(0, 1, &state);
    drop(state);
    out.state.eval().unwrap();
    assert_eq!(mlxkern::testing::in_place_updates(), before);
    assert_eq!(kept.to_vec::<f32>().unwrap(), carried);
}

//! Decode steps chained inside one evaluation (an engine builds a token's steps, then evaluates
//! once): every step writes its new state into the previous state's buffer, and the results
//! are the bits of the same steps evaluated one at a time. One test in its own binary, so the
//! process-wide in-place counter counts only these steps.

#[path = "../support/mod.rs"]
mod support;

use crate::support::*;
use std::ptr::null_mut;

/// Runs `steps` decode steps from `state0` over the T = 1 windows of `host`; with `chained`
/// the states are only evaluated at the end. Returns (y of every step, final state, steps
/// that updated the state in place).
fn decode(
    host: &HostRecurrence,
    state0: &[f32],
    steps: usize,
    chained: bool,
) -> (Vec<Vec<u16>>, Vec<f32>, usize) {
    let [b, _, _, hv, dk, dv] = host.dims;
    let mut state = new_f32(state0, &[b as i32, hv as i32, dv as i32, dk as i32]);
    let before = mlxkern::testing::in_place_updates();
    let mut ys = Vec::new();
    for step in 0..steps {
        let w = host.window(step, step + 1);
        let [q, k, v, a, bb, al, dt, _, _] = w.args();
        let (mut y, mut next) = (null_mut(), null_mut());
        ok(unsafe {
            mlxk_gated_delta_update(
                q,
                k,
                v,
                a,
                bb,
                al,
                dt,
                state,
                std::ptr::null(),
                &mut y,
                &mut next,
            )
        });
        free(state);
        state = next;
        w.free_inputs();
        if !chained {
            ok(mlxk_array_eval(state));
        }
        ys.push(y);
    }
    ok(mlxk_array_eval(state));
    let in_place = mlxkern::testing::in_place_updates() - before;
    let y_bits = ys
        .into_iter()
        .map(|y| {
            let bytes = read_bytes(y);
            free(y);
            bytes
                .chunks(2)
                .map(|c| u16::from_ne_bytes([c[0], c[1]]))
                .collect()
        })
        .collect();
    let final_state = read_f32(state);
    free(state);
    (y_bits, final_state, in_place)
}

#[test]
fn chained_decode_steps_update_the_state_in_place() {
    let mut rng = Rng::fresh();
    let dims = [1, 30, 4, 8, 128, 32];
    let [b, _, _, hv, dk, dv] = dims;
    let host = HostRecurrence::random(&mut rng, dims);
    let state0 = rng.vec(b * hv * dv * dk, 0.5);
    let steps = 30;
    let (y_each, s_each, _) = decode(&host, &state0, steps, false);
    let (y_chain, s_chain, in_place) = decode(&host, &state0, steps, true);
    assert_eq!(
        y_chain, y_each,
        "y of chained steps equals y of steps evaluated one by one"
    );
    assert!(
        same_bits(&s_chain, &s_each),
        "the final state is the same bits"
    );
    // The first step's input is the caller's fresh state (freed before evaluation, so it is
    // donatable too): every step runs in place.
    assert_eq!(
        in_place, steps,
        "chained steps that updated the state in place"
    );
}

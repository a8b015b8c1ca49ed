//! The pool and packed entry points in the misuse suite: their handle arguments (the pool
//! among them) with valid host slots, offsets and lengths.

use super::*;
use crate::support::pool::{pool_update, update_packed_to, update_pool_to};

/// Every pool entry point on `r` (B = 2, T = 3; its state [2, Hv, Dv, Dk] serves as a pool of
/// two slots), the packed ones on `p` (B = 1, T = 5), the update from the convolution's output
/// on `conv` (x, q_scale, k_scale) with r's gates.
pub(super) fn entries(r: &Recurrence, p: &Recurrence, conv: [H; 3]) -> Vec<Entry> {
    let pool = r.state.unwrap();
    let mask = ("mask", r.mask.unwrap());
    let with_mask = update_args(r, &[("pool", pool), mask]);
    let packed = update_args(p, &[("pool", pool)]);
    let (slots, cu, fresh) = ([1i32, 0], [0i32, 2, 5], [1u8, 0]);
    let mut from_conv = vec![("x", conv[0]), ("q_scale", conv[1]), ("k_scale", conv[2])];
    from_conv.extend_from_slice(&with_mask[3..]);
    vec![
        Entry::new(
            "mlxk_gated_delta_update_pool",
            &with_mask,
            outs(move |h, [y, st]| update_call(h, &slots, None, y, st)),
        )
        .optional(&["mask"]),
        Entry::new(
            "mlxk_gated_delta_update_pool_chunked",
            &with_mask,
            outs(move |h, [y, st]| update_call(h, &slots, Some((&fresh, 16)), y, st)),
        )
        .optional(&["mask"]),
        Entry::new(
            "mlxk_gated_delta_verify_pool",
            &with_mask,
            outs(move |h, [y]| unsafe {
                let s = slots.as_ptr();
                let [q, k, v, a, b, al, dt, pool, m] = h9(h);
                mlxk_gated_delta_verify_pool(q, k, v, a, b, al, dt, pool, s, null(), 2, m, y)
            }),
        )
        .optional(&["mask"]),
        Entry::new(
            "mlxk_gated_delta_update_packed",
            &packed,
            outs(move |h, [y, st]| packed_call(h, &cu, &slots, None, y, st)),
        ),
        Entry::new(
            "mlxk_gated_delta_update_packed_chunked",
            &packed,
            outs(move |h, [y, st]| packed_call(h, &cu, &slots, Some(0), y, st)),
        ),
        Entry::new(
            "mlxk_gated_delta_state_pool",
            &with_mask[1..8],
            outs(move |h, [st]| unsafe {
                let s = slots.as_ptr();
                let [k, v, a, b, al, dt, pool] = h[..7].try_into().unwrap();
                let lengths = [3i32, 1];
                mlxk_gated_delta_state_pool(
                    k,
                    v,
                    a,
                    b,
                    al,
                    dt,
                    pool,
                    s,
                    null(),
                    lengths.as_ptr(),
                    2,
                    st,
                )
            }),
        ),
        Entry::new(
            "mlxk_gated_delta_update_from_conv_pool",
            &from_conv,
            outs(move |h, [y, st]| unsafe {
                let s = slots.as_ptr();
                let [x, qs, ks, a, b, al, dt, pool, m] = h9(h);
                mlxk_gated_delta_update_from_conv_pool(
                    x,
                    qs,
                    ks,
                    1,
                    2,
                    4,
                    1e-6,
                    a,
                    b,
                    al,
                    dt,
                    pool,
                    s,
                    null(),
                    2,
                    m,
                    y,
                    st,
                )
            }),
        )
        .optional(&["mask"]),
    ]
}

#[test]
fn pool_calls_refuse_null_out_parameters() {
    let _s = serial();
    let fx = Fixture::new();
    let r = &fx.rec;
    let [q, k, v, a, b, al, dt, _, _] = r.args();
    let pool = r.state.unwrap();
    let n = live_handles();
    let slots = [0i32, 1];
    let s = slots.as_ptr();
    let mut y = sentinel();
    let f = "mlxk_gated_delta_update_pool";
    for (y_out, pool_out, arg) in [
        (null_mut(), &mut y as *mut H, "y"),
        (&mut y as *mut H, null_mut(), "pool_out"),
    ] {
        let x = [q, k, v, a, b, al, dt];
        let st = update_pool_to(x, pool, &slots, null(), null(), y_out, pool_out);
        refused(st, MLXK_ERR_NULL_POINTER, f, &[arg], n);
        assert_eq!(y, sentinel(), "{f}: a refused call wrote an out-parameter");
    }
    let f = "mlxk_gated_delta_verify_pool";
    let st = unsafe {
        mlxk_gated_delta_verify_pool(
            q,
            k,
            v,
            a,
            b,
            al,
            dt,
            pool,
            s,
            null(),
            2,
            null(),
            null_mut(),
        )
    };
    refused(st, MLXK_ERR_NULL_POINTER, f, &["y"], n);
    let f = "mlxk_gated_delta_state_pool";
    let st = unsafe {
        mlxk_gated_delta_state_pool(k, v, a, b, al, dt, pool, s, null(), null(), 2, &mut y)
    };
    refused(st, MLXK_ERR_NULL_POINTER, f, &["accepted_lengths"], n);
    assert_eq!(y, sentinel(), "{f}: a refused call wrote its out-parameter");
    fx.free();
}

/// The packed update (`chunk` None) or the packed chunked one on an entry's first eight handles
/// (the seven inputs, the pool), the offsets `cu` and `slots`, no fresh flags.
fn packed_call(
    h: &[H],
    cu: &[i32],
    slots: &[i32],
    chunk: Option<i32>,
    y: *mut H,
    st: *mut H,
) -> mlxk_status {
    let x: [H; 8] = h[..8].try_into().unwrap();
    update_packed_to(
        x.map(|h| h.cast_const()),
        cu,
        (slots.as_ptr(), null()),
        chunk,
        (y, st),
    )
}

/// The pool update on an entry's nine handles (the seven inputs, the pool, the mask) and
/// `slots`: exact (no fresh flags), or with `chunked` (fresh flags, chunk size) the chunked form.
fn update_call(
    h: &[H],
    slots: &[i32],
    chunked: Option<(&[u8], i32)>,
    y: *mut H,
    st: *mut H,
) -> mlxk_status {
    let [q, k, v, a, b, al, dt, pool, m] = h9(h).map(|h| h.cast_const());
    let fresh = chunked.map_or(null(), |(f, _)| f.as_ptr());
    let chunk = chunked.map(|(_, c)| c);
    pool_update(
        [q, k, v, a, b, al, dt],
        pool,
        (slots, fresh),
        m,
        chunk,
        (y, st),
    )
}

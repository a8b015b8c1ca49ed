//! The pool and packed entry points in the misuse suite: their handle arguments (the pool
//! among them) with valid host slots, offsets and lengths.

use super::*;

/// Every pool entry point on `r` (B = 2, T = 3; its state [2, Hv, Dv, Dk] serves as a pool of
/// two slots), the packed ones on `p` (B = 1, T = 5), the update from the convolution's output
/// on `conv` (x, q_scale, k_scale) with r's gates.
pub(super) fn entries(r: &Recurrence, p: &Recurrence, conv: [H; 3]) -> Vec<Entry> {
    let pool = r.state.unwrap();
    let update_args = |r: &Recurrence, with_mask: bool| {
        let mut args = vec![
            ("q", r.q),
            ("k", r.k),
            ("v", r.v),
            ("a", r.a),
            ("b", r.b),
            ("a_log", r.a_log),
            ("dt_bias", r.dt_bias),
            ("pool", pool),
        ];
        if with_mask {
            args.push(("mask", r.mask.unwrap()));
        }
        args
    };
    let slots = [1i32, 0];
    let cu = [0i32, 2, 5];
    vec![
        Entry::new(
            "mlxk_gated_delta_update_pool",
            &update_args(r, true),
            move |h| {
                let (mut y, mut s) = (sentinel(), sentinel());
                let st = unsafe {
                    mlxk_gated_delta_update_pool(
                        h[0],
                        h[1],
                        h[2],
                        h[3],
                        h[4],
                        h[5],
                        h[6],
                        h[7],
                        slots.as_ptr(),
                        null(),
                        2,
                        h[8],
                        &mut y,
                        &mut s,
                    )
                };
                (st, vec![y, s], y == sentinel() && s == sentinel())
            },
        )
        .optional(&["mask"]),
        Entry::new(
            "mlxk_gated_delta_update_pool_chunked",
            &update_args(r, true),
            move |h| {
                let (mut y, mut s) = (sentinel(), sentinel());
                let st = unsafe {
                    mlxk_gated_delta_update_pool_chunked(
                        h[0],
                        h[1],
                        h[2],
                        h[3],
                        h[4],
                        h[5],
                        h[6],
                        h[7],
                        slots.as_ptr(),
                        [1u8, 0].as_ptr(),
                        2,
                        h[8],
                        16,
                        &mut y,
                        &mut s,
                    )
                };
                (st, vec![y, s], y == sentinel() && s == sentinel())
            },
        )
        .optional(&["mask"]),
        Entry::new(
            "mlxk_gated_delta_verify_pool",
            &update_args(r, true),
            move |h| {
                let mut y = sentinel();
                let st = unsafe {
                    mlxk_gated_delta_verify_pool(
                        h[0],
                        h[1],
                        h[2],
                        h[3],
                        h[4],
                        h[5],
                        h[6],
                        h[7],
                        slots.as_ptr(),
                        null(),
                        2,
                        h[8],
                        &mut y,
                    )
                };
                (st, vec![y], y == sentinel())
            },
        )
        .optional(&["mask"]),
        Entry::new(
            "mlxk_gated_delta_update_packed",
            &update_args(p, false),
            move |h| {
                let (mut y, mut s) = (sentinel(), sentinel());
                let st = unsafe {
                    mlxk_gated_delta_update_packed(
                        h[0],
                        h[1],
                        h[2],
                        h[3],
                        h[4],
                        h[5],
                        h[6],
                        h[7],
                        cu.as_ptr(),
                        3,
                        slots.as_ptr(),
                        null(),
                        &mut y,
                        &mut s,
                    )
                };
                (st, vec![y, s], y == sentinel() && s == sentinel())
            },
        ),
        Entry::new(
            "mlxk_gated_delta_update_packed_chunked",
            &update_args(p, false),
            move |h| {
                let (mut y, mut s) = (sentinel(), sentinel());
                let st = unsafe {
                    mlxk_gated_delta_update_packed_chunked(
                        h[0],
                        h[1],
                        h[2],
                        h[3],
                        h[4],
                        h[5],
                        h[6],
                        h[7],
                        cu.as_ptr(),
                        3,
                        slots.as_ptr(),
                        null(),
                        0,
                        &mut y,
                        &mut s,
                    )
                };
                (st, vec![y, s], y == sentinel() && s == sentinel())
            },
        ),
        Entry::new(
            "mlxk_gated_delta_state_pool",
            &update_args(r, false)[1..],
            move |h| {
                let mut s = sentinel();
                let st = unsafe {
                    mlxk_gated_delta_state_pool(
                        h[0],
                        h[1],
                        h[2],
                        h[3],
                        h[4],
                        h[5],
                        h[6],
                        slots.as_ptr(),
                        null(),
                        [3i32, 1].as_ptr(),
                        2,
                        &mut s,
                    )
                };
                (st, vec![s], s == sentinel())
            },
        ),
        Entry::new(
            "mlxk_gated_delta_update_from_conv_pool",
            &[
                ("x", conv[0]),
                ("q_scale", conv[1]),
                ("k_scale", conv[2]),
                ("a", r.a),
                ("b", r.b),
                ("a_log", r.a_log),
                ("dt_bias", r.dt_bias),
                ("pool", pool),
                ("mask", r.mask.unwrap()),
            ],
            move |h| {
                let (mut y, mut s) = (sentinel(), sentinel());
                let st = unsafe {
                    mlxk_gated_delta_update_from_conv_pool(
                        h[0],
                        h[1],
                        h[2],
                        1,
                        2,
                        4,
                        1e-6,
                        h[3],
                        h[4],
                        h[5],
                        h[6],
                        h[7],
                        slots.as_ptr(),
                        null(),
                        2,
                        h[8],
                        &mut y,
                        &mut s,
                    )
                };
                (st, vec![y, s], y == sentinel() && s == sentinel())
            },
        )
        .optional(&["mask"]),
    ]
}

#[test]
fn pool_calls_refuse_null_out_parameters() {
    let _s = serial();
    let fx = Fixture::new();
    let r = &fx.rec;
    let pool = r.state.unwrap();
    let n = live_handles();
    let slots = [0i32, 1];
    let mut y = sentinel();
    let f = "mlxk_gated_delta_update_pool";
    for (y_out, pool_out, arg) in [
        (null_mut(), &mut y as *mut H, "y"),
        (&mut y as *mut H, null_mut(), "pool_out"),
    ] {
        refused(
            unsafe {
                mlxk_gated_delta_update_pool(
                    r.q,
                    r.k,
                    r.v,
                    r.a,
                    r.b,
                    r.a_log,
                    r.dt_bias,
                    pool,
                    slots.as_ptr(),
                    null(),
                    2,
                    null(),
                    y_out,
                    pool_out,
                )
            },
            MLXK_ERR_NULL_POINTER,
            f,
            &[arg],
            n,
        );
        assert_eq!(y, sentinel(), "{f}: a refused call wrote an out-parameter");
    }
    let f = "mlxk_gated_delta_verify_pool";
    refused(
        unsafe {
            mlxk_gated_delta_verify_pool(
                r.q,
                r.k,
                r.v,
                r.a,
                r.b,
                r.a_log,
                r.dt_bias,
                pool,
                slots.as_ptr(),
                null(),
                2,
                null(),
                null_mut(),
            )
        },
        MLXK_ERR_NULL_POINTER,
        f,
        &["y"],
        n,
    );
    let f = "mlxk_gated_delta_state_pool";
    refused(
        unsafe {
            mlxk_gated_delta_state_pool(
                r.k,
                r.v,
                r.a,
                r.b,
                r.a_log,
                r.dt_bias,
                pool,
                slots.as_ptr(),
                null(),
                null(),
                2,
                &mut y,
            )
        },
        MLXK_ERR_NULL_POINTER,
        f,
        &["accepted_lengths"],
        n,
    );
    assert_eq!(y, sentinel(), "{f}: a refused call wrote its out-parameter");
    fx.free();
}

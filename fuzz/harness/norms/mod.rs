//! Targets `norms` and `norms_vjp`, their common part: decoding one argument (perturbed shape,
//! dtype or handle; optional cotangents), random dtypes, the head split's dims, and the rules
//! the forward and backward passes share (handles, the head split's arguments). Each target's
//! calls and checks: forward.rs (`norms`) and vjp.rs (`norms_vjp`).

use std::ptr::null_mut;

use super::*;

mod forward;
mod vjp;

pub use forward::run;
pub use vjp::run_vjp;

const MAX_ROUNDS: usize = 4;
const MAX_ELEMENTS: u128 = 1 << 18;

struct Arr {
    name: &'static str,
    kind: Kind,
    shape: Vec<i64>,
    dtype: mlxk_dtype,
    h: H,
    bytes: Vec<u8>,
    mode: DataMode,
}

struct Ctx {
    dead: Vec<H>,
    foreign: Foreign,
}

impl Ctx {
    fn arr(
        &mut self,
        input: &mut Input,
        name: &'static str,
        mut shape: Vec<i64>,
        mut dtype: mlxk_dtype,
        mode: DataMode,
    ) -> Arr {
        let mut kind = Kind::Live;
        if input.chance(14) {
            let old = (shape.clone(), dtype);
            match input.u8() % 7 {
                0 => dtype = (input.u8() % 8) as mlxk_dtype,
                1 => {
                    shape.pop();
                }
                2 => shape.push(input.pick(&[1i64, 2])),
                3 if !shape.is_empty() => {
                    let axis = input.below(shape.len());
                    let d = shape[axis];
                    shape[axis] =
                        (input.pick(&[0i64, 1, 2, d + 1, d * 2, d - 1])).min(i32::MAX as i64);
                }
                4 => kind = Kind::Null,
                5 => kind = Kind::Dead,
                _ => kind = Kind::Foreign,
            }
            if count(&shape).is_none_or(|n| n > MAX_ELEMENTS) {
                (shape, dtype) = old;
            }
        }
        let mut mode = mode;
        if !is_float(dtype) && mode != DataMode::Zeros {
            mode = if dtype == MLXK_DTYPE_BOOL {
                DataMode::Nice
            } else {
                DataMode::Raw
            };
        }
        let mut bytes = Vec::new();
        let h = if kind == Kind::Live {
            let mut fill = Fill::new(input.u16() as u64);
            bytes = make_data(&mut fill, count_usize(&shape), dtype, mode);
            new_array(&bytes, &shape, dtype)
        } else {
            handle_of(kind, null_mut(), &self.dead, &self.foreign, input)
        };
        Arr {
            name,
            kind,
            shape,
            dtype,
            h,
            bytes,
            mode,
        }
    }

    /// An optional argument (a cotangent): absent (NULL) one time in three, else as `arr`.
    fn opt_arr(
        &mut self,
        input: &mut Input,
        name: &'static str,
        shape: Vec<i64>,
        dtype: mlxk_dtype,
        mode: DataMode,
    ) -> Arr {
        if input.u8() % 3 == 0 {
            return Arr {
                name,
                kind: Kind::Null,
                shape,
                dtype,
                h: null_mut(),
                bytes: Vec::new(),
                mode,
            };
        }
        self.arr(input, name, shape, dtype, mode)
    }

    fn release(&mut self, a: Arr) {
        if a.kind == Kind::Live {
            free_ok(a.h);
            self.dead.push(a.h);
        }
    }
}

fn handles(e: &mut Expect, arrs: &[&Arr]) -> bool {
    handles_opt(e, arrs, &[])
}

/// Handle rules for required and optional (NULL allowed) arguments; false when one is unusable.
fn handles_opt(e: &mut Expect, arrs: &[&Arr], optional: &[&Arr]) -> bool {
    let mut usable = true;
    for a in arrs {
        expect_handle(e, a.name, a.kind, false);
        usable &= a.kind == Kind::Live;
    }
    for a in optional {
        expect_handle(e, a.name, a.kind, true);
        usable &= matches!(a.kind, Kind::Live | Kind::Null);
    }
    if !usable {
        e.maybe(MLXK_ERR_SHAPE, "rules over an unusable handle");
        e.maybe(MLXK_ERR_DTYPE, "rules over an unusable handle");
    }
    usable
}

fn pick_dtype(input: &mut Input) -> mlxk_dtype {
    if input.chance(12) {
        input.pick(&[
            MLXK_DTYPE_INT8,
            MLXK_DTYPE_BOOL,
            MLXK_DTYPE_UINT32,
            MLXK_DTYPE_INT32,
        ])
    } else {
        input.pick(&[
            MLXK_DTYPE_BFLOAT16,
            MLXK_DTYPE_BFLOAT16,
            MLXK_DTYPE_FLOAT16,
            MLXK_DTYPE_FLOAT32,
        ])
    }
}

/// The head split's dims (b, s, hk, hv, dk, dv): usually small, sometimes empty with huge head
/// counts, sometimes a Dk outside [1, 128].
fn split_dims(input: &mut Input) -> [i64; 6] {
    let huge = input.chance(12);
    let (b, s) = if huge {
        (0i64, input.pick(&[1i64, 65536, i32::MAX as i64]))
    } else {
        (
            input.pick(&[1i64, 0, 1, 2, 3]),
            input.pick(&[1i64, 0, 1, 2, 3, 5]),
        )
    };
    let mut hk = input.pick(&[1i64, 1, 2, 3]);
    let mut hv = input.pick(&[1i64, 2, 3, 4]);
    let mut dk = input.pick(&[1i64, 2, 3, 7, 16, 32, 64, 100, 128]);
    let mut dv = input.pick(&[1i64, 2, 3, 4, 8, 16, 64, 128]);
    if huge {
        hk = input.pick(&[1i64, 1 << 20, 1 << 25]);
        hv = input.pick(&[1i64, 1 << 20, 1 << 26]);
        dk = input.pick(&[1i64, 128]);
        dv = input.pick(&[1i64, 128]);
    } else if input.chance(24) {
        dk = input.pick(&[0i64, 129, 200]);
    }
    [b, s, hk, hv, dk, dv]
}

/// The rules of the head split's arguments (x, the scales, the head counts, eps) that its
/// backward pass shares; returns Dk when x has rank 3 and Dk is known.
fn split_rules(
    e: &mut Expect,
    x: &Arr,
    q_scale: &Arr,
    k_scale: &Arr,
    heads: [i32; 3],
    eps: f32,
) -> Option<i64> {
    if x.shape.len() != 3 {
        e.fail(MLXK_ERR_SHAPE, "x is not rank 3");
    }
    if !is_float(x.dtype) {
        e.fail(MLXK_ERR_DTYPE, "x is not float");
    }
    for sc in [q_scale, k_scale] {
        if sc.dtype != x.dtype {
            e.fail(MLXK_ERR_DTYPE, format!("{} dtype differs from x", sc.name));
        }
    }
    let dk_got = if q_scale.shape.len() == 1 {
        Some(q_scale.shape[0])
    } else {
        None
    };
    if dk_got.is_none() {
        e.fail(MLXK_ERR_SHAPE, "q_scale is not [Dk]");
    }
    if k_scale.shape.len() != 1 || dk_got.is_some_and(|d| k_scale.shape[0] != d) {
        e.fail(MLXK_ERR_SHAPE, "k_scale is not [Dk]");
    }
    if let Some(d) = dk_got {
        if !(1..=128).contains(&d) {
            e.fail(MLXK_ERR_SHAPE, format!("Dk {d}"));
        }
    }
    let (hk, hv, dv) = (heads[0] as i64, heads[1] as i64, heads[2] as i64);
    if hk < 1 {
        e.fail(MLXK_ERR_INVALID_ARGUMENT, "key_heads < 1");
    }
    if hv < 1 {
        e.fail(MLXK_ERR_INVALID_ARGUMENT, "value_heads < 1");
    }
    if !(1..=128).contains(&dv) {
        e.fail(MLXK_ERR_INVALID_ARGUMENT, "value_width outside [1, 128]");
    }
    if !eps_valid(eps) {
        e.fail(MLXK_ERR_INVALID_ARGUMENT, format!("eps {eps}"));
    }
    if 32 * (2 * hk as i128 + hv as i128) > i32::MAX as i128 {
        e.fail(MLXK_ERR_INVALID_ARGUMENT, "too many heads for one launch");
    }
    let (Some(dk), true) = (dk_got, x.shape.len() == 3) else {
        return None;
    };
    let want = 2 * hk as i128 * dk as i128 + hv as i128 * dv as i128;
    if x.shape[2] as i128 != want {
        e.fail(
            MLXK_ERR_SHAPE,
            format!("x has {} channels, expected {want}", x.shape[2]),
        );
    }
    Some(dk)
}

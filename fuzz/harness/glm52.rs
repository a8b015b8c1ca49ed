//! Target `glm52`: mlxk_glm52_layout_validate and mlxk_glm52_layout_canonical with arbitrary
//! u64 fields and u32 bits / group sizes: canonical layouts, canonical layouts with fields
//! perturbed (shifted, swapped, set to 2^53-1, 2^53, u64::MAX), and raw random layouts, plus
//! NULL pointers and unaligned structs. Each answer is compared with an independent oracle
//! written from the header (u128 arithmetic): validate succeeds exactly when the oracle finds
//! the layout safe, and canonical gives exactly the oracle's layout.

use std::ptr::null_mut;

use super::*;

const MAX_SAFE: u128 = (1u128 << 53) - 1;
const SLOT_ALIGN: u128 = 16384;
const MAX_OPS: usize = 16;

fn fields(l: &mlxk_glm52_layout) -> [u64; 9] {
    [
        l.hidden_size,
        l.intermediate_size,
        l.slot_bytes,
        l.down_weight_offset,
        l.gate_weight_offset,
        l.up_weight_offset,
        l.down_scale_offset,
        l.gate_scale_offset,
        l.up_scale_offset,
    ]
}

fn set_field(l: &mut mlxk_glm52_layout, i: usize, v: u64) {
    match i {
        0 => l.hidden_size = v,
        1 => l.intermediate_size = v,
        2 => l.slot_bytes = v,
        3 => l.down_weight_offset = v,
        4 => l.gate_weight_offset = v,
        5 => l.up_weight_offset = v,
        6 => l.down_scale_offset = v,
        7 => l.gate_scale_offset = v,
        _ => l.up_scale_offset = v,
    }
}

fn format_ok(bits: u32, group: u32) -> bool {
    matches!(bits, 4 | 8) && matches!(group, 32 | 64 | 128)
}

/// (offset, length) of the six regions in canonical order: gate, up, down weight, gate, up,
/// down scale. Gate and up weights are [intermediate, hidden], down [hidden, intermediate];
/// bits/8 bytes per weight; one bfloat16 scale per group of input values.
fn regions(l: &mlxk_glm52_layout, bits: u32, group: u32) -> [(u128, u128); 6] {
    let (h, i) = (l.hidden_size as u128, l.intermediate_size as u128);
    let weight = h * i * bits as u128 / 8;
    let gate_up_scale = i * (h / group as u128) * 2;
    let down_scale = h * (i / group as u128) * 2;
    [
        (l.gate_weight_offset as u128, weight),
        (l.up_weight_offset as u128, weight),
        (l.down_weight_offset as u128, weight),
        (l.gate_scale_offset as u128, gate_up_scale),
        (l.up_scale_offset as u128, gate_up_scale),
        (l.down_scale_offset as u128, down_scale),
    ]
}

fn dim_ok(d: u64, group: u32) -> bool {
    d > 0 && d % group as u64 == 0 && d as u128 <= MAX_SAFE
}

/// The oracle: is `l` safe to read as Q`bits` with `group`?
fn oracle_valid(l: &mlxk_glm52_layout, bits: u32, group: u32) -> bool {
    if !format_ok(bits, group) {
        return false;
    }
    if fields(l).iter().any(|&f| f as u128 > MAX_SAFE) {
        return false;
    }
    let slot = l.slot_bytes as u128;
    if slot == 0 || slot % SLOT_ALIGN != 0 {
        return false;
    }
    if !dim_ok(l.hidden_size, group) || !dim_ok(l.intermediate_size, group) {
        return false;
    }
    let rs = regions(l, bits, group);
    for &(off, len) in &rs {
        if off % 16 != 0 || off + len > MAX_SAFE || off + len > slot {
            return false;
        }
    }
    for i in 0..6 {
        for j in i + 1..6 {
            let (a, la) = rs[i];
            let (b, lb) = rs[j];
            if a < b + lb && b < a + la {
                return false;
            }
        }
    }
    true
}

fn round_up(v: u128) -> u128 {
    v.div_ceil(SLOT_ALIGN) * SLOT_ALIGN
}

/// The oracle's canonical layout (None when canonical must refuse).
fn oracle_canonical(h: u64, i: u64, bits: u32, group: u32) -> Option<mlxk_glm52_layout> {
    if !format_ok(bits, group) || !dim_ok(h, group) || !dim_ok(i, group) {
        return None;
    }
    let probe = mlxk_glm52_layout {
        hidden_size: h,
        intermediate_size: i,
        ..Default::default()
    };
    let lengths = regions(&probe, bits, group).map(|(_, len)| len);
    let mut offsets = [0u128; 6];
    let mut end = 0u128;
    for r in 0..6 {
        offsets[r] = round_up(end);
        end = offsets[r] + lengths[r];
    }
    let slot = round_up(end);
    if slot > MAX_SAFE {
        return None;
    }
    Some(mlxk_glm52_layout {
        hidden_size: h,
        intermediate_size: i,
        slot_bytes: slot as u64,
        gate_weight_offset: offsets[0] as u64,
        up_weight_offset: offsets[1] as u64,
        down_weight_offset: offsets[2] as u64,
        gate_scale_offset: offsets[3] as u64,
        up_scale_offset: offsets[4] as u64,
        down_scale_offset: offsets[5] as u64,
    })
}

fn pick_format(input: &mut Input) -> (u32, u32) {
    let bits = if input.chance(16) {
        input.u32()
    } else {
        input.pick(&[4u32, 8])
    };
    let group = if input.chance(16) {
        input.u32()
    } else {
        input.pick(&[32u32, 64, 128])
    };
    (bits, group)
}

fn pick_dim(input: &mut Input, group: u32) -> u64 {
    let g = group.max(1) as u64;
    match input.u8() % 8 {
        7 => input.u64(),
        6 => input.pick(&[0u64, 1, (1 << 53) - 1, 1 << 53, u64::MAX, 6144, 2048]),
        5 => g.wrapping_mul(input.u32() as u64 + 1),
        4 => g * (input.u16() as u64 + 1) + input.pick(&[0u64, 1, g / 2]),
        _ => g * (input.below(256) as u64 + 1),
    }
}

fn call_canonical(input: &mut Input) {
    let (bits, group) = pick_format(input);
    let (h, i) = (pick_dim(input, group), pick_dim(input, group));
    let null = input.chance(8);
    let mut out = mlxk_glm52_layout {
        slot_bytes: 0xABCD,
        ..Default::default()
    };
    let before = out;
    let status = unsafe {
        mlxk_glm52_layout_canonical(h, i, bits, group, if null { null_mut() } else { &mut out })
    };
    check_status("mlxk_glm52_layout_canonical", status);
    let want = oracle_canonical(h, i, bits, group);
    if null {
        assert_eq!(status, MLXK_ERR_NULL_POINTER, "canonical with a NULL out");
        return;
    }
    match want {
        Some(l) => {
            assert_eq!(
                status,
                MLXK_OK,
                "canonical({h}, {i}, {bits}, {group}) refused: {}",
                last_error()
            );
            assert_eq!(
                out, l,
                "canonical({h}, {i}, {bits}, {group}) differs from the oracle"
            );
            let st = unsafe { mlxk_glm52_layout_validate(&out, bits, group) };
            check_status("mlxk_glm52_layout_validate", st);
            assert_eq!(
                st,
                MLXK_OK,
                "a canonical layout fails validation: {}",
                last_error()
            );
        }
        None => {
            assert_eq!(
                status, MLXK_ERR_INVALID_ARGUMENT,
                "canonical({h}, {i}, {bits}, {group}) accepted"
            );
            assert_eq!(out, before, "canonical wrote its out-parameter on failure");
        }
    }
}

fn call_validate(input: &mut Input) {
    let (bits, group) = pick_format(input);
    let mut l = match input.u8() % 4 {
        3 => {
            let mut l = mlxk_glm52_layout::default();
            for f in 0..9 {
                set_field(&mut l, f, input.u64());
            }
            l
        }
        _ => {
            // A canonical layout (of a valid format), then perturbed.
            let (cb, cg) = (input.pick(&[4u32, 8]), input.pick(&[32u32, 64, 128]));
            let h = cg as u64 * (input.below(256) as u64 + 1);
            let i = cg as u64 * (input.below(256) as u64 + 1);
            oracle_canonical(h, i, cb, cg).unwrap()
        }
    };
    let edits = input.below(4);
    for _ in 0..edits {
        let f = input.below(9);
        let v = fields(&l)[f];
        let nv = match input.u8() % 10 {
            0 => v.wrapping_add(16),
            1 => v.wrapping_sub(16),
            2 => v.wrapping_add(1),
            3 => v.wrapping_add(SLOT_ALIGN as u64),
            4 => input.pick(&[0u64, (1 << 53) - 1, 1 << 53, u64::MAX, u64::MAX - 15]),
            5 => fields(&l)[input.below(9)],
            6 => input.u64(),
            7 => v / 2,
            8 => v.wrapping_mul(2),
            _ => v.wrapping_sub(SLOT_ALIGN as u64),
        };
        set_field(&mut l, f, nv);
    }
    let how = input.u8() % 16;
    // NULL, an unaligned copy inside a byte buffer, or the struct itself.
    let mut buf = vec![0u8; std::mem::size_of::<mlxk_glm52_layout>() + 1];
    let status = match how {
        15 => unsafe { mlxk_glm52_layout_validate(std::ptr::null(), bits, group) },
        14 => unsafe {
            let p = buf.as_mut_ptr().add(1) as *mut mlxk_glm52_layout;
            p.write_unaligned(l);
            mlxk_glm52_layout_validate(p, bits, group)
        },
        _ => unsafe { mlxk_glm52_layout_validate(&l, bits, group) },
    };
    check_status("mlxk_glm52_layout_validate", status);
    if how == 15 {
        assert_eq!(status, MLXK_ERR_NULL_POINTER);
        return;
    }
    let valid = oracle_valid(&l, bits, group);
    if valid {
        assert_eq!(
            status,
            MLXK_OK,
            "a safe layout was refused: {} ({l:?}, Q{bits}/{group})",
            last_error()
        );
    } else {
        assert_eq!(
            status, MLXK_ERR_INVALID_ARGUMENT,
            "an unsafe layout was accepted: {l:?}, Q{bits}/{group}"
        );
    }
}

pub fn run(input: &mut Input) {
    // The documented GLM-5 example.
    let mut l = mlxk_glm52_layout::default();
    assert_eq!(
        unsafe { mlxk_glm52_layout_canonical(6144, 2048, 4, 64, &mut l) },
        MLXK_OK
    );
    assert_eq!(Some(l), oracle_canonical(6144, 2048, 4, 64));
    assert_eq!(
        (
            l.gate_weight_offset,
            l.up_weight_offset,
            l.down_weight_offset,
            l.gate_scale_offset,
            l.up_scale_offset,
            l.down_scale_offset,
            l.slot_bytes
        ),
        (0, 6291456, 12582912, 18874368, 19267584, 19660800, 20054016)
    );
    for _ in 0..MAX_OPS {
        if input.exhausted() {
            break;
        }
        if input.u8() % 3 == 0 {
            call_canonical(input);
        } else {
            call_validate(input);
        }
    }
}

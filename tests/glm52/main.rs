//! The GLM-5.2 expert-slot layout through the C ABI: docs/DESIGN.md §4's table, every kind of rejection
//! with its message, and a randomized comparison of mlxk_glm52_layout_validate() with a
//! deliberately simple checker written here (loops over regions, u128 arithmetic).
//!
//! The random tests draw a fresh seed each run and print it on failure; MLXK_TEST_SEED=<u64>
//! replays one.

#[path = "../support/mod.rs"]
mod support;

use std::ffi::CStr;
use std::ptr;

use mlxkern::capi::glm52::*;
use mlxkern::capi::status::*;
use support::Rng;

const MAX_SAFE: u64 = (1 << 53) - 1;
const SLOT_ALIGN: u64 = 16384;
const FORMATS: [(u32, u32); 6] = [(4, 32), (4, 64), (4, 128), (8, 32), (8, 64), (8, 128)];
const GLM5_HIDDEN: u64 = 6144;
const GLM5_INTERMEDIATE: u64 = 2048;

/// Region names in canonical order: gate, up, down weights, then gate, up, down scales.
const REGIONS: [&str; 6] = [
    "gate weight",
    "up weight",
    "down weight",
    "gate scale",
    "up scale",
    "down scale",
];
/// The field index (struct order) of each region's offset, in canonical order.
const REGION_FIELD: [usize; 6] = [4, 5, 3, 7, 8, 6];
/// Field names as the messages spell them, in struct order.
const FIELDS: [&str; 9] = [
    "hidden size",
    "intermediate size",
    "slot bytes",
    "down weight offset",
    "gate weight offset",
    "up weight offset",
    "down scale offset",
    "gate scale offset",
    "up scale offset",
];

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

fn from_fields(f: [u64; 9]) -> mlxk_glm52_layout {
    mlxk_glm52_layout {
        hidden_size: f[0],
        intermediate_size: f[1],
        slot_bytes: f[2],
        down_weight_offset: f[3],
        gate_weight_offset: f[4],
        up_weight_offset: f[5],
        down_scale_offset: f[6],
        gate_scale_offset: f[7],
        up_scale_offset: f[8],
    }
}

fn offset(l: &mlxk_glm52_layout, region: usize) -> u64 {
    fields(l)[REGION_FIELD[region]]
}

fn set_offset(l: &mut mlxk_glm52_layout, region: usize, value: u64) {
    let mut f = fields(l);
    f[REGION_FIELD[region]] = value;
    *l = from_fields(f);
}

fn last_error() -> String {
    // SAFETY: mlxk_last_error() never returns NULL.
    unsafe { CStr::from_ptr(mlxk_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// `value` on MLXK_OK, else the status and the library's message.
fn outcome<T>(status: mlxk_status, value: T) -> Result<T, (mlxk_status, String)> {
    match status {
        MLXK_OK => Ok(value),
        _ => Err((status, last_error())),
    }
}

fn canonical(
    hidden: u64,
    intermediate: u64,
    bits: u32,
    group_size: u32,
) -> Result<mlxk_glm52_layout, (mlxk_status, String)> {
    let mut out = mlxk_glm52_layout::default();
    let status =
        unsafe { mlxk_glm52_layout_canonical(hidden, intermediate, bits, group_size, &mut out) };
    outcome(status, out)
}

fn validate(
    layout: &mlxk_glm52_layout,
    bits: u32,
    group_size: u32,
) -> Result<(), (mlxk_status, String)> {
    let status = unsafe { mlxk_glm52_layout_validate(layout, bits, group_size) };
    outcome(status, ())
}

fn glm5(bits: u32, group_size: u32) -> mlxk_glm52_layout {
    canonical(GLM5_HIDDEN, GLM5_INTERMEDIATE, bits, group_size).unwrap()
}

/// Asserts the error `want` whose message begins with `expected` after `function`.
#[track_caller]
fn assert_refused<T: std::fmt::Debug>(
    result: Result<T, (mlxk_status, String)>,
    want: mlxk_status,
    function: &str,
    expected: &str,
) {
    let (status, message) = result.expect_err(expected);
    assert_eq!(status, want, "{message}");
    let want = format!("{function}: {expected}");
    assert!(
        message.starts_with(&want),
        "got {message:?}, expected it to start with {want:?}"
    );
}

fn assert_rejected(layout: &mlxk_glm52_layout, bits: u32, group_size: u32, expected: &str) {
    let result = validate(layout, bits, group_size);
    let invalid = MLXK_ERR_INVALID_ARGUMENT;
    assert_refused(result, invalid, "mlxk_glm52_layout_validate", expected);
}

fn assert_canonical_rejected(hidden: u64, inter: u64, bits: u32, group_size: u32, expected: &str) {
    let result = canonical(hidden, inter, bits, group_size);
    let invalid = MLXK_ERR_INVALID_ARGUMENT;
    assert_refused(result, invalid, "mlxk_glm52_layout_canonical", expected);
}

// ---- The independent model ----------------------------------------------------------------

/// Byte length of canonical region `region` (u128: dims up to 2^53 cannot overflow it).
fn reference_length(
    hidden: u64,
    intermediate: u64,
    bits: u32,
    group_size: u32,
    region: usize,
) -> u128 {
    let (h, i, g) = (hidden as u128, intermediate as u128, group_size as u128);
    // [rows, cols] with cols the input width; weights first, then scales.
    let (rows, cols) = match region % 3 {
        0 | 1 => (i, h),
        _ => (h, i),
    };
    if region < 3 {
        rows * cols * bits as u128 / 8
    } else {
        rows * (cols / g) * 2
    }
}

/// Accepts exactly the layouts docs/DESIGN.md §4 allows. Written independently of the library: one
/// pass per rule, every region against every other.
fn reference_accepts(l: &mlxk_glm52_layout, bits: u32, group_size: u32) -> bool {
    if bits != 4 && bits != 8 {
        return false;
    }
    if group_size != 32 && group_size != 64 && group_size != 128 {
        return false;
    }
    for value in fields(l) {
        if value > MAX_SAFE {
            return false;
        }
    }
    let g = group_size as u64;
    let (hidden, intermediate, slot) = (l.hidden_size, l.intermediate_size, l.slot_bytes);
    if hidden == 0 || intermediate == 0 || hidden % g != 0 || intermediate % g != 0 {
        return false;
    }
    if slot == 0 || slot % SLOT_ALIGN != 0 {
        return false;
    }
    let mut spans = [(0u128, 0u128); 6];
    for (region, span) in spans.iter_mut().enumerate() {
        let start = offset(l, region) as u128;
        let end = start + reference_length(hidden, intermediate, bits, group_size, region);
        if start % 16 != 0 || end > slot as u128 || end > MAX_SAFE as u128 {
            return false;
        }
        *span = (start, end);
    }
    for a in 0..6 {
        for b in 0..6 {
            if a != b && spans[a].0.max(spans[b].0) < spans[a].1.min(spans[b].1) {
                return false;
            }
        }
    }
    true
}

/// The canonical layout as docs/DESIGN.md §4 states it, or None where it must be refused.
fn reference_canonical(
    hidden: u64,
    intermediate: u64,
    bits: u32,
    group_size: u32,
) -> Option<mlxk_glm52_layout> {
    if !FORMATS.contains(&(bits, group_size)) || hidden > MAX_SAFE || intermediate > MAX_SAFE {
        return None;
    }
    let g = group_size as u64;
    if hidden == 0 || intermediate == 0 || hidden % g != 0 || intermediate % g != 0 {
        return None;
    }
    let align = |x: u128| x.div_ceil(SLOT_ALIGN as u128) * SLOT_ALIGN as u128;
    let mut f = [hidden, intermediate, 0, 0, 0, 0, 0, 0, 0];
    let mut end = 0u128;
    for region in 0..6 {
        let start = align(end);
        if start > MAX_SAFE as u128 {
            return None;
        }
        f[REGION_FIELD[region]] = start as u64;
        end = start + reference_length(hidden, intermediate, bits, group_size, region);
    }
    let slot = align(end);
    if slot > MAX_SAFE as u128 {
        return None;
    }
    f[2] = slot as u64;
    Some(from_fields(f))
}

// ---- docs/DESIGN.md §4's table and canonical layouts ----------------------------------------------

#[test]
fn slot_alignment_constant() {
    assert_eq!(MLXK_GLM52_EXPERT_SLOT_ALIGNMENT, 16384);
}

/// GLM-5's 4-bit and 8-bit layouts (group 64): the regions' offsets and the slot's bytes.
#[test]
fn design_table_q4_and_q8_g64() {
    #[rustfmt::skip]
    let rows: [(u32, [u64; 6], u64); 2] = [
        (4, [0, 6291456, 12582912, 18874368, 19267584, 19660800], 20054016),
        (8, [0, 12582912, 25165824, 37748736, 38141952, 38535168], 38928384),
    ];
    for (bits, offsets, slot_bytes) in rows {
        let l = glm5(bits, 64);
        let got: Vec<u64> = (0..6).map(|r| offset(&l, r)).collect();
        assert_eq!(got, offsets, "q{bits}");
        assert_eq!(l.slot_bytes, slot_bytes, "q{bits}");
        assert_eq!((l.hidden_size, l.intermediate_size), (6144, 2048));
    }
    // The 4-bit layout field by field, in struct order.
    assert_eq!(
        fields(&glm5(4, 64)),
        [6144, 2048, 20054016, 12582912, 0, 6291456, 19660800, 18874368, 19267584]
    );
}

#[test]
fn design_table_slot_bytes() {
    let expected = [
        ((4, 32), 21233664),
        ((4, 64), 20054016),
        ((4, 128), 19464192),
        ((8, 32), 40108032),
        ((8, 64), 38928384),
        ((8, 128), 38338560),
    ];
    for ((bits, group_size), slot_bytes) in expected {
        let l = glm5(bits, group_size);
        assert_eq!(l.slot_bytes, slot_bytes, "Q{bits} g{group_size}");
        assert_eq!(
            Some(l),
            reference_canonical(GLM5_HIDDEN, GLM5_INTERMEDIATE, bits, group_size),
            "Q{bits} g{group_size}"
        );
        validate(&l, bits, group_size).unwrap();
    }
}

#[test]
fn canonical_layouts_validate_and_match_the_model() {
    for (bits, group_size) in FORMATS {
        let g = group_size as u64;
        for hidden in [g, 2 * g, 3 * g, 384, 4096, 6144, 7168] {
            for intermediate in [g, 5 * g, 768, 2048, 18432] {
                let l = canonical(hidden, intermediate, bits, group_size).unwrap();
                assert_eq!(
                    Some(l),
                    reference_canonical(hidden, intermediate, bits, group_size)
                );
                validate(&l, bits, group_size).unwrap();
                assert!(reference_accepts(&l, bits, group_size));
                for region in 0..6 {
                    assert_eq!(offset(&l, region) % SLOT_ALIGN, 0);
                }
            }
        }
    }
}

#[test]
fn regions_may_touch_and_come_in_any_order() {
    // Tightly packed, reversed order, 16-byte aligned only.
    let (bits, group_size) = (4, 64);
    let mut l = glm5(bits, group_size);
    let mut end = 0u64;
    for region in (0..6).rev() {
        set_offset(&mut l, region, end);
        end += reference_length(GLM5_HIDDEN, GLM5_INTERMEDIATE, bits, group_size, region) as u64;
    }
    l.slot_bytes = end.div_ceil(SLOT_ALIGN) * SLOT_ALIGN;
    validate(&l, bits, group_size).unwrap();
}

#[test]
fn largest_safe_slot_is_accepted() {
    // A slot ending at the last 16 KiB boundary below 2^53, regions packed at its top.
    let (bits, group_size) = (8, 128);
    let mut l = glm5(bits, group_size);
    l.slot_bytes = (MAX_SAFE + 1) - SLOT_ALIGN;
    let mut end = l.slot_bytes;
    for region in 0..6 {
        end -= reference_length(GLM5_HIDDEN, GLM5_INTERMEDIATE, bits, group_size, region) as u64;
        set_offset(&mut l, region, end);
    }
    validate(&l, bits, group_size).unwrap();
}

// ---- Each kind of rejection, with its message ---------------------------------------------

#[test]
fn region_exceeding_the_slot() {
    for region in 0..6 {
        let mut l = glm5(4, 64);
        let last = l.slot_bytes - 16;
        set_offset(&mut l, region, last);
        let expected = format!("{} exceeds the canonical expert slot", REGIONS[region]);
        assert_rejected(&l, 4, 64, &expected);
    }
    // A slot one page short cuts the last region.
    let mut l = glm5(8, 32);
    l.slot_bytes -= SLOT_ALIGN;
    assert_rejected(&l, 8, 32, "down scale exceeds the canonical expert slot");
    // The Q4 layout read as Q8: the weights double and the down weight leaves the slot.
    let l = glm5(4, 64);
    assert_rejected(&l, 8, 64, "down weight exceeds the canonical expert slot");
}

#[test]
fn every_pair_of_overlapping_regions() {
    for later in 1..6 {
        for earlier in 0..later {
            let expected = format!("{} overlaps {}", REGIONS[later], REGIONS[earlier]);
            // Same start.
            let mut l = glm5(4, 64);
            let start = offset(&l, earlier);
            set_offset(&mut l, later, start);
            assert_rejected(&l, 4, 64, &expected);
            // Sharing the last 16 bytes of the earlier region.
            let mut l = glm5(4, 64);
            let earlier_end = offset(&l, earlier)
                + reference_length(GLM5_HIDDEN, GLM5_INTERMEDIATE, 4, 64, earlier) as u64;
            set_offset(&mut l, later, earlier_end - 16);
            assert_rejected(&l, 4, 64, &expected);
        }
    }
    // The example docs/DESIGN.md §4 quotes.
    let mut l = glm5(8, 64);
    l.up_scale_offset = l.down_weight_offset + 4096;
    assert_rejected(&l, 8, 64, "up scale overlaps down weight");
    // An earlier region placed over a later one is reported from the later one's side.
    let mut l = glm5(8, 64);
    l.gate_scale_offset = l.down_scale_offset;
    assert_rejected(&l, 8, 64, "down scale overlaps gate scale");
}

#[test]
fn misaligned_offsets() {
    for region in 0..6 {
        for delta in [1, 8, 15] {
            let mut l = glm5(8, 128);
            let moved = offset(&l, region) + delta;
            set_offset(&mut l, region, moved);
            let expected = format!("{} offset is not 16-byte aligned", REGIONS[region]);
            assert_rejected(&l, 8, 128, &expected);
        }
    }
}

#[test]
fn slot_bytes_not_a_positive_multiple_of_16384() {
    let l = glm5(4, 32);
    for slot_bytes in [0, 16, 16383, l.slot_bytes + 16, l.slot_bytes - 1, MAX_SAFE] {
        let bad = mlxk_glm52_layout { slot_bytes, ..l };
        let expected = format!("slot bytes {slot_bytes} must be a positive multiple of 16384");
        assert_rejected(&bad, 4, 32, &expected);
    }
}

#[test]
fn fields_above_2_pow_53_minus_1() {
    for (field, name) in FIELDS.iter().enumerate() {
        for value in [MAX_SAFE + 1, 1 << 60, u64::MAX] {
            let mut f = fields(&glm5(4, 64));
            f[field] = value;
            assert_rejected(&from_fields(f), 4, 64, &format!("{name} exceeds 2^53-1"));
        }
    }
    // A safe offset whose region ends past 2^53-1.
    let mut l = glm5(4, 64);
    l.slot_bytes = (MAX_SAFE + 1) - SLOT_ALIGN;
    l.gate_weight_offset = (MAX_SAFE + 1) - 16;
    assert_rejected(&l, 4, 64, "gate weight offset + length exceeds 2^53-1");
}

#[test]
fn unsupported_bits_and_group_size() {
    let l = glm5(4, 64);
    for bits in [0, 1, 2, 3, 5, 7, 16, 32, u32::MAX] {
        let expected = format!("bits is {bits} (expected 4 or 8)");
        assert_rejected(&l, bits, 64, &expected);
        assert_canonical_rejected(6144, 2048, bits, 64, &expected);
    }
    for group_size in [0, 1, 16, 48, 96, 256, u32::MAX] {
        let expected = format!("group_size is {group_size} (expected 32, 64 or 128)");
        assert_rejected(&l, 4, group_size, &expected);
        assert_canonical_rejected(6144, 2048, 8, group_size, &expected);
    }
    // bits is checked first.
    assert_rejected(&l, 3, 16, "bits is 3");
}

#[test]
fn dims_not_a_positive_multiple_of_group_size() {
    let l = glm5(4, 64);
    for hidden_size in [0, 1, 32, 6144 + 32, 6143] {
        let bad = mlxk_glm52_layout { hidden_size, ..l };
        let expected =
            format!("hidden size {hidden_size} must be a positive multiple of group_size 64");
        assert_rejected(&bad, 4, 64, &expected);
        let expected = format!("hidden {hidden_size} must be a positive multiple of group_size 64");
        assert_canonical_rejected(hidden_size, 2048, 4, 64, &expected);
    }
    for intermediate_size in [0, 96, 2047] {
        let bad = mlxk_glm52_layout {
            intermediate_size,
            ..l
        };
        let expected = format!(
            "intermediate size {intermediate_size} must be a positive multiple of group_size 64"
        );
        assert_rejected(&bad, 4, 64, &expected);
        let expected = format!(
            "intermediate {intermediate_size} must be a positive multiple of group_size 64"
        );
        assert_canonical_rejected(6144, intermediate_size, 4, 64, &expected);
    }
    // The same dims are fine with a smaller group.
    canonical(6144 + 32, 96, 4, 32).unwrap();
}

#[test]
fn canonical_too_large_for_javascript() {
    assert_canonical_rejected(u64::MAX, 2048, 4, 64, "hidden exceeds 2^53-1");
    assert_canonical_rejected(2048, MAX_SAFE + 1, 4, 64, "intermediate exceeds 2^53-1");
    assert_canonical_rejected(
        1 << 30,
        1 << 30,
        8,
        32,
        "the canonical slot for hidden 1073741824, intermediate 1073741824 (Q8 group_size 32) \
         exceeds 2^53-1 bytes",
    );
    let top = MAX_SAFE - 127; // a multiple of 128
    assert_canonical_rejected(top, top, 4, 128, "the canonical slot");
    assert_canonical_rejected(128, top, 4, 128, "the canonical slot");
}

#[test]
fn null_pointers() {
    let null = MLXK_ERR_NULL_POINTER;
    let status = unsafe { mlxk_glm52_layout_canonical(6144, 2048, 4, 64, ptr::null_mut()) };
    let refused = outcome(status, ());
    assert_refused(refused, null, "mlxk_glm52_layout_canonical", "out is NULL");
    let status = unsafe { mlxk_glm52_layout_validate(ptr::null(), 4, 64) };
    let (refused, function) = (outcome(status, ()), "mlxk_glm52_layout_validate");
    assert_refused(refused, null, function, "layout is NULL");
    // NULL is reported before a bad format.
    let status = unsafe { mlxk_glm52_layout_validate(ptr::null(), 3, 16) };
    assert_eq!(status, MLXK_ERR_NULL_POINTER);
    let status = unsafe { mlxk_glm52_layout_canonical(0, 0, 3, 16, ptr::null_mut()) };
    assert_eq!(status, MLXK_ERR_NULL_POINTER);
}

#[test]
fn canonical_writes_nothing_on_failure() {
    let sentinel = from_fields([0xA5A5_A5A5_A5A5_A5A5; 9]);
    for (hidden, intermediate, bits, group_size) in [
        (6144, 2048, 3, 64),
        (6144, 2048, 4, 0),
        (6100, 2048, 4, 64),
        (1 << 40, 1 << 40, 8, 32),
    ] {
        let mut out = sentinel;
        let status = unsafe {
            mlxk_glm52_layout_canonical(hidden, intermediate, bits, group_size, &mut out)
        };
        assert_eq!(status, MLXK_ERR_INVALID_ARGUMENT);
        assert_eq!(out, sentinel);
    }
}

// ---- Random layouts against the model -----------------------------------------------------

/// xorshift64* (Vigna): small, fast, good enough to spread test cases.
fn seed() -> u64 {
    match std::env::var("MLXK_TEST_SEED") {
        Ok(text) => text.parse().expect("MLXK_TEST_SEED must be a u64"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    }
}

/// Values at and around every boundary the validator has.
const SPECIAL: [u64; 20] = [
    0,
    1,
    15,
    16,
    17,
    32,
    64,
    2048,
    6144,
    16384,
    16400,
    (1 << 53) - 16384,
    (1 << 53) - 16,
    MAX_SAFE,
    1 << 53,
    (1 << 53) + 16,
    1 << 63,
    u64::MAX - 15,
    u64::MAX - 16383,
    u64::MAX,
];

/// A format: mostly supported ones, some not.
fn random_format(rng: &mut Rng) -> (u32, u32) {
    if rng.chance(94) {
        rng.pick(&FORMATS)
    } else {
        rng.pick(&[
            (0, 64),
            (3, 64),
            (16, 32),
            (4, 0),
            (4, 16),
            (8, 256),
            (u32::MAX, 128),
            (8, u32::MAX),
        ])
    }
}

fn random_value(rng: &mut Rng) -> u64 {
    match rng.below(7) {
        0 | 1 => rng.pick(&SPECIAL),
        2 => rng.next_u64(),
        3 => rng.below(1 << 54),
        4 => rng.below(1 << 26) & !15,
        5 => rng.below(1 << 14) * SLOT_ALIGN,
        _ => rng.below(1 << 12) * 32,
    }
}

/// A layout for some supported format (the tested one most of the time), then 0 to 3 changes.
fn perturbed_layout(rng: &mut Rng, bits: u32, group_size: u32) -> mlxk_glm52_layout {
    let (base_bits, base_group) = if FORMATS.contains(&(bits, group_size)) && rng.chance(85) {
        (bits, group_size)
    } else {
        rng.pick(&FORMATS)
    };
    let g = base_group as u64;
    let (hidden, intermediate) = match rng.below(10) {
        0 => (GLM5_HIDDEN, GLM5_INTERMEDIATE),
        1 => (g * (1 + rng.below(512)), g * (1 + rng.below(16))),
        _ => (g * (1 + rng.below(64)), g * (1 + rng.below(64))),
    };
    let lengths: Vec<u64> = (0..6)
        .map(|r| reference_length(hidden, intermediate, base_bits, base_group, r) as u64)
        .collect();
    let mut l = canonical(hidden, intermediate, base_bits, base_group).unwrap();
    for _ in 0..rng.below(4) {
        let region = rng.below(6) as usize;
        match rng.below(9) {
            // Shift one offset by a little, or by about a region.
            0 | 1 => {
                let delta = rng.pick(&[
                    1,
                    8,
                    16,
                    32,
                    4096,
                    16384,
                    lengths[region],
                    lengths[region] - 16,
                ]);
                let o = offset(&l, region);
                let moved = if rng.chance(50) {
                    o.wrapping_add(delta)
                } else {
                    o.wrapping_sub(delta)
                };
                set_offset(&mut l, region, moved);
            }
            // Swap two offsets.
            2 => {
                let other = rng.below(6) as usize;
                let (a, b) = (offset(&l, region), offset(&l, other));
                set_offset(&mut l, region, b);
                set_offset(&mut l, other, a);
            }
            // Pack tightly in a random order, with small gaps or none.
            3 | 4 => {
                let mut order = [0, 1, 2, 3, 4, 5];
                for i in (1..6).rev() {
                    order.swap(i, rng.below(i as u64 + 1) as usize);
                }
                let mut end = 16 * rng.below(3);
                for &r in &order {
                    let start = end + 16 * rng.pick(&[0, 0, 0, 1, 2]);
                    set_offset(&mut l, r, start);
                    end = start + lengths[r];
                }
                l.slot_bytes = end.div_ceil(SLOT_ALIGN) * SLOT_ALIGN + SLOT_ALIGN * rng.below(2);
            }
            // Resize the slot.
            5 => {
                let s = l.slot_bytes;
                l.slot_bytes = rng.pick(&[
                    s.wrapping_sub(SLOT_ALIGN),
                    s.wrapping_add(SLOT_ALIGN),
                    s.wrapping_add(16),
                    s.wrapping_sub(16),
                    s.wrapping_add(4096),
                    s.wrapping_add(8192),
                    s / SLOT_ALIGN / 2 * SLOT_ALIGN,
                    0,
                ]);
            }
            // Change the dims (the region lengths follow).
            6 => {
                let (h, i) = (l.hidden_size, l.intermediate_size);
                (l.hidden_size, l.intermediate_size) = rng.pick(&[
                    (h.wrapping_add(g), i),
                    (h, i.wrapping_add(g)),
                    (h.wrapping_sub(g), i),
                    (h.wrapping_add(1), i),
                    (i, h),
                    (h.wrapping_mul(2), i),
                    (h, i.wrapping_mul(2)),
                ]);
            }
            // Move everything up against 2^53 (valid when the slot ends at the last page).
            7 => {
                let room = (MAX_SAFE + 1).saturating_sub(l.slot_bytes) / SLOT_ALIGN;
                let lift = room.saturating_sub(rng.below(2)) * SLOT_ALIGN;
                for r in 0..6 {
                    let lifted = offset(&l, r).wrapping_add(lift);
                    set_offset(&mut l, r, lifted);
                }
                l.slot_bytes = l.slot_bytes.wrapping_add(lift + SLOT_ALIGN * rng.below(2));
            }
            // One field becomes a boundary value.
            _ => {
                let mut f = fields(&l);
                f[rng.below(9) as usize] = rng.pick(&SPECIAL);
                l = from_fields(f);
            }
        }
    }
    l
}

/// Small dims and a slot of random pages with random 16-byte aligned offsets: often valid, often
/// overlapping.
fn scattered_layout(rng: &mut Rng, group_size: u32) -> mlxk_glm52_layout {
    let g = if group_size == 0 || group_size > 128 {
        32
    } else {
        group_size as u64
    };
    let slot = SLOT_ALIGN * (1 + rng.below(512));
    let mut f = [
        g * (1 + rng.below(6)),
        g * (1 + rng.below(6)),
        slot,
        0,
        0,
        0,
        0,
        0,
        0,
    ];
    for field in f.iter_mut().skip(3) {
        *field = rng.below(slot / 16) * 16;
    }
    from_fields(f)
}

/// What each rejection message says, one entry per check (the first that matches counts).
const REJECTIONS: [&str; 9] = [
    "bits is",
    "group_size is",
    "offset + length exceeds 2^53-1",
    " exceeds 2^53-1 (",
    "must be a positive multiple of 16384",
    "must be a positive multiple of group_size",
    "is not 16-byte aligned",
    "exceeds the canonical expert slot",
    "overlaps",
];

#[test]
fn random_layouts_match_the_model() {
    const CASES: usize = 200_000;
    let seed = seed();
    let mut rng = Rng::mixed(seed);
    let mut accepted = 0usize;
    let mut rejected_by = [0usize; REJECTIONS.len()];
    for case in 0..CASES {
        let (bits, group_size) = random_format(&mut rng);
        let l = match rng.below(20) {
            0..=11 => perturbed_layout(&mut rng, bits, group_size),
            12..=15 => scattered_layout(&mut rng, group_size),
            _ => {
                let mut f = [0u64; 9];
                for value in f.iter_mut() {
                    *value = random_value(&mut rng);
                }
                from_fields(f)
            }
        };
        let expected = reference_accepts(&l, bits, group_size);
        let result = validate(&l, bits, group_size);
        let context =
            || format!("seed {seed}, case {case}: Q{bits} g{group_size} {l:?}: {result:?}");
        if let Err((status, message)) = &result {
            assert_ne!(*status, MLXK_ERR_PANIC, "{}", context());
            assert_eq!(*status, MLXK_ERR_INVALID_ARGUMENT, "{}", context());
            assert!(
                message.starts_with("mlxk_glm52_layout_validate: "),
                "{}",
                context()
            );
            let kind = REJECTIONS.iter().position(|k| message.contains(k));
            rejected_by[kind.unwrap_or_else(|| panic!("unexpected message: {}", context()))] += 1;
        }
        assert_eq!(result.is_ok(), expected, "{}", context());
        accepted += usize::from(expected);
    }
    let rejected: usize = rejected_by.iter().sum();
    eprintln!(
        "random layouts: {CASES} checked (seed {seed}), {accepted} accepted, {rejected} rejected"
    );
    for (kind, count) in REJECTIONS.iter().zip(rejected_by) {
        eprintln!("  {count:>7} {kind:?}");
    }
    // Both outcomes, and every reason to reject, are well represented, so agreement means
    // something.
    assert!(
        accepted > CASES / 10 && rejected > CASES / 10,
        "{accepted} accepted, {rejected} rejected"
    );
    for (kind, count) in REJECTIONS.iter().zip(rejected_by) {
        assert!(
            count >= 100,
            "only {count} rejections {kind:?} (seed {seed})"
        );
    }
}

#[test]
fn random_canonical_dims_match_the_model() {
    const CASES: usize = 20_000;
    let seed = seed() ^ 0x9E37_79B9_7F4A_7C15;
    let mut rng = Rng::mixed(seed);
    let mut made = 0usize;
    for case in 0..CASES {
        let (bits, group_size) = random_format(&mut rng);
        let dim = |rng: &mut Rng| match rng.below(6) {
            0 => rng.pick(&SPECIAL),
            1 => rng.next_u64(),
            2 => 32 * (1 + rng.below(1 << 20)),
            3 => 128 << rng.below(50),
            _ => 128 * (1 + rng.below(1 << 12)),
        };
        let (hidden, intermediate) = (dim(&mut rng), dim(&mut rng));
        let expected = reference_canonical(hidden, intermediate, bits, group_size);
        let result = canonical(hidden, intermediate, bits, group_size);
        let context = || {
            format!("seed {seed}, case {case}: {hidden} x {intermediate} Q{bits} g{group_size}: {result:?}")
        };
        match (&result, expected) {
            (Ok(l), Some(want)) => {
                assert_eq!(*l, want, "{}", context());
                assert!(validate(l, bits, group_size).is_ok(), "{}", context());
                made += 1;
            }
            (Err((status, _)), None) => {
                assert_eq!(*status, MLXK_ERR_INVALID_ARGUMENT, "{}", context())
            }
            _ => panic!("{}", context()),
        }
    }
    eprintln!("random canonical dims: {CASES} checked (seed {seed}), {made} layouts made");
    assert!(made > CASES / 10, "{made}");
}

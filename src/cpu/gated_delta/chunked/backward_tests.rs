//! The chunked backward against the exact one (`gated_delta::backward`), on every product
//! kernel the CPU has.

use super::{chunked_backward_with, ChunkSize, Products};
use crate::cpu::gated_delta::backward::{backward, Inputs};
use crate::cpu::gated_delta::Dims;

/// xorshift, uniform in [-1, 1).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| scale * self.next()).collect()
    }
}

struct Case {
    d: Dims,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    state: Option<Vec<f32>>,
    mask: Option<Vec<u8>>,
    dy: Vec<f32>,
    dstate_out: Option<Vec<f32>>,
}

fn case(seed: u64, d: Dims, with_state: bool, with_mask: bool, tiny: bool) -> Case {
    let mut r = Rng(seed | 1);
    let qk = d.b * d.t * d.hk * d.dk;
    let gates = d.b * d.t * d.hv;
    let scale = 1.0 / (d.dk as f32).sqrt();
    Case {
        d,
        q: r.vec(qk, scale),
        k: r.vec(qk, scale),
        v: r.vec(d.b * d.t * d.hv * d.dv, 1.0),
        g: (0..gates)
            .map(|i| match tiny && i % 5 == 2 {
                true => [0.0, 1e-30, 1e-20][i % 3],
                false => 0.7 + 0.3 * r.next().abs(),
            })
            .collect(),
        beta: (0..gates).map(|_| 0.2 + 0.8 * r.next().abs()).collect(),
        state: with_state.then(|| r.vec(d.b * d.hv * d.dv * d.dk, 0.5)),
        mask: with_mask.then(|| {
            (0..d.b * d.t)
                .map(|i| (i % 3 != 1 && i / d.t.max(1) != 1) as u8)
                .collect()
        }),
        dy: r.vec(d.b * d.t * d.hv * d.dv, 1.0),
        dstate_out: Some(r.vec(d.b * d.hv * d.dv * d.dk, 0.3)),
    }
}

fn inputs(c: &Case) -> Inputs<'_> {
    Inputs {
        d: c.d,
        q: &c.q,
        k: &c.k,
        v: &c.v,
        g: &c.g,
        beta: &c.beta,
        state: c.state.as_deref(),
        mask: c.mask.as_deref(),
        dy: &c.dy,
        dstate_out: c.dstate_out.as_deref(),
    }
}

fn close(name: &str, got: &[f32], want: &[f32], rel: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{name}");
    let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-30);
    for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
        assert!(a.is_finite(), "{name}[{i}] = {a} ({what})");
        assert!(
            (a - b).abs() <= rel * scale,
            "{name}[{i}] {a} vs {b} (largest {scale}; {what})"
        );
    }
}

#[test]
fn matches_the_exact_backward() {
    let shapes = [
        (1, 5, 1, 1, 32, 3),
        (2, 37, 1, 2, 32, 5),
        (1, 70, 2, 4, 64, 16),
        (2, 50, 2, 6, 32, 17),
        (1, 33, 1, 1, 256, 7),
    ];
    let kinds = [Products::Portable, Products::Avx2, Products::Fastest];
    for (n, &(b, t, hk, hv, dk, dv)) in shapes.iter().enumerate() {
        let d = Dims {
            b,
            t,
            hk,
            hv,
            dk,
            dv,
        };
        for (state, mask, tiny) in [
            (true, false, false),
            (false, true, false),
            (true, true, true),
        ] {
            let c = case(0x51 + n as u64, d, state, mask, tiny);
            let x = inputs(&c);
            let exact = backward(&x, 0);
            let dlog: Vec<f32> = exact.dg.iter().zip(&c.g).map(|(a, b)| a * b).collect();
            for chunk in [16, 32, 64, 128] {
                for kind in kinds {
                    let got = chunked_backward_with(&x, ChunkSize::new(chunk).unwrap(), kind);
                    let what = format!("{d:?} state {state} mask {mask} tiny {tiny} chunk {chunk}");
                    close("dq", &got.dq, &exact.dq, 1e-4, &what);
                    close("dk", &got.dk, &exact.dk, 1e-4, &what);
                    close("dv", &got.dv, &exact.dv, 1e-4, &what);
                    close("dlog_g", &got.dlog_g, &dlog, 1e-4, &what);
                    close("dbeta", &got.dbeta, &exact.dbeta, 1e-4, &what);
                    close("dstate", &got.dstate, &exact.dstate, 1e-4, &what);
                }
            }
        }
    }
}

/// `chunked_backward_into` on bfloat16, float16 and float32 inputs and outputs that hold NaN on
/// entry: every element is written (masked tokens' gradients are zeros), and each gradient is
/// the float32 backward's on the inputs rounded the same way, rounded to the output's dtype.
#[test]
fn writes_every_output_in_its_dtype() {
    use super::{chunked_backward_into, ChunkedInputs, ChunkedOuts};
    use crate::cpu::elem::{round_to, Elem, Floats, FloatsMut};
    use half::{bf16, f16};

    type Wrap<T> = for<'a> fn(&'a [T]) -> Floats<'a>;
    type WrapMut<T> = for<'a> fn(&'a mut [T]) -> FloatsMut<'a>;

    fn check<T: Elem>(seed: u64, d: Dims, wrap: Wrap<T>, out: WrapMut<T>) {
        let mut c = case(seed, d, seed.is_multiple_of(2), true, false);
        for x in [&mut c.q, &mut c.k, &mut c.v, &mut c.dy] {
            x.iter_mut().for_each(|v| *v = round_to::<T>(*v));
        }
        let narrow = |x: &[f32]| x.iter().map(|&v| T::from_f32(v)).collect::<Vec<T>>();
        let (q, k, v, dy) = (narrow(&c.q), narrow(&c.k), narrow(&c.v), narrow(&c.dy));
        let want =
            chunked_backward_with(&inputs(&c), ChunkSize::new(32).unwrap(), Products::Fastest);
        let x = ChunkedInputs {
            dy: wrap(&dy),
            q: wrap(&q),
            k: wrap(&k),
            v: wrap(&v),
            ..ChunkedInputs::f32(&inputs(&c))
        };
        let nan = |n: usize| vec![T::from_f32(f32::NAN); n];
        let (mut dq, mut dk, mut dv) = (nan(c.q.len()), nan(c.k.len()), nan(c.v.len()));
        let mut dlog_g = vec![f32::NAN; c.g.len()];
        let mut dbeta = vec![f32::NAN; c.g.len()];
        let mut dstate = vec![f32::NAN; want.dstate.len()];
        let outs = ChunkedOuts {
            dq: out(&mut dq),
            dk: out(&mut dk),
            dv: out(&mut dv),
            dlog_g: &mut dlog_g,
            dbeta: &mut dbeta,
            dstate: &mut dstate,
        };
        chunked_backward_into(&x, ChunkSize::new(32).unwrap(), Products::Fastest, outs);
        let bits = |x: &[T]| x.iter().map(|v| v.to_f32().to_bits()).collect::<Vec<u32>>();
        let bits32 = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
        assert_eq!(bits(&dq), bits(&narrow(&want.dq)), "dq {d:?}");
        assert_eq!(bits(&dk), bits(&narrow(&want.dk)), "dk {d:?}");
        assert_eq!(bits(&dv), bits(&narrow(&want.dv)), "dv {d:?}");
        assert_eq!(bits32(&dlog_g), bits32(&want.dlog_g), "dlog_g {d:?}");
        assert_eq!(bits32(&dbeta), bits32(&want.dbeta), "dbeta {d:?}");
        assert_eq!(bits32(&dstate), bits32(&want.dstate), "dstate {d:?}");
        let masked = c.mask.as_ref().unwrap().iter().filter(|&&m| m == 0).count();
        assert!(masked > 0, "the case masks tokens");
    }
    let shapes = [
        (2, 40, 1, 2, 32, 5),
        (1, 70, 2, 4, 64, 16),
        (3, 9, 2, 2, 32, 33),
    ];
    for (n, &(b, t, hk, hv, dk, dv)) in shapes.iter().enumerate() {
        let d = Dims {
            b,
            t,
            hk,
            hv,
            dk,
            dv,
        };
        let seed = 0x77 + n as u64;
        check::<f32>(seed, d, |x| Floats::F32(x), |x| FloatsMut::F32(x));
        check::<bf16>(seed, d, |x| Floats::Bf16(x), |x| FloatsMut::Bf16(x));
        check::<f16>(seed, d, |x| Floats::F16(x), |x| FloatsMut::F16(x));
    }
}

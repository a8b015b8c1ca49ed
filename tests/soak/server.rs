//! One simulated server: a pool of N states, the set of live sequences, and the rounds an engine
//! runs on it (admissions by packed prefill, evictions, decode steps, verify + commit, draft
//! trees: `tree`). Every pool call is checked at once against the dense per-sequence calls
//! (`mlxk_gated_delta_update`, `_chunked`) on a host copy of each slot's state: y and the state
//! bit for bit, and every slot of the pool, touched or not, equal to its copy. The copies are only ever written from the
//! dense calls' results, so nothing of the pool feeds its own reference.

use std::ptr::{null, null_mut};

use crate::capi::*;
use crate::exact::{self, Gates, Tokens};
use mlxkern::testing::{fail_cpu_kernel, Fault};

/// The share of decode steps that fail on purpose at evaluation (`Server::fault`).
const FAULT_CHANCE: f64 = 0.01;

mod tree;

/// Heads and widths of one server's layer.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
}

/// The kinds of round, in the order of `Stats::rounds`. A new kind is one more entry here, its
/// weight in `Server::pick` and its arm in `Server::round`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Admit,
    Evict,
    Decode,
    Verify,
    Tree,
}

pub const KINDS: [Kind; 5] = [
    Kind::Admit,
    Kind::Evict,
    Kind::Decode,
    Kind::Verify,
    Kind::Tree,
];

#[derive(Debug, Default, Clone)]
pub struct Stats {
    /// Rounds run, per `KINDS`.
    pub rounds: [u64; KINDS.len()],
    /// Pool calls (each checked against the dense calls).
    pub pool_calls: u64,
    /// Verify calls (the pool calls that write no state).
    pub verify_calls: u64,
    /// Dense reference calls.
    pub ref_calls: u64,
    /// Tokens through the pool calls (verify windows and commits counted once each).
    pub tokens: u64,
    /// Slot states compared bit for bit with their reference.
    pub slots_compared: u64,
    /// Calls in the chunked (WY) form.
    pub chunked_calls: u64,
    /// Sequences admitted (fresh) and evicted.
    pub admitted: u64,
    pub evicted: u64,
    /// Decode steps failed on purpose at evaluation (`FAULT_CHANCE`), each leaving every slot
    /// as it was.
    pub faults: u64,
    /// Float32 servers: the largest |state - float64 state| over every live sequence after
    /// every call, that state's largest |value| then, and the longest sequence followed.
    pub drift: f64,
    pub drift_scale: f64,
    pub longest: u64,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        for (a, b) in self.rounds.iter_mut().zip(o.rounds) {
            *a += b;
        }
        self.pool_calls += o.pool_calls;
        self.verify_calls += o.verify_calls;
        self.ref_calls += o.ref_calls;
        self.tokens += o.tokens;
        self.slots_compared += o.slots_compared;
        self.chunked_calls += o.chunked_calls;
        self.admitted += o.admitted;
        self.evicted += o.evicted;
        self.faults += o.faults;
        if o.drift > self.drift {
            self.drift = o.drift;
            self.drift_scale = o.drift_scale;
        }
        self.longest = self.longest.max(o.longest);
    }
}

/// One sequence's tokens for a call: q, k [T, Hk, Dk], v [T, Hv, Dv], a, b [T, Hv], each value
/// representable in the server's element type.
struct Seq {
    t: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
}

impl Seq {
    /// Random tokens as a layer feeds them: q and k L2-normalized per head (q scaled by
    /// Dk^-1/2), v and the gates uniform.
    fn random(rng: &mut Rng, d: Dims, elem: Elem, t: usize) -> Seq {
        let mut heads = |scale: f32| {
            let mut x: Vec<f32> = (0..t * d.hk * d.dk).map(|_| rng.uniform()).collect();
            for head in x.chunks_mut(d.dk) {
                let n = head.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
                head.iter_mut()
                    .for_each(|v| *v = elem.round(*v * scale / n));
            }
            x
        };
        let q = heads((d.dk as f32).powf(-0.5));
        let k = heads(1.0);
        let mut uni = |n: usize, s: f32| -> Vec<f32> {
            (0..n).map(|_| elem.round(rng.uniform() * s)).collect()
        };
        let v = uni(t * d.hv * d.dv, 1.0);
        let a = uni(t * d.hv, 2.0);
        let b = uni(t * d.hv, 2.0);
        Seq { t, q, k, v, a, b }
    }

    /// The first `n` tokens.
    fn prefix(&self, n: usize) -> Seq {
        let cut = |x: &[f32]| x[..x.len() / self.t.max(1) * n].to_vec();
        Seq {
            t: n,
            q: cut(&self.q),
            k: cut(&self.k),
            v: cut(&self.v),
            a: cut(&self.a),
            b: cut(&self.b),
        }
    }
}

/// q, k, v, a, b of `seqs` laid one after another under the leading dims `lead`.
fn stack(
    scope: &mut Scope,
    seqs: &[&Seq],
    lead: [usize; 2],
    d: Dims,
    elem: Elem,
) -> Result<[H; 5], String> {
    let cat = |f: fn(&Seq) -> &Vec<f32>| {
        seqs.iter()
            .flat_map(|s| f(s).iter().copied())
            .collect::<Vec<f32>>()
    };
    let [l0, l1] = lead;
    Ok([
        scope.array(&cat(|s| &s.q), &[l0, l1, d.hk, d.dk], elem)?,
        scope.array(&cat(|s| &s.k), &[l0, l1, d.hk, d.dk], elem)?,
        scope.array(&cat(|s| &s.v), &[l0, l1, d.hv, d.dv], elem)?,
        scope.array(&cat(|s| &s.a), &[l0, l1, d.hv], elem)?,
        scope.array(&cat(|s| &s.b), &[l0, l1, d.hv], elem)?,
    ])
}

/// The pool update of `x = [q, k, v, a, b, A_log, dt_bias, pool]` on `slots` in `form`.
fn update_pool(
    form: Form,
    x: [H; 8],
    slots: &[i32],
    m: *const mlxk_array,
    y: &mut H,
    o: &mut H,
) -> mlxk_status {
    let [q, k, v, a, b, al, dt, p] = x;
    let (s, n, z) = (slots.as_ptr(), slots.len(), null());
    // SAFETY: every pointer is valid for the call; the outputs are written once.
    unsafe {
        match form {
            Form::Exact => mlxk_gated_delta_update_pool(q, k, v, a, b, al, dt, p, s, z, n, m, y, o),
            Form::Chunked(c) => {
                mlxk_gated_delta_update_pool_chunked(q, k, v, a, b, al, dt, p, s, z, n, m, c, y, o)
            }
        }
    }
}

/// The pool form of a call: exact, or chunked with a chunk size (0: the default).
#[derive(Debug, Clone, Copy)]
enum Form {
    Exact,
    Chunked(i32),
}

impl Form {
    fn random(rng: &mut Rng, p_chunked: f64) -> Form {
        if crate::chunked_forms() && rng.chance(p_chunked) {
            Form::Chunked([0, 16, 32, 64][rng.below(4)])
        } else {
            Form::Exact
        }
    }
}

pub struct Server {
    pub name: String,
    d: Dims,
    elem: Elem,
    n: usize,
    pool: H,
    a_log: H,
    dt_bias: H,
    /// Each slot's state as the dense calls left it (bits of float32 [Hv, Dv, Dk]).
    mirror: Vec<Vec<u32>>,
    live: Vec<bool>,
    /// Float32 servers: each sequence's state in float64 from its admission, and its length.
    gates: Option<Gates>,
    exact: Vec<Option<(Vec<f64>, u64)>>,
    pub stats: Stats,
    round_no: u64,
}

/// The drift allowed: |state - float64 state| at most this times max(1, largest |value|).
/// The recurrence forgets (g < 0.99 with these gates, unit-norm keys), so rounding does not
/// pile up with length: measured, about 1e-7 over sequences of 10^5 tokens and more.
pub const DRIFT_BOUND: f64 = 1e-5;

// SAFETY: handles are tokens the library looks up under its own lock; any thread may use them.
unsafe impl Send for Server {}

impl Server {
    /// A server of `n` slots whose pool starts as random bits (earlier tenants' states).
    pub fn new(name: &str, d: Dims, elem: Elem, n: usize, rng: &mut Rng) -> Result<Server, String> {
        let per = d.hv * d.dv * d.dk;
        let init: Vec<f32> = (0..n * per).map(|_| rng.uniform() * 0.5).collect();
        let pool = new_array(&init, &[n, d.hv, d.dv, d.dk], Elem::F32)?;
        let a_log: Vec<f32> = (0..d.hv).map(|_| rng.uniform()).collect();
        let dt: Vec<f32> = (0..d.hv).map(|_| rng.uniform()).collect();
        Ok(Server {
            name: name.into(),
            d,
            elem,
            n,
            pool,
            a_log: new_array(&a_log, &[d.hv], Elem::F32)?,
            dt_bias: new_array(&dt, &[d.hv], Elem::F32)?,
            mirror: init
                .chunks(per)
                .map(|c| c.iter().map(|x| x.to_bits()).collect())
                .collect(),
            live: vec![false; n],
            gates: (elem == Elem::F32).then(|| Gates {
                a_log: a_log.iter().map(|&x| f64::from(x)).collect(),
                dt_bias: dt.iter().map(|&x| f64::from(x)).collect(),
            }),
            exact: (0..n).map(|_| None).collect(),
            stats: Stats::default(),
            round_no: 0,
        })
    }

    /// Shows that the checks can fail: a reference copy one bit off, or a y byte off, is
    /// reported (then the copy is restored).
    pub fn self_test(&mut self, rng: &mut Rng) -> Result<(), String> {
        let slot = rng.below(self.n);
        let i = rng.below(self.mirror[slot].len());
        self.mirror[slot][i] ^= 1;
        let caught = self.check_pool().is_err();
        self.mirror[slot][i] ^= 1;
        if !caught {
            return Err(format!(
                "{}: a slot one bit off its reference passed",
                self.name
            ));
        }
        self.check_pool()?;
        if Self::same_y(&[1, 2, 3], &[1, 2, 4], "self test").is_ok() {
            return Err("a y one byte off its reference passed".into());
        }
        Ok(())
    }

    /// Follows slot `slot` in float64 over `seq` (from zeros when `fresh`) and checks its
    /// reference copy, just updated from the dense call, against it.
    fn follow(
        &mut self,
        slot: usize,
        seq: &Seq,
        mask: Option<&[bool]>,
        fresh: bool,
    ) -> Result<(), String> {
        let Some(gates) = &self.gates else {
            return Ok(());
        };
        let d = self.d;
        if fresh {
            self.exact[slot] = Some((vec![0.0; d.hv * d.dv * d.dk], 0));
        }
        let Some((state, len)) = &mut self.exact[slot] else {
            return Ok(());
        };
        let x = Tokens {
            t: seq.t,
            k: &seq.k,
            v: &seq.v,
            a: &seq.a,
            b: &seq.b,
        };
        exact::advance(state, &x, mask, gates, d.hk, d.hv, d.dk, d.dv);
        *len += mask.map_or(seq.t, |m| m.iter().filter(|&&l| l).count()) as u64;
        let (err, scale) = exact::deviation(&self.mirror[slot], state);
        self.stats.longest = self.stats.longest.max(*len);
        if err > self.stats.drift {
            self.stats.drift = err;
            self.stats.drift_scale = scale;
        }
        if err > DRIFT_BOUND * scale.max(1.0) {
            return Err(format!(
                "slot {slot}: after {len} tokens the state is {err:e} from float64 (largest \
                 value {scale:e}); allowed {DRIFT_BOUND:e} times max(1, that)"
            ));
        }
        Ok(())
    }

    fn live_slots(&self) -> Vec<usize> {
        (0..self.n).filter(|&s| self.live[s]).collect()
    }

    fn free_slots(&self) -> Vec<usize> {
        (0..self.n).filter(|&s| !self.live[s]).collect()
    }

    /// A kind of round fitting the pool's occupancy: admissions when few sequences are live,
    /// evictions when it is full, decode, verify and trees in between.
    pub fn pick(&self, rng: &mut Rng) -> Kind {
        let live = self.live_slots().len();
        if live == 0 {
            return Kind::Admit;
        }
        let free = self.n - live;
        let admit = if free == 0 { 0 } else { 1 + 3 * free / self.n };
        let evict = if free == 0 { 3 } else { 1 };
        let weights = [admit, evict, 6, 4, 2];
        let total: usize = weights.iter().sum();
        let mut r = rng.below(total);
        for (kind, w) in KINDS.iter().zip(weights) {
            if r < w {
                return *kind;
            }
            r -= w;
        }
        Kind::Decode
    }

    /// Runs one round of `kind` and checks it; Err names the server, round and what differed.
    pub fn round(&mut self, rng: &mut Rng, kind: Kind) -> Result<(), String> {
        self.round_no += 1;
        let r = match kind {
            Kind::Admit => self.admit(rng),
            Kind::Evict => {
                self.evict(rng);
                Ok(())
            }
            Kind::Decode => self.decode(rng),
            Kind::Verify => self.verify(rng),
            Kind::Tree => self.tree(rng),
        };
        self.stats.rounds[KINDS.iter().position(|&k| k == kind).unwrap()] += 1;
        r.map_err(|e| format!("{} round {} ({kind:?}): {e}", self.name, self.round_no))
    }

    /// The dense call on one sequence from `state` (None: zeros): y's bytes and the state's bits.
    fn dense(
        &mut self,
        seq: &Seq,
        state: Option<&[u32]>,
        mask: Option<&[bool]>,
        form: Form,
    ) -> Result<(Vec<u8>, Vec<u32>), String> {
        let d = self.d;
        let mut scope = Scope::default();
        let [q, k, v, a, b] = stack(&mut scope, &[seq], [1, seq.t], d, self.elem)?;
        let st = match state {
            Some(bits) => {
                let vals: Vec<f32> = bits.iter().map(|&x| f32::from_bits(x)).collect();
                scope.array(&vals, &[1, d.hv, d.dv, d.dk], Elem::F32)?
            }
            None => null_mut(),
        };
        let m = match mask {
            Some(m) => scope.keep(new_bool(m, &[1, seq.t])?),
            None => null_mut(),
        };
        let (mut y, mut s) = (null_mut(), null_mut());
        let (al, dt) = (self.a_log, self.dt_bias);
        let status = unsafe {
            match form {
                Form::Exact => {
                    mlxk_gated_delta_update(q, k, v, a, b, al, dt, st, m, &mut y, &mut s)
                }
                Form::Chunked(c) => {
                    mlxk_gated_delta_update_chunked(q, k, v, a, b, al, dt, st, m, c, &mut y, &mut s)
                }
            }
        };
        check("dense reference", status)?;
        scope.keep(y);
        scope.keep(s);
        self.stats.ref_calls += 1;
        Ok((read_bytes(y)?, read_bits(s)?))
    }

    /// Replaces the pool by `next`, freeing the old handle first (the in-place rule), and
    /// checks every slot against its reference copy.
    fn swap_and_check(&mut self, next: H) -> Result<(), String> {
        free(self.pool)?;
        self.pool = next;
        self.check_pool()
    }

    fn check_pool(&mut self) -> Result<(), String> {
        let bits = read_bits(self.pool)?;
        let per = self.d.hv * self.d.dv * self.d.dk;
        for (slot, (got, want)) in bits.chunks(per).zip(&self.mirror).enumerate() {
            if let Some(i) = (0..per).find(|&i| got[i] != want[i]) {
                return Err(format!(
                    "pool slot {slot} ({}): element {i} is {:e} ({:#010x}), its dense reference \
                     {:e} ({:#010x})",
                    if self.live[slot] { "live" } else { "free" },
                    f32::from_bits(got[i]),
                    got[i],
                    f32::from_bits(want[i]),
                    want[i]
                ));
            }
        }
        self.stats.slots_compared += self.n as u64;
        Ok(())
    }

    /// Compares one row's y bytes with the reference's; `what` names the row.
    fn same_y(got: &[u8], want: &[u8], what: &str) -> Result<(), String> {
        if got == want {
            return Ok(());
        }
        let i = (0..got.len()).find(|&i| got[i] != want.get(i).copied().unwrap_or(!got[i]));
        Err(format!(
            "{what}: y differs from the dense reference at byte {i:?} of {}",
            got.len()
        ))
    }

    /// Admission: one packed prefill of new sequences (fresh, into free slots), continuations
    /// of live ones (chunked prefill of a long prompt), maybe a padding sequence and an empty
    /// one, in a random order.
    fn admit(&mut self, rng: &mut Rng) -> Result<(), String> {
        let (d, elem) = (self.d, self.elem);
        let mut idle = self.free_slots();
        let mut live = self.live_slots();
        rng.shuffle(&mut idle);
        rng.shuffle(&mut live);
        let n_new = rng.range(if idle.is_empty() { 0 } else { 1 }, idle.len().min(3));
        let n_cont = rng.range(0, live.len().min(2));
        // (slot, fresh, tokens)
        let mut parts: Vec<(i32, bool, Seq)> = Vec::new();
        for &s in &idle[..n_new] {
            let t = rng.range(1, 48);
            parts.push((s as i32, true, Seq::random(rng, d, elem, t)));
        }
        for &s in &live[..n_cont] {
            let t = if rng.chance(0.15) {
                0
            } else {
                rng.range(1, 24)
            };
            parts.push((s as i32, false, Seq::random(rng, d, elem, t)));
        }
        if rng.chance(0.2) {
            let t = rng.range(1, 8);
            parts.push((-1, false, Seq::random(rng, d, elem, t)));
        }
        rng.shuffle(&mut parts);
        let form = Form::random(rng, 0.5);
        let mut cu = vec![0i32];
        for p in &parts {
            cu.push(cu.last().unwrap() + p.2.t as i32);
        }
        let total = *cu.last().unwrap() as usize;
        let slots: Vec<i32> = parts.iter().map(|p| p.0).collect();
        let fresh: Vec<u8> = parts.iter().map(|p| u8::from(p.1)).collect();
        let seqs: Vec<&Seq> = parts.iter().map(|p| &p.2).collect();

        let mut scope = Scope::default();
        let [q, k, v, a, b] = stack(&mut scope, &seqs, [1, total], d, elem)?;
        let (mut y, mut next) = (null_mut(), null_mut());
        let (al, dt, pool) = (self.a_log, self.dt_bias, self.pool);
        let (cp, sp, fp, ncu) = (cu.as_ptr(), slots.as_ptr(), fresh.as_ptr(), cu.len());
        let status = unsafe {
            match form {
                Form::Exact => mlxk_gated_delta_update_packed(
                    q, k, v, a, b, al, dt, pool, cp, ncu, sp, fp, &mut y, &mut next,
                ),
                Form::Chunked(c) => mlxk_gated_delta_update_packed_chunked(
                    q, k, v, a, b, al, dt, pool, cp, ncu, sp, fp, c, &mut y, &mut next,
                ),
            }
        };
        check(
            &format!("packed prefill {form:?}, cu_seqlens {cu:?}, slots {slots:?}"),
            status,
        )?;
        scope.keep(y);
        self.count_call(form, total);
        // The old pool goes before anything is evaluated.
        free(self.pool)?;
        self.pool = next;
        let y_bytes = read_bytes(y)?;
        let row = d.hv * d.dv * elem.bytes();
        for (i, (slot, is_fresh, seq)) in parts.iter().enumerate() {
            let got = &y_bytes[cu[i] as usize * row..cu[i + 1] as usize * row];
            let what = format!("sequence {i} (slot {slot}, {} tokens, {form:?})", seq.t);
            if *slot < 0 {
                if got.iter().any(|&x| x != 0) {
                    return Err(format!("{what}: a padding sequence's y is not zeros"));
                }
                continue;
            }
            let s = *slot as usize;
            if seq.t == 0 {
                continue;
            }
            let start = if *is_fresh {
                None
            } else {
                Some(self.mirror[s].clone())
            };
            let (y_ref, state) = self.dense(seq, start.as_deref(), None, form)?;
            Self::same_y(got, &y_ref, &what)?;
            self.mirror[s] = state;
            self.follow(s, seq, None, *is_fresh)?;
            if *is_fresh {
                self.live[s] = true;
                self.stats.admitted += 1;
            }
        }
        self.check_pool()
    }

    /// Eviction: one or two live sequences end (their slots keep their bits until reused).
    fn evict(&mut self, rng: &mut Rng) {
        // A float32 server never evicts slot 0: one sequence lives the whole run, to measure
        // drift over a long life.
        let mut live: Vec<usize> = self
            .live_slots()
            .into_iter()
            .filter(|&s| s != 0 || self.gates.is_none())
            .collect();
        if live.is_empty() {
            return;
        }
        rng.shuffle(&mut live);
        let n = if rng.chance(0.03) {
            live.len()
        } else {
            rng.range(1, live.len().min(2))
        };
        for &s in &live[..n.min(live.len())] {
            self.live[s] = false;
            self.exact[s] = None;
            self.stats.evicted += 1;
        }
    }

    /// Random live slots for one batch, shuffled, with a padding row (-1) now and then.
    fn batch_slots(&self, rng: &mut Rng, most: usize) -> Vec<i32> {
        let mut live = self.live_slots();
        rng.shuffle(&mut live);
        let n = rng.range(1, live.len().min(most));
        let mut slots: Vec<i32> = live[..n].iter().map(|&s| s as i32).collect();
        if rng.chance(0.2) {
            let at = rng.below(slots.len() + 1);
            slots.insert(at, -1);
        }
        slots
    }

    /// A decode step over a random subset of live slots: one token each, or a few tokens in
    /// the chunked form now and then; a mask on some rounds.
    fn decode(&mut self, rng: &mut Rng) -> Result<(), String> {
        let (d, elem) = (self.d, self.elem);
        let slots = self.batch_slots(rng, 6);
        let bsz = slots.len();
        let (t, form) = if rng.chance(0.25) {
            (rng.range(2, 6), Form::random(rng, 0.6))
        } else {
            (1, Form::random(rng, 0.15))
        };
        let mask: Option<Vec<bool>> = rng
            .chance(0.25)
            .then(|| (0..bsz * t).map(|_| rng.chance(0.8)).collect());
        let seqs: Vec<Seq> = (0..bsz).map(|_| Seq::random(rng, d, elem, t)).collect();
        let refs: Vec<&Seq> = seqs.iter().collect();
        let mut scope = Scope::default();
        let [q, k, v, a, b] = stack(&mut scope, &refs, [bsz, t], d, elem)?;
        let m = match &mask {
            Some(m) => scope.keep(new_bool(m, &[bsz, t])?),
            None => null(),
        };
        let (mut y, mut next) = (null_mut(), null_mut());
        let x = [q, k, v, a, b, self.a_log, self.dt_bias, self.pool];
        let status = update_pool(form, x, &slots, m, &mut y, &mut next);
        check(&format!("decode {form:?}, T {t}, slots {slots:?}"), status)?;
        scope.keep(y);
        free(self.pool)?;
        self.pool = next;
        if rng.chance(FAULT_CHANCE) {
            return self.fault(rng, y);
        }
        self.count_call(form, bsz * t);
        let y_bytes = read_bytes(y)?;
        let row = t * d.hv * d.dv * elem.bytes();
        for (i, &slot) in slots.iter().enumerate() {
            let got = &y_bytes[i * row..(i + 1) * row];
            let what = format!(
                "row {i} (slot {slot}, T {t}, {form:?}, mask {})",
                mask.is_some()
            );
            if slot < 0 {
                if got.iter().any(|&x| x != 0) {
                    return Err(format!("{what}: a padding row's y is not zeros"));
                }
                continue;
            }
            let s = slot as usize;
            let start = self.mirror[s].clone();
            let row_mask = mask.as_ref().map(|m| &m[i * t..(i + 1) * t]);
            let (y_ref, state) = self.dense(&seqs[i], Some(&start), row_mask, form)?;
            Self::same_y(got, &y_ref, &what)?;
            self.mirror[s] = state;
            self.follow(s, &seqs[i], row_mask, false)?;
        }
        self.check_pool()
    }

    /// Speculative decoding: verify a window of T drafts per row (y of every draft, no state
    /// written), then commit a random accepted prefix of each row into its slot.
    fn verify(&mut self, rng: &mut Rng) -> Result<(), String> {
        let (d, elem) = (self.d, self.elem);
        let slots = self.batch_slots(rng, 4);
        let bsz = slots.len();
        let t = rng.range(1, 6);
        let seqs: Vec<Seq> = (0..bsz).map(|_| Seq::random(rng, d, elem, t)).collect();
        let refs: Vec<&Seq> = seqs.iter().collect();
        let mut scope = Scope::default();
        let [q, k, v, a, b] = stack(&mut scope, &refs, [bsz, t], d, elem)?;
        let (al, dt) = (self.a_log, self.dt_bias);
        let mut y = null_mut();
        let status = unsafe {
            mlxk_gated_delta_verify_pool(
                q,
                k,
                v,
                a,
                b,
                al,
                dt,
                self.pool,
                slots.as_ptr(),
                null(),
                bsz,
                null(),
                &mut y,
            )
        };
        check(&format!("verify T {t}, slots {slots:?}"), status)?;
        scope.keep(y);
        self.count_call(Form::Exact, bsz * t);
        self.stats.verify_calls += 1;
        let y_bytes = read_bytes(y)?;
        let row = t * d.hv * d.dv * elem.bytes();
        for (i, &slot) in slots.iter().enumerate() {
            let got = &y_bytes[i * row..(i + 1) * row];
            let what = format!("verify row {i} (slot {slot}, T {t})");
            if slot < 0 {
                if got.iter().any(|&x| x != 0) {
                    return Err(format!("{what}: a padding row's y is not zeros"));
                }
                continue;
            }
            let start = self.mirror[slot as usize].clone();
            let (y_ref, _) = self.dense(&seqs[i], Some(&start), None, Form::Exact)?;
            Self::same_y(got, &y_ref, &what)?;
        }
        // A verify writes nothing.
        self.check_pool()?;

        let accepted: Vec<i32> = (0..bsz).map(|_| rng.range(0, t) as i32).collect();
        let mut next = null_mut();
        let status = unsafe {
            mlxk_gated_delta_state_pool(
                k,
                v,
                a,
                b,
                al,
                dt,
                self.pool,
                slots.as_ptr(),
                null(),
                accepted.as_ptr(),
                bsz,
                &mut next,
            )
        };
        check(
            &format!("commit accepted {accepted:?}, slots {slots:?}"),
            status,
        )?;
        self.stats.pool_calls += 1;
        self.stats.tokens += accepted.iter().map(|&n| n as u64).sum::<u64>();
        for (i, &slot) in slots.iter().enumerate() {
            let n = accepted[i] as usize;
            if slot < 0 || n == 0 {
                continue;
            }
            let start = self.mirror[slot as usize].clone();
            let prefix = seqs[i].prefix(n);
            let (_, state) = self.dense(&prefix, Some(&start), None, Form::Exact)?;
            self.mirror[slot as usize] = state;
            self.follow(slot as usize, &prefix, None, false)?;
        }
        self.swap_and_check(next)
    }

    /// The decode step whose results are `y` and `self.pool` (the old pool freed) fails at
    /// evaluation (an injected fault, at its node's evaluation or in its task, reported by
    /// either result): the step is not applied, every slot keeps its reference state.
    fn fault(&mut self, rng: &mut Rng, y: H) -> Result<(), String> {
        let stage = match rng.chance(0.5) {
            true => Fault::AtEval,
            false => Fault::InTask,
        };
        fail_cpu_kernel(Some((0, stage)));
        let failing = if rng.chance(0.5) { y } else { self.pool };
        let status = mlxk_array_eval(failing);
        fail_cpu_kernel(None);
        match check("the faulted decode step", status) {
            Err(e) if e.contains("injected fault") => {}
            other => return Err(format!("a decode step failed with {stage:?}: {other:?}")),
        }
        self.stats.faults += 1;
        self.check_pool()
    }

    fn count_call(&mut self, form: Form, tokens: usize) {
        self.stats.pool_calls += 1;
        self.stats.tokens += tokens as u64;
        if matches!(form, Form::Chunked(_)) {
            self.stats.chunked_calls += 1;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        for a in [self.pool, self.a_log, self.dt_bias] {
            mlxk_array_free(a);
        }
    }
}

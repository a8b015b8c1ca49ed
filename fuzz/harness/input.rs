//! Decoding fuzz bytes into choices. Reading past the end gives zeros, so every input, however
//! short, decodes to a complete (often trivial) call sequence.

pub struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Input { data, pos: 0 }
    }

    pub fn exhausted(&self) -> bool {
        self.pos >= self.data.len()
    }

    pub fn u8(&mut self) -> u8 {
        match self.data.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                b
            }
            None => 0,
        }
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    pub fn u64(&mut self) -> u64 {
        (self.u32() as u64) | ((self.u32() as u64) << 32)
    }

    /// Uniform-ish in `0..n` (0 when n <= 1).
    pub fn below(&mut self, n: usize) -> usize {
        match n {
            0 | 1 => 0,
            2..=256 => self.u8() as usize % n,
            257..=65536 => self.u16() as usize % n,
            _ => self.u32() as usize % n,
        }
    }

    /// True with probability `num / 256`; false once the input is exhausted (zero bytes pick
    /// the ordinary case everywhere).
    pub fn chance(&mut self, num: u8) -> bool {
        self.u8() as u16 + num as u16 > 255
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

/// splitmix64: bulk data (array contents) comes from a seed taken from the input, so that a
/// few input bytes describe arrays of thousands of elements.
pub struct Fill(u64);

impl Fill {
    pub fn new(seed: u64) -> Self {
        Fill(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

//! An adaptive binary range coder (the LZMA design: 32-bit range, 11-bit
//! probabilities adapted by 1/32 per bit, carry propagation through a
//! cached byte) and bit-tree symbol coding on top of it. The storage codec
//! of the compact reference rows (`execute::qgref`) codes each row's tail
//! levels with it: the probabilities adapt along the vocabulary, so a
//! tokenizer whose ids follow frequency (BPE merges) costs fewer bits than
//! a static order-0 model of the same row would.
//!
//! Contract: `decode(encode(symbols))` is `symbols` for every input; a
//! truncated or altered stream decodes to some symbols without panicking
//! (the sealed file around it is what detects damage).

/// Bits of a probability.
const PROB_BITS: u32 = 11;
/// One (probability 1 of a zero bit).
const PROB_ONE: u16 = 1 << PROB_BITS;
/// Adaptation shift.
const MOVE_BITS: u32 = 5;
/// Normalisation threshold of the range.
const TOP: u32 = 1 << 24;

/// An adaptive probability that the next bit is 0, in 1/2048ths.
#[derive(Debug, Clone, Copy)]
pub struct Prob(u16);

impl Default for Prob {
    fn default() -> Self {
        Prob(PROB_ONE / 2)
    }
}

/// The encoder, writing into a byte vector.
pub struct Encoder {
    low: u64,
    range: u32,
    cache: u8,
    cache_size: u64,
    out: Vec<u8>,
}

impl Default for Encoder {
    fn default() -> Self {
        Encoder {
            low: 0,
            range: u32::MAX,
            cache: 0,
            cache_size: 1,
            out: Vec::new(),
        }
    }
}

impl Encoder {
    fn shift_low(&mut self) {
        if (self.low as u32) < 0xFF00_0000 || (self.low >> 32) != 0 {
            let carry = (self.low >> 32) as u8;
            let mut temp = self.cache;
            loop {
                self.out.push(temp.wrapping_add(carry));
                temp = 0xFF;
                self.cache_size -= 1;
                if self.cache_size == 0 {
                    break;
                }
            }
            self.cache = ((self.low >> 24) & 0xFF) as u8;
        }
        self.cache_size += 1;
        self.low = (self.low & 0x00FF_FFFF) << 8;
    }

    /// Code `bit` with probability `p` (then adapted).
    #[inline]
    pub fn bit(&mut self, p: &mut Prob, bit: bool) {
        let bound = (self.range >> PROB_BITS) * u32::from(p.0);
        if bit {
            self.low += u64::from(bound);
            self.range -= bound;
            p.0 -= p.0 >> MOVE_BITS;
        } else {
            self.range = bound;
            p.0 += (PROB_ONE - p.0) >> MOVE_BITS;
        }
        if self.range < TOP {
            self.range <<= 8;
            self.shift_low();
        }
    }

    /// Code the low `bits` bits of `symbol`, most significant first, down
    /// the bit tree `tree` (`1 << bits` probabilities; index 0 unused).
    #[inline]
    pub fn symbol(&mut self, tree: &mut [Prob], bits: u32, symbol: u32) {
        let mut m = 1usize;
        for i in (0..bits).rev() {
            let b = (symbol >> i) & 1 == 1;
            self.bit(&mut tree[m], b);
            m = (m << 1) | usize::from(b);
        }
    }

    /// The coded bytes.
    pub fn finish(mut self) -> Vec<u8> {
        for _ in 0..5 {
            self.shift_low();
        }
        self.out
    }
}

/// The decoder, reading from a byte slice (past its end: zeros).
pub struct Decoder<'a> {
    code: u32,
    range: u32,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Decoder<'a> {
    /// A decoder of `bytes` (an [`Encoder::finish`] output).
    pub fn new(bytes: &'a [u8]) -> Self {
        let mut d = Decoder {
            code: 0,
            range: u32::MAX,
            bytes,
            at: 0,
        };
        for _ in 0..5 {
            d.code = (d.code << 8) | u32::from(d.next());
        }
        d
    }

    #[inline]
    fn next(&mut self) -> u8 {
        let b = self.bytes.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }

    /// Bytes read so far (past the end counts too).
    pub fn consumed(&self) -> usize {
        self.at
    }

    /// The next bit, coded with probability `p` (then adapted).
    #[inline]
    pub fn bit(&mut self, p: &mut Prob) -> bool {
        let bound = (self.range >> PROB_BITS) * u32::from(p.0);
        let bit = if self.code < bound {
            self.range = bound;
            p.0 += (PROB_ONE - p.0) >> MOVE_BITS;
            false
        } else {
            self.code -= bound;
            self.range -= bound;
            p.0 -= p.0 >> MOVE_BITS;
            true
        };
        if self.range < TOP {
            self.range <<= 8;
            self.code = (self.code << 8) | u32::from(self.next());
        }
        bit
    }

    /// The next `bits`-bit symbol down the bit tree `tree`.
    #[inline]
    pub fn symbol(&mut self, tree: &mut [Prob], bits: u32) -> u32 {
        let mut m = 1usize;
        for _ in 0..bits {
            m = (m << 1) | usize::from(self.bit(&mut tree[m]));
        }
        (m - (1 << bits)) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Symbols of a skewed, drifting source round-trip, and cost about
    /// their entropy; a constant source costs next to nothing.
    #[test]
    fn symbols_round_trip_near_their_entropy() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) as u32
        };
        // Geometric-ish over 64 symbols, its parameter drifting.
        let n = 50_000;
        let symbols: Vec<u32> = (0..n)
            .map(|i| {
                let r = next() % 1000;
                let shift = if i < n / 2 { 0 } else { 20 };
                ((r * r / 16_000) + shift).min(63)
            })
            .collect();
        let mut tree = vec![Prob::default(); 64];
        let mut e = Encoder::default();
        for &s in &symbols {
            e.symbol(&mut tree, 6, s);
        }
        let bytes = e.finish();
        let mut tree = vec![Prob::default(); 64];
        let mut d = Decoder::new(&bytes);
        let back: Vec<u32> = (0..n).map(|_| d.symbol(&mut tree, 6)).collect();
        assert_eq!(back, symbols);
        // Order-0 entropy of each half (the source is stationary within it).
        let entropy = |s: &[u32]| {
            let mut c = [0f64; 64];
            for &x in s {
                c[x as usize] += 1.0;
            }
            let n = s.len() as f64;
            c.iter()
                .filter(|&&k| k > 0.0)
                .map(|&k| -k * (k / n).log2())
                .sum::<f64>()
                / 8.0
        };
        let ideal = entropy(&symbols[..n / 2]) + entropy(&symbols[n / 2..]);
        let got = bytes.len() as f64;
        assert!(got < ideal * 1.03 + 64.0, "{got} bytes, entropy {ideal}");
        let mut e = Encoder::default();
        let mut tree = vec![Prob::default(); 64];
        for _ in 0..n {
            e.symbol(&mut tree, 6, 5);
        }
        // The floor of an 11-bit probability: −log2(2017/2048) ≈ 0.022
        // bits per binary decision, 6 per symbol: ~830 bytes for 50,000.
        assert!(e.finish().len() < 1000);
    }

    /// Damage decodes to something, never a panic.
    #[test]
    fn damaged_streams_do_not_panic() {
        let mut e = Encoder::default();
        let mut tree = vec![Prob::default(); 16];
        for s in 0..1000u32 {
            e.symbol(&mut tree, 4, s % 16);
        }
        let mut bytes = e.finish();
        bytes.truncate(bytes.len() / 2);
        bytes[3] ^= 0x55;
        let mut tree = vec![Prob::default(); 16];
        let mut d = Decoder::new(&bytes);
        for _ in 0..1000 {
            assert!(d.symbol(&mut tree, 4) < 16);
        }
    }
}

//! Static rANS (Duda's asymmetric numeral systems, byte-wise with a
//! 32-bit state as in Giesen's `rans_byte`, probabilities in 1/2^14): the
//! entropy coder of the compact reference rows (`execute::qgref`), one
//! table lookup per symbol to decode. The model is the row's own symbol
//! counts, which the store keeps beside the code. An adaptive binary range
//! coder (LZMA's bit trees, with and without the previous level as
//! context) was measured against an ideal order-0 coder on the SmolLM2
//! ladder's rows: 1% fewer bytes (the level of an id says little about the
//! next id's), and it wrote and read 4,080 positions in 7.0 s and 10.4 s,
//! where this coder takes ~2 s and ~3.5 s (`cargo bench --bench kld`).
//!
//! Contract: `decode(encode(symbols))` is `symbols`; a stream that does not
//! decode exactly (its end state, its every byte) is refused, never read
//! as other symbols silently.

/// Probability resolution.
const SCALE_BITS: u32 = 14;
const SCALE: u32 = 1 << SCALE_BITS;
/// Lower bound of the normalised state.
const LOW: u32 = 1 << 23;

/// Frequencies (summing to 2^14, each used symbol ≥ 1) and their
/// cumulative starts, from exact counts: deterministic integer
/// arithmetic, the same on both sides. None when no symbol is used.
pub(crate) fn frequencies(counts: &[u32]) -> Option<(Vec<u32>, Vec<u32>)> {
    let total: u64 = counts.iter().map(|&c| u64::from(c)).sum();
    if total == 0 || counts.len() > SCALE as usize {
        return None;
    }
    let mut f: Vec<u32> = counts
        .iter()
        .map(|&c| {
            if c == 0 {
                0
            } else {
                ((u64::from(c) * u64::from(SCALE) / total) as u32).max(1)
            }
        })
        .collect();
    // The sum to exactly 2^14: the difference goes to (or comes from)
    // the most frequent symbols, never below 1.
    let mut sum: i64 = f.iter().map(|&x| i64::from(x)).sum();
    let mut order: Vec<usize> = (0..f.len()).filter(|&s| f[s] > 0).collect();
    order.sort_by(|&a, &b| counts[b].cmp(&counts[a]).then(a.cmp(&b)));
    let mut k = 0;
    while sum != i64::from(SCALE) {
        let s = order[k % order.len()];
        if sum < i64::from(SCALE) {
            f[s] += 1;
            sum += 1;
        } else if f[s] > 1 {
            f[s] -= 1;
            sum -= 1;
        }
        k += 1;
    }
    let mut cum = Vec::with_capacity(f.len());
    let mut c = 0;
    for &x in &f {
        cum.push(c);
        c += x;
    }
    Some((f, cum))
}

/// Code `symbols` (each with a frequency ≥ 1 in `freq`).
pub(crate) fn encode(symbols: &[u8], (freq, cum): (&[u32], &[u32])) -> Vec<u8> {
    let mut out = Vec::with_capacity(symbols.len() / 2 + 8);
    let mut x = LOW;
    for &s in symbols.iter().rev() {
        let (f, c) = (freq[s as usize], cum[s as usize]);
        let x_max = ((LOW >> SCALE_BITS) << 8) * f;
        while x >= x_max {
            out.push(x as u8);
            x >>= 8;
        }
        x = ((x / f) << SCALE_BITS) + (x % f) + c;
    }
    out.extend_from_slice(&x.to_be_bytes());
    out.reverse();
    out
}

/// Decode `n` symbols of `bytes`; None unless they decode within the
/// bytes, end in the encoder's initial state and use every byte.
pub(crate) fn decode(bytes: &[u8], n: usize, (freq, cum): (&[u32], &[u32])) -> Option<Vec<u8>> {
    let mut table = vec![0u8; SCALE as usize];
    for (s, (&f, &c)) in freq.iter().zip(cum).enumerate() {
        table[c as usize..(c + f) as usize].fill(s as u8);
    }
    let head: [u8; 4] = bytes.get(..4)?.try_into().ok()?;
    let mut x = u32::from_le_bytes(head);
    let mut at = 4;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let slot = x & (SCALE - 1);
        let s = table[slot as usize];
        let (f, c) = (freq[s as usize], cum[s as usize]);
        x = f
            .wrapping_mul(x >> SCALE_BITS)
            .wrapping_add(slot)
            .wrapping_sub(c);
        while x < LOW {
            x = (x << 8) | u32::from(*bytes.get(at)?);
            at += 1;
        }
        out.push(s);
    }
    (x == LOW && at == bytes.len()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Round trips at about the entropy; damage is refused.
    #[test]
    fn symbols_round_trip_and_damage_is_refused() {
        let mut state = 7u64;
        let mut next = || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) as u32
        };
        let n = 49_000;
        let symbols: Vec<u8> = (0..n)
            .map(|_| {
                let r = next() % 1000;
                ((r * r / 10_500) as u8).min(95)
            })
            .collect();
        let mut counts = vec![0u32; 96];
        for &s in &symbols {
            counts[s as usize] += 1;
        }
        let (f, c) = frequencies(&counts).unwrap();
        assert_eq!(f.iter().sum::<u32>(), SCALE);
        let bytes = encode(&symbols, (&f, &c));
        assert_eq!(decode(&bytes, n, (&f, &c)).unwrap(), symbols);
        let entropy: f64 = counts
            .iter()
            .filter(|&&k| k > 0)
            .map(|&k| -f64::from(k) * (f64::from(k) / n as f64).log2())
            .sum::<f64>()
            / 8.0;
        assert!(
            (bytes.len() as f64) < entropy * 1.01 + 16.0,
            "{} bytes, entropy {entropy}",
            bytes.len()
        );
        // Damage: a flipped byte, a truncation, a byte too many.
        for at in [0, 4, bytes.len() / 2, bytes.len() - 1] {
            let mut b = bytes.clone();
            b[at] ^= 0x21;
            assert_ne!(
                decode(&b, n, (&f, &c)).as_ref(),
                Some(&symbols),
                "byte {at}"
            );
        }
        assert!(decode(&bytes[..bytes.len() - 1], n, (&f, &c)).is_none());
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode(&longer, n, (&f, &c)).is_none());
        // One symbol only, and rare symbols among frequent ones.
        let one = vec![3u8; 1000];
        let mut counts = vec![0u32; 96];
        counts[3] = 1000;
        let (f, c) = frequencies(&counts).unwrap();
        assert_eq!(
            decode(&encode(&one, (&f, &c)), 1000, (&f, &c)).unwrap(),
            one
        );
        assert!(frequencies(&[0, 0]).is_none());
    }
}

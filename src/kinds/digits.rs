//! Digit sources for recitation cases (seed 000), computed by the program:
//! π, e and √2 to any number of decimal places with exact big-integer
//! arithmetic, seeded random digits from a documented generator, and the
//! seed's literal 100-digit random string. No pasted tables.
//!
//! Contract: `pi(n)`, `e(n)`, `sqrt2(n)` return the integer part, `.`, and
//! exactly `n` correct decimals (truncated, not rounded).

use num_bigint::BigUint;

/// The seed's 100 random digits (seed 000, "Repeat the following digits").
pub(crate) const SEED_000_RANDOM: &str = "2023936130076680163734623756245510134498341428659591699655649203685439088903072823493493719858566651";

/// Digits used as guard below the last decimal asked for.
const GUARD: usize = 12;

fn ten_pow(n: usize) -> BigUint {
    BigUint::from(10u32).pow(n as u32)
}

/// `⌊x⌋` of a fixed-point value with `n + GUARD` decimals, as "I.DDD…" with
/// `n` decimals.
fn render(fixed: &BigUint, n: usize) -> String {
    let truncated = fixed / ten_pow(GUARD);
    let s = truncated.to_str_radix(10);
    let (int, frac) = s.split_at(s.len() - n);
    format!("{int}.{frac}")
}

/// `arctan(1/x)` scaled by `scale`, by its alternating series.
fn arctan_inv(x: u32, scale: &BigUint) -> BigUint {
    let x2 = BigUint::from(x) * BigUint::from(x);
    let mut term = scale / BigUint::from(x);
    let mut pos = BigUint::default();
    let mut neg = BigUint::default();
    let mut k: u64 = 0;
    while term > BigUint::default() {
        let t = &term / BigUint::from(2 * k + 1);
        if k.is_multiple_of(2) {
            pos += t;
        } else {
            neg += t;
        }
        term /= &x2;
        k += 1;
    }
    pos - neg
}

/// π to `n` decimals, by Machin's formula π = 16·arctan(1/5) − 4·arctan(1/239).
pub fn pi(n: usize) -> String {
    let scale = ten_pow(n + GUARD);
    let v = arctan_inv(5, &scale) * BigUint::from(16u32)
        - arctan_inv(239, &scale) * BigUint::from(4u32);
    render(&v, n)
}

/// e to `n` decimals, by Σ 1/k!.
pub(crate) fn e(n: usize) -> String {
    let mut term = ten_pow(n + GUARD);
    let mut sum = BigUint::default();
    let mut k: u32 = 0;
    while term > BigUint::default() {
        sum += &term;
        k += 1;
        term /= BigUint::from(k);
    }
    render(&sum, n)
}

/// √2 to `n` decimals: the integer square root of 2·10^(2n).
pub(crate) fn sqrt2(n: usize) -> String {
    let r = (BigUint::from(2u32) * ten_pow(2 * n)).sqrt();
    let s = r.to_str_radix(10);
    let (int, frac) = s.split_at(s.len() - n);
    format!("{int}.{frac}")
}

/// `n` random decimal digits from SplitMix64 seeded with `seed`
/// (Steele, Lea & Flood 2014; [`crate::measure::SplitMix64`]): each digit is
/// `x mod 10` of the next output `x`, outputs ≥ 18446744073709551610 (the
/// largest multiple of 10 that fits) rejected so every digit is equally likely.
pub(crate) fn random(seed: u64, n: usize) -> String {
    const LIMIT: u64 = u64::MAX - u64::MAX % 10;
    let mut r = crate::measure::SplitMix64(seed);
    let mut out = String::with_capacity(n);
    while out.len() < n {
        let x = r.next_u64();
        if x < LIMIT {
            out.push(char::from(b'0' + (x % 10) as u8));
        }
    }
    out
}

/// Digits as English words separated by single spaces (`507` → `five zero seven`);
/// anything that is not a digit is skipped.
pub(crate) fn spell(digits: &str) -> String {
    const WORDS: [&str; 10] = [
        "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
    ];
    digits
        .bytes()
        .filter(u8::is_ascii_digit)
        .map(|b| WORDS[(b - b'0') as usize])
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fsutil::sha256_bytes;

    /// Rabinowitz & Wagon's spigot (1995): π's digits with machine integers
    /// only, an algorithm independent of Machin's formula and big integers.
    fn pi_spigot(n: usize) -> String {
        let m = n + 10;
        let len = 10 * m / 3 + 1;
        let mut a = vec![2u64; len];
        let mut out = String::new();
        let mut nines = 0usize;
        let mut predigit: Option<u64> = None;
        for _ in 0..m {
            let mut q = 0u64;
            for i in (0..len).rev() {
                let x = 10 * a[i] + q * (i as u64 + 1);
                let d = 2 * i as u64 + 1;
                a[i] = x % d;
                q = x / d;
            }
            a[0] = q % 10;
            q /= 10;
            match q {
                9 => nines += 1,
                10 => {
                    let p = predigit.map_or(1, |p| p + 1);
                    out.push(char::from(b'0' + (p % 10) as u8));
                    out.extend(std::iter::repeat_n('0', nines));
                    predigit = Some(0);
                    nines = 0;
                }
                _ => {
                    if let Some(p) = predigit {
                        out.push(char::from(b'0' + p as u8));
                    }
                    predigit = Some(q);
                    out.extend(std::iter::repeat_n('9', nines));
                    nines = 0;
                }
            }
        }
        // "31415…": integer part first.
        format!("3.{}", &out[1..=n])
    }

    /// e's spigot (Sale 1968): e − 2 = Σ 1/k! held as mixed-radix digits.
    fn e_spigot(n: usize) -> String {
        let len = n + 10;
        let mut a = vec![1u64; len];
        let mut out = String::from("2.");
        for _ in 0..n {
            let mut carry = 0u64;
            for i in (0..len).rev() {
                let x = a[i] * 10 + carry;
                let d = i as u64 + 2;
                a[i] = x % d;
                carry = x / d;
            }
            out.push(char::from(b'0' + carry as u8));
        }
        out
    }

    #[test]
    fn first_fifty_digits_typed_from_a_reference() {
        assert_eq!(
            pi(50),
            "3.14159265358979323846264338327950288419716939937510"
        );
        assert_eq!(
            e(50),
            "2.71828182845904523536028747135266249775724709369995"
        );
        assert_eq!(
            sqrt2(50),
            "1.41421356237309504880168872420969807856967187537694"
        );
        // Decimals 51–60.
        assert!(pi(60).ends_with("5820974944"));
    }

    #[test]
    fn ten_thousand_digits_agree_with_an_independent_algorithm() {
        let n = 10_000;
        let (a, b) = (pi(n), pi_spigot(n));
        assert_eq!(sha256_bytes(a.as_bytes()), sha256_bytes(b.as_bytes()));
        assert_eq!(a.len(), n + 2);
        let (a, b) = (e(n), e_spigot(n));
        assert_eq!(sha256_bytes(a.as_bytes()), sha256_bytes(b.as_bytes()));
        // √2 by definition: d² ≤ 2·10^(2n) < (d+1)².
        let d: BigUint = sqrt2(n).replace('.', "").parse().unwrap();
        let target = BigUint::from(2u32) * ten_pow(2 * n);
        assert!(&d * &d <= target && (&d + 1u32) * (&d + 1u32) > target);
        // A known late digit block: π's digits 762–767 are the Feynman point 999999.
        assert_eq!(&pi(770)[763..769], "999999");
    }

    #[test]
    fn random_digits_are_seeded_uniform_and_documented() {
        assert_eq!(random(7, 1000), random(7, 1000));
        assert_ne!(random(7, 100), random(8, 100));
        assert_eq!(&random(7, 1000)[..100], random(7, 100));
        let d = random(2026, 20_000);
        for c in '0'..='9' {
            let k = d.chars().filter(|&x| x == c).count();
            assert!((1_800..=2_200).contains(&k), "{c}: {k} of 20000");
        }
        // The generator by hand: SplitMix64(0)'s first output mod 10.
        let first = crate::measure::SplitMix64(0).next_u64();
        assert_eq!(
            random(0, 1),
            char::from(b'0' + (first % 10) as u8).to_string()
        );
    }

    #[test]
    fn seed_fixture_and_spelling() {
        assert_eq!(SEED_000_RANDOM.len(), 100);
        assert!(SEED_000_RANDOM.bytes().all(|b| b.is_ascii_digit()));
        assert!(spell(SEED_000_RANDOM).starts_with("two zero two three nine three six one three zero zero seven six six eight zero one six three seven three four six two"));
        assert_eq!(spell("507"), "five zero seven");
        assert_eq!(spell("3.14"), "three one four");
    }
}

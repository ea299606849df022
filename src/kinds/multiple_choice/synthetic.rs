//! Synthetic task files (for tests and fixtures), drawn with the same
//! Mersenne Twister the tool draws its subsets with.

use super::*;

/// libstdc++'s `uniform_int_distribution<size_t>(0, range − 1)` on a 32-bit
/// engine: Lemire's multiply-and-reject (`_S_nd`, GCC ≥ 11).
pub(crate) fn uniform_below(rng: &mut Mt19937, range: u32) -> u32 {
    let mut product = u64::from(rng.next()) * u64::from(range);
    let mut low = product as u32;
    if low < range {
        let threshold = range.wrapping_neg() % range;
        while low < threshold {
            product = u64::from(rng.next()) * u64::from(range);
            low = product as u32;
        }
    }
    (product >> 32) as u32
}

/// `n` computed WinoGrande lines (a CSV as [`read_winogrande`] reads it):
/// two people and two numbers, and a blank only the larger (or smaller)
/// number answers; sentences with commas are quoted; some tails are short
/// (the tool then scores from the shared prefix) and some long (it scores
/// after the choice word). The task file `suites/mc/winogrande.toml` pins.
pub fn computed_winogrande(n: usize, seed: u64) -> String {
    let mut rng = crate::measure::SplitMix64(seed);
    let mut next = move |m: u64| rng.next_u64() % m;
    const NAMES: [&str; 8] = [
        "Tom", "Ann", "Maria", "Ken", "Sarah", "Omar", "Lena", "Paul",
    ];
    const FORMS: [(&str, &str, bool); 4] = [
        (
            "{a} is {x} years old and {b} is {y}, so _ is older.",
            "years",
            true,
        ),
        (
            "{a} ran {x} km and {b} ran {y} km, so _ ran farther than the other runner did today.",
            "km",
            true,
        ),
        (
            "{a} paid {x} dollars and {b} paid {y} dollars, so _ paid less.",
            "dollars",
            false,
        ),
        (
            "{a} has {x} books while {b} has {y} books so _ has more books on the shelf at home.",
            "books",
            true,
        ),
    ];
    let mut out = String::new();
    for i in 0..n {
        let a = NAMES[next(8) as usize];
        let b = loop {
            let b = NAMES[next(8) as usize];
            if b != a {
                break b;
            }
        };
        let (x, y) = loop {
            let (x, y) = (2 + next(60), 2 + next(60));
            if x != y {
                break (x, y);
            }
        };
        let (form, _, larger) = FORMS[i % FORMS.len()];
        let sentence = form
            .replace("{a}", a)
            .replace("{b}", b)
            .replace("{x}", &x.to_string())
            .replace("{y}", &y.to_string());
        let answer = if (x > y) == larger { 1 } else { 2 };
        let field = if sentence.contains(',') {
            format!("\"{sentence}\"")
        } else {
            sentence
        };
        out.push_str(&format!("{i},{field},{a},{b},{answer}\n"));
    }
    // An empty last line: the tool reads every task (see `read_winogrande`).
    out.push('\n');
    out
}

/// The 32-bit Mersenne Twister (`std::mt19937`).
pub(crate) struct Mt19937 {
    mt: [u32; 624],
    i: usize,
}

impl Mt19937 {
    /// Seeded as `std::mt19937(seed)`.
    pub(crate) fn new(seed: u32) -> Self {
        let mut mt = [0u32; 624];
        mt[0] = seed;
        for i in 1..624 {
            mt[i] = 1_812_433_253u32
                .wrapping_mul(mt[i - 1] ^ (mt[i - 1] >> 30))
                .wrapping_add(i as u32);
        }
        Mt19937 { mt, i: 624 }
    }

    /// The next output.
    #[allow(clippy::should_implement_trait)]
    pub(crate) fn next(&mut self) -> u32 {
        if self.i >= 624 {
            for k in 0..624 {
                let y = (self.mt[k] & 0x8000_0000) | (self.mt[(k + 1) % 624] & 0x7fff_ffff);
                let mut v = self.mt[(k + 397) % 624] ^ (y >> 1);
                if y & 1 != 0 {
                    v ^= 0x9908_b0df;
                }
                self.mt[k] = v;
            }
            self.i = 0;
        }
        let mut y = self.mt[self.i];
        self.i += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }
}

/// `n` computed tasks with one verifiable answer each — sums and products,
/// decimal digits of π, unit conversions — with 2 to 4 choices (distractors
/// near the answer), the correct one at a seeded position: the task file
/// `suites/mc/` pins (`suites/data/mc-computed.bin`).
pub fn computed_tasks(n: usize, seed: u64) -> Vec<Task> {
    generate(n, seed, None)
}

/// [`computed_tasks`] with 4 choices each and one-line questions: a
/// `--hellaswag` file's tasks ([`write_hellaswag`]).
pub fn computed_hellaswag(n: usize, seed: u64) -> Vec<Task> {
    generate(n, seed, Some(4))
        .into_iter()
        .map(|t| Task {
            question: t.question.replace('\n', " "),
            ..t
        })
        .collect()
}

pub(crate) fn generate(n: usize, seed: u64, forced: Option<usize>) -> Vec<Task> {
    let mut rng = crate::measure::SplitMix64(seed);
    let mut next = move |m: u64| rng.next_u64() % m;
    let pi = crate::kinds::digits::pi(60);
    let frac: Vec<char> = pi.chars().skip(2).collect();
    let ordinal = |k: u64| {
        let suffix = match (k % 10, k % 100) {
            (1, r) if r != 11 => "st",
            (2, r) if r != 12 => "nd",
            (3, r) if r != 13 => "rd",
            _ => "th",
        };
        format!("{k}{suffix}")
    };
    (0..n)
        .map(|i| {
            let n_choices = 2 + next(3) as usize;
            let n_choices = forced.unwrap_or(n_choices);
            let (question, answer, mut near): (String, i64, Vec<i64>) = match i % 4 {
                0 => {
                    let (a, b) = (10 + next(90) as i64, 10 + next(90) as i64);
                    (format!("Question: What is {a} + {b}?\nAnswer:"), a + b, vec![1, -1, 10, -10, 2])
                }
                1 => {
                    let (a, b) = (2 + next(11) as i64, 2 + next(11) as i64);
                    (format!("Question: What is {a} times {b}?\nAnswer:"), a * b, vec![a, -a, b, 1, -1])
                }
                2 => {
                    let k = 1 + next(40);
                    let d = frac[k as usize - 1].to_digit(10).unwrap_or(0) as i64;
                    (
                        format!("Question: What is the {} digit after the decimal point of pi?\nAnswer:", ordinal(k)),
                        d,
                        vec![1, -1, 2, -2, 3],
                    )
                }
                _ => {
                    let m = 2 + next(9) as i64;
                    (format!("Question: How many centimetres are in {m} metres?\nAnswer:"), m * 100, vec![-90 * m, 900 * m, -50, 50, 100])
                }
            };
            if forced.is_some() {
                near.extend([3, -3, 4, -4, 5, -5, 20, -20, 7, 30]);
            }
            // No choice spells the start of another: the shared prefix of
            // their tokens would swallow the shorter one.
            let mut choices = vec![answer];
            for d in near {
                let c = answer + d;
                let clash = |o: &i64| {
                    let (a, b) = (c.to_string(), o.to_string());
                    a.starts_with(&b) || b.starts_with(&a)
                };
                if choices.len() < n_choices && c >= 0 && !choices.iter().any(clash) && (i % 4 != 2 || c <= 9) {
                    choices.push(c);
                }
            }
            // The correct choice at a seeded position.
            let at = next(choices.len() as u64) as usize;
            choices.swap(0, at);
            Task {
                question,
                labels: choices.iter().map(|c| i32::from(*c == answer)).collect(),
                choices: choices.iter().map(|c| c.to_string()).collect(),
            }
        })
        .collect()
}
